"""The focus corpus (engine/training/focus.py): packages installed beside the environment, read like any
distribution, and the share of a run's examples drawn from them (train.ExampleStream)."""

import json
import subprocess
import sys
import zipfile
from pathlib import Path

from dgemma_lsp.engine.model.tiny_model import build_tiny_tokenizer
from dgemma_lsp.engine.training.corpus import CodeFile, collect
from dgemma_lsp.engine.training.examples import ExampleMaker
from dgemma_lsp.engine.training.focus import ensure_installed, focus_folder, package_names
from dgemma_lsp.engine.training.train import ExampleStream

SQUARE = "def square(n):\n    \"\"\"n times itself.\"\"\"\n    return n * n\n\n\ndef cube(n):\n    return n * n * n\n"
LIBRARY = "class Registry:\n    def __init__(self):\n        self.items = {}\n\n    def add(self, key, value):\n" \
          "        self.items[key] = value\n        return self\n"


def _wheel(folder: Path, name: str, licence: str, text: str) -> Path:
    """A real wheel of one module, as pip installs it."""
    path = folder / f"{name}-1.0-py3-none-any.whl"
    info = f"{name}-1.0.dist-info"
    metadata = f"Metadata-Version: 2.4\nName: {name}\nVersion: 1.0\nLicense-Expression: {licence}\n"
    wheel = "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    record = f"{name}/__init__.py,,\n{info}/METADATA,,\n{info}/WHEEL,,\n{info}/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(f"{name}/__init__.py", text)
        archive.writestr(f"{info}/METADATA", metadata)
        archive.writestr(f"{info}/WHEEL", wheel)
        archive.writestr(f"{info}/RECORD", record)
    return path


def test_focus_packages_install_beside_the_environment_and_are_read_with_their_licences(tmp_path, monkeypatch):
    monkeypatch.setenv("DGEMMA_LSP_CACHE", str(tmp_path / "cache"))
    wheels = (str(_wheel(tmp_path, "squares", "MIT", SQUARE)), str(_wheel(tmp_path, "copyleft", "GPL-3.0-only", LIBRARY)))
    folder = ensure_installed(wheels)
    assert folder == focus_folder(wheels) and folder.is_relative_to(tmp_path / "cache")
    assert ensure_installed(wheels) == folder  # installed once
    files, manifest = collect(1_000_000, 0, languages=("python",), python_path=[str(folder)])
    assert [(f.source, f.text) for f in files] == [("squares", SQUARE)]  # no stdlib, no environment, no GPL
    assert [(s["name"], s["licence"]) for s in manifest["sources"]] == [("squares", "MIT")]
    assert manifest["leftOut"] == [{"name": "copyleft", "licence": "GPL-3.0-only", "language": "python"}]
    done = subprocess.run([sys.executable, "-c", "import squares"], capture_output=True)
    assert done.returncode != 0  # nothing of it was installed into the environment
    assert package_names(("algorithms==1.0.1", "pygorithm==1.0.4")) == ("algorithms", "pygorithm")


def test_a_focus_share_draws_that_share_of_examples_and_none_leaves_the_stream_unchanged():
    tokenizer = build_tiny_tokenizer()
    maker = ExampleMaker(tokenizer, 32, max_prompt_tokens=256, context_tokens=(32, 128))
    library = [CodeFile(source="library", path=f"lib{i}.py", language="python", text=LIBRARY) for i in range(3)]
    focus = [CodeFile(source="focus", path="squares.py", language="python", text=SQUARE)]
    plain = ExampleStream(library, maker, seed=3)
    unused = ExampleStream(library, maker, seed=3, focus_files=focus, focus_share=0.0)
    for index in range(30):  # a run without focus resumes on exactly the examples it had
        a, b = plain.example(index), unused.example(index)
        assert (a.prompt_ids, a.canvas_ids) == (b.prompt_ids, b.canvas_ids)
    mixed = ExampleStream(library, maker, seed=3, focus_files=focus, focus_share=0.5)
    drawn = sum("square" in tokenizer.decode(mixed.example(index).prompt_ids) for index in range(200))
    assert 70 <= drawn <= 130


def test_a_run_with_a_focus_share_lists_the_focus_sources_in_its_manifest(tmp_path, monkeypatch):
    """The manifest that ships beside the weights names every source trained on, focus ones included."""
    from dgemma_lsp.engine.training.parallel import Ranks
    from dgemma_lsp.engine.training.train import _add_focus_manifest, _focus_corpus

    monkeypatch.setenv("DGEMMA_LSP_CACHE", str(tmp_path / "cache"))
    wheels = [str(_wheel(tmp_path, "squares", "MIT", SQUARE))]  # a recipe may name its own packages
    files, manifest = _focus_corpus({"focusShare": 0.5, "focusPackages": wheels, "corpusBytes": 1_000_000}, 0, Ranks())
    assert [f.source for f in files] == ["squares"]
    corpus = tmp_path / "corpus.json"
    corpus.write_text(json.dumps({"sources": [], "leftOut": []}))
    _add_focus_manifest(corpus, manifest, files, build_tiny_tokenizer(), 0.5)
    focus = json.loads(corpus.read_text())["focus"]
    assert focus["share"] == 0.5 and focus["packages"] == wheels
    assert [(s["name"], s["licence"]) for s in focus["sources"]] == [("squares", "MIT")]
    assert focus["tokens"] == focus["sources"][0]["tokens"] > 0
    assert _focus_corpus({"corpusBytes": 1_000_000}, 0, Ranks()) == ([], None)


def test_a_recipe_that_would_train_on_a_held_out_source_is_refused_before_anything_is_installed(tmp_path, monkeypatch):
    """`validation --set focus` cuts its holes from pygorithm, and the main set from `heldOutSources`."""
    import pytest

    from dgemma_lsp.engine.training.parallel import Ranks
    from dgemma_lsp.engine.training.train import _focus_corpus

    monkeypatch.setenv("DGEMMA_LSP_CACHE", str(tmp_path / "cache"))
    for packages, held_out in ((["toolz==1.2.0", "Pygorithm==1.0.4"], []), (["rich==14.0.0"], ["rich"])):
        data = {"focusShare": 0.2, "focusPackages": packages, "heldOutSources": held_out, "corpusBytes": 1}
        with pytest.raises(ValueError, match="held-out sources"):
            _focus_corpus(data, 0, Ranks())
    assert not (tmp_path / "cache").exists()
