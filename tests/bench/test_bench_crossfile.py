"""`bench crossfile`'s holes, on a real package on disk: a hole is a line that *uses* a name another
file of the package defines (and the file nowhere else mentions); a line that declares the name
(a parameter, an object literal's key, a field or method being written) needs no other file's
definition and is never a hole."""

from __future__ import annotations

from pathlib import Path

from dgemma_lsp.bench.crossfile import holes_of
from dgemma_lsp.engine.crossfile.index import WorkspaceIndex

DOCUMENT = """export class Document {
  createNode(value) {
    return value;
  }
  render(total) {
    return total;
  }
}
"""
USER = """import { stringify } from './stringify.js';

export function pair(doc, value) {
  const chars = { start: '[', render: ']' };
  const sum = [1, 2].reduce((total, item) => total + item, 0);
  const node = doc.createNode(value);
  return stringify(node, chars, sum);
}
"""
PYTHON_MODELS = """class Policy:
    def clone(self, **kw):
        return self

    def fold(self, name, value):
        return value
"""
PYTHON_USER = """from .helpers import apply


def header(policy, value):
    folded = policy.fold('Subject', value)
    return apply(folded)


"""
PYTHON_OTHER = """def copy_all(names, clone=None):
    return [names]
"""


def _holes(tmp_path: Path, files: dict[str, str], package: str) -> list[tuple[str, int, str]]:
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    index = WorkspaceIndex(str(tmp_path))
    index.build()
    return [(Path(path).name, line, name) for path, line, name in holes_of(index, str(tmp_path / package), 1, 50)]


def test_a_js_line_that_uses_a_method_is_a_hole_a_key_or_a_parameter_of_the_same_name_is_not(tmp_path):
    holes = _holes(tmp_path, {"src/Document.js": DOCUMENT, "src/stringify.js": "export function stringify(n) {}\n",
                              "src/pair.js": USER}, "src")
    assert ("pair.js", 5, "createNode") in holes
    assert not [hole for hole in holes if hole[2] in ("render", "total")], holes


def test_a_python_attribute_use_is_a_hole_a_parameter_of_the_same_name_is_not(tmp_path):
    holes = _holes(tmp_path, {"pkg/__init__.py": "", "pkg/models.py": PYTHON_MODELS,
                              "pkg/helpers.py": "def apply(x):\n    return x\n", "pkg/user.py": PYTHON_USER,
                              "pkg/other.py": PYTHON_OTHER}, "pkg")
    assert ("user.py", 4, "fold") in holes
    assert not [hole for hole in holes if hole[0] == "other.py"], holes
