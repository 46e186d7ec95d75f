"""Cross-file context (engine/crossfile/) on real files on disk: the walk's rules and bounds, import
resolution per language, what a snippet shows, and the prompt's stable part kept across keystrokes."""

from __future__ import annotations

import os
from pathlib import Path

from dgemma_lsp.engine.api import GenerationSettings
from dgemma_lsp.engine.crossfile.files import Bounds, walk
from dgemma_lsp.engine.crossfile.gather import CrossFileSources, shown_path
from dgemma_lsp.engine.crossfile.index import WorkspaceIndex
from dgemma_lsp.engine.crossfile.neighbours import OpenFile, RecentRanges
from dgemma_lsp.engine.crossfile.resolve import resolve_imports
from dgemma_lsp.engine.crossfile.windows import FileWindows
from dgemma_lsp.engine.model.prompting import PromptLayout
from dgemma_lsp.engine.syntax.document import SyntaxDocument
from dgemma_lsp.engine.syntax.infill import prepare_infill


def write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


MODELS = '''class Invoice:
    """A bill sent to a customer."""

    def __init__(self, customer, lines):
        self.customer = customer
        self.lines = lines

    def total_with_tax(self, rate):
        """The total including tax at `rate`."""
        return sum(line.amount for line in self.lines) * (1 + rate)
'''
REPORT = '''from .models import Invoice


def summary(invoice: Invoice) -> str:
    amount = invoice.
    return f"{invoice.customer}: {amount}"
'''


def test_gitignore_hidden_vendored_binary_and_huge_files_stay_out(tmp_path):
    write(tmp_path, {
        ".gitignore": "generated/\n*.gen.py\n!keep.gen.py\n",
        "src/a.py": "def a(): pass\n", "src/b.gen.py": "x = 1\n", "src/keep.gen.py": "y = 1\n",
        "generated/c.py": "z = 1\n", "node_modules/d/index.js": "x\n", ".venv/e.py": "x\n",
        "sub/.gitignore": "local.py\n", "sub/local.py": "x = 1\n", "sub/kept.py": "x = 1\n",
        "notes.txt": "not code\n",
    })
    (tmp_path / "src" / "blob.py").write_bytes(b"\x00\x01binary")
    (tmp_path / "src" / "huge.py").write_text("x = 1\n" * 200_000)
    found = sorted(os.path.relpath(path, tmp_path) for path, _size in walk(str(tmp_path)))
    assert found == ["src/a.py", "src/blob.py", "src/keep.gen.py", "sub/kept.py"]  # too big: skipped unread
    index = WorkspaceIndex(str(tmp_path))
    index.build()
    assert sorted(index.relative(p) for p in index.files) == ["src/a.py", "src/keep.gen.py", "sub/kept.py"]  # binary


def test_a_huge_tree_is_walked_within_its_bounds(tmp_path):
    for folder in range(40):
        write(tmp_path, {f"d{folder:02}/f{n:03}.py": f"def f{n}(): pass\n" for n in range(50)})
    index = WorkspaceIndex(str(tmp_path), Bounds(max_files=300, max_bytes=10**9, max_entries=100_000))
    index.build()
    assert len(index) == 300
    assert not index.update(str(tmp_path / "d39" / "new.py"), "def g(): pass\n")  # full: a new file stays out
    assert len(index) == 300
    few_entries = WorkspaceIndex(str(tmp_path), Bounds(max_files=10**6, max_bytes=10**9, max_entries=500))
    few_entries.build()
    assert len(few_entries) < 500
    small = WorkspaceIndex(str(tmp_path), Bounds(max_files=10**6, max_bytes=2_000, max_entries=100_000))
    small.build()
    assert 0 < small.bytes <= 2_000


def test_imports_resolve_to_workspace_files_in_each_language(tmp_path):
    write(tmp_path, {
        "app/__init__.py": "", "app/models.py": MODELS, "app/report.py": REPORT,
        "app/cli.py": "import app.models\nfrom app import report\nfrom . import models as m\n",
        "web/tsconfig.json": '{ // comment\n "compilerOptions": {"baseUrl": ".", "paths": {"@lib/*": ["lib/*"]},},}',
        "web/lib/util.ts": "export function pad(s: string): string { return s; }\n",
        "web/src/view.ts": "import { pad } from '@lib/util';\nimport { x } from './x.js';\n",
        "web/src/x.ts": "export const x = 1;\n",
        "go/go.mod": "module example.com/m\n", "go/pkg/a.go": "package pkg\nfunc A() {}\n",
        "go/pkg/b.go": "package pkg\nfunc B() {}\n", "go/main.go": 'package main\nimport "example.com/m/pkg"\n',
        "rs/Cargo.toml": "[package]\n", "rs/src/lib.rs": "mod shapes;\nuse crate::shapes::Circle;\n",
        "rs/src/shapes.rs": "pub struct Circle { pub r: f64 }\n",
        "java/src/a/b/Point.java": "package a.b;\npublic class Point { int x; }\n",
        "java/src/a/c/Use.java": "package a.c;\nimport a.b.Point;\nclass Use {}\n",
        "c/include/geo.h": "struct pt { int x; };\nint area(int w);\n", "c/src/geo.c": '#include "geo.h"\n',
    })
    index = WorkspaceIndex(str(tmp_path))
    index.build()

    def linked(name: str) -> list[str]:
        path = str(tmp_path / name)
        return sorted({index.relative(link.path) for link in resolve_imports(path, index.files[path], index)})

    assert linked("app/report.py") == ["app/models.py"]
    assert linked("app/cli.py") == ["app/__init__.py", "app/models.py", "app/report.py"]
    assert linked("web/src/view.ts") == ["web/lib/util.ts", "web/src/x.ts"]
    assert linked("go/main.go") == ["go/pkg/a.go", "go/pkg/b.go"]
    assert linked("go/pkg/a.go") == ["go/pkg/b.go"]  # its own package
    assert linked("rs/src/lib.rs") == ["rs/src/shapes.rs"]
    assert linked("java/src/a/c/Use.java") == ["java/src/a/b/Point.java"]
    assert linked("c/src/geo.c") == ["c/include/geo.h"]


def _prepare(index, path: Path, text: str, offset: int, sources: CrossFileSources, budget: int = 512,
             language: str = "python"):
    doc = SyntaxDocument(text, language)
    return prepare_infill(doc, offset, GenerationSettings(),
                          cross_file=lambda context: sources.snippets(str(path), language, context, budget))


def _blank_line_snippets(tmp_path: Path, files: dict[str, str], budget: int = 25):
    """Index `files` (a package `pkg/` with `pkg/user.py`), then the snippets for the cursor on the
    blank line of user.py: (the index, its sources, the cursor's offset, the snippets)."""
    write(tmp_path, files)
    index = WorkspaceIndex(str(tmp_path))
    index.build()
    user = files["pkg/user.py"]
    offset = user.index("    \n") + 4
    sources = CrossFileSources(index)
    snippets = _prepare(index, tmp_path / "pkg" / "user.py", user, offset, sources, budget=budget).context.cross_file
    return index, sources, offset, snippets


def test_the_definition_the_cursor_uses_reaches_the_prompt_without_its_body(tmp_path):
    write(tmp_path, {"app/__init__.py": "", "app/models.py": MODELS, "app/report.py": REPORT})
    index = WorkspaceIndex(str(tmp_path))
    index.build()
    path = tmp_path / "app" / "report.py"
    offset = REPORT.index("invoice.\n") + len("invoice.")
    prepared = _prepare(index, path, REPORT, offset, CrossFileSources(index))
    (snippet,) = prepared.context.cross_file
    assert (snippet.path, snippet.source, snippet.start_line) == ("app/models.py", "definition", 0)
    assert "def total_with_tax(self, rate):" in snippet.text and "A bill sent to a customer." in snippet.text
    assert "sum(line.amount" not in snippet.text  # signatures and docstrings, not bodies
    layout = PromptLayout("<start>", "<end>")
    stable = layout.text(prepared.context).stable
    # Named in the prompt from the completed file's folder; listed from the workspace root.
    assert snippet.shown_path == "models.py" and "From app/models.py:" not in stable
    assert stable.index("From models.py:") < stable.index("def summary")
    off = _prepare(index, path, REPORT, offset, CrossFileSources(index), budget=0)
    assert off.context.cross_file == () and "models.py" not in layout.text(off.context).all


def test_a_keystroke_within_the_line_keeps_the_stable_part_and_a_new_line_may_change_it(tmp_path):
    write(tmp_path, {"app/__init__.py": "", "app/models.py": MODELS, "app/report.py": REPORT})
    index = WorkspaceIndex(str(tmp_path))
    index.build()
    path = tmp_path / "app" / "report.py"
    sources = CrossFileSources(index)
    layout = PromptLayout("<start>", "<end>")
    doc = SyntaxDocument(REPORT, "python")
    offset = REPORT.index("invoice.\n") + len("invoice.")
    budget = 512

    def prompt():
        prepared = prepare_infill(doc, offset, GenerationSettings(),
                                  cross_file=lambda context: sources.snippets(str(path), "python", context, budget))
        return prepared.context.cross_file, layout.text(prepared.context).stable

    first, stable = prompt()
    for typed in "total_":
        doc.apply_change(offset, offset, typed)
        offset += 1
        snippets, again = prompt()
        assert snippets is first and again == stable
    index.update(str(tmp_path / "app" / "models.py"), MODELS + "\n\ndef invoice_total(invoice): ...\n")
    snippets, again = prompt()  # another file changed: the snippets are chosen again
    assert "invoice_total" in "".join(s.text for s in snippets)


def test_open_documents_and_recent_ranges_join_the_definitions(tmp_path):
    write(tmp_path, {"app/__init__.py": "", "app/models.py": MODELS, "app/report.py": REPORT})
    index = WorkspaceIndex(str(tmp_path))
    index.build()
    other = "\n".join(f"line_{n} = {n}" for n in range(30)) + (
        "\nfrom .models import Invoice\n\ndef detail(invoice: Invoice) -> str:\n    return invoice.customer\n")
    notes = "\n".join(f"note_{n} = 'x'" for n in range(40))
    recent = RecentRanges()
    recent.note(str(tmp_path / "notes.py"), 20)
    recent.note(str(tmp_path / "app" / "report.py"), 4)  # the file itself: never its own snippet
    files = [OpenFile(str(tmp_path / "view.py"), "python", other, 1),
             OpenFile(str(tmp_path / "notes.py"), "python", notes, 1)]
    sources = CrossFileSources(index, lambda: files, recent)
    path = tmp_path / "app" / "report.py"
    offset = REPORT.index("invoice.\n") + len("invoice.")
    prepared = _prepare(index, path, REPORT, offset, sources)
    by_source = {(s.source, s.path) for s in prepared.context.cross_file}
    assert ("open-document", "view.py") in by_source
    assert ("recent", "notes.py") in by_source
    assert not any(s.path.endswith("report.py") for s in prepared.context.cross_file)
    assert sum(s.tokens for s in prepared.context.cross_file) <= 512


def test_a_build_stopped_at_every_check_still_finishes_and_keeps_its_bounds(tmp_path):
    # A big file's parse is cut short by every keystroke; after a few tries it runs to its end.
    write(tmp_path, {"big.py": "def f(x):\n    return x\n" * 3000, **{f"m{n}.py": f"def g{n}(): pass\n"
                                                                   for n in range(5)}})
    index = WorkspaceIndex(str(tmp_path), Bounds(max_files=4))
    rounds = 0
    while not index.build_step(lambda: True):
        rounds += 1
        assert rounds < 100, "the build never finishes"
    assert len(index) == 4 and str(tmp_path / "big.py") in index.files
    assert len(index.files[str(tmp_path / "big.py")].definitions) == 3000


GO_SERVER = '''package web

func (s *Server) Serve(addr string) error {
	conn := s.listen(addr)
	
	return nil
}
'''
GO_TYPES = '''package web

// Server answers requests.
type Server struct {
	Addr    string
	Handler func(string) string
	Timeout int
	Retries int
	Verbose bool
}

func (s *Server) listen(addr string) string { return addr }

// logf writes a line to the server's log.
func (s *Server) logf(format string, args ...any) {}

func (s *Server) shutdownConnections(force bool) int { return 0 }
'''
GO_HELPERS = '''package web

func trimPort(addr string) string { return addr }
'''
GO_TESTS = '''package web

func fakeServer() *Server { return nil }
'''


def test_a_go_package_is_one_namespace_and_a_tight_budget_buys_signatures_first(tmp_path):
    write(tmp_path, {"go.mod": "module example.com/m\n", "web/server.go": GO_SERVER, "web/types.go": GO_TYPES,
                     "web/helpers.go": GO_HELPERS, "web/server_test.go": GO_TESTS})
    index = WorkspaceIndex(str(tmp_path))
    index.build()
    path = tmp_path / "web" / "server.go"
    offset = GO_SERVER.index("\t\n") + 1
    tight = "\n".join(s.text for s in _prepare(index, path, GO_SERVER, offset, CrossFileSources(index),
                                                budget=60, language="go").context.cross_file)
    # Unimported files of the package come in (Go needs no import for them), test files stay out:
    # a non-test file cannot call what they define.
    assert "func (s *Server) shutdownConnections(force bool) int" in tight  # the receiver's other methods
    assert "fakeServer" not in tight
    assert "Timeout int" not in tight and "writes a line" not in tight  # no room: signatures alone
    roomy = "\n".join(s.text for s in _prepare(index, path, GO_SERVER, offset, CrossFileSources(index),
                                                budget=512, language="go").context.cross_file)
    assert "func trimPort(addr string) string" in roomy and "writes a line" in roomy  # room left: doc lines
    assert "fakeServer" not in roomy


def _names_in(prepared) -> str:
    return "\n".join(s.text for s in prepared.context.cross_file)


def test_a_module_the_code_near_the_cursor_reaches_through_its_alias_comes_first(tmp_path):
    # Two modules alike in all but how often the lines around the cursor call into them through
    # their names (`events.` three times, `other.` once): the next call likely goes to `events`
    # too (`other`, imported first, would win the tie).
    module = "".join(f"def step_{n}(value):\n    return value\n\n\n" for n in range(6))
    user = ("from . import other, events\n\n\ndef run(task):\n    other.step_0(task)\n"
            "    events.step_0(task)\n    events.step_0(task)\n    events.step_0(task)\n    \n    return task\n")
    _, _, _, (snippet,) = _blank_line_snippets(
        tmp_path, {"pkg/__init__.py": "", "pkg/events.py": module, "pkg/other.py": module, "pkg/user.py": user})
    # Which of events' unused functions comes is a tie here (alike code, alike neighbours); not step_0,
    # which the file already calls.
    assert snippet.path == "pkg/events.py" and snippet.text.startswith("def step_") and "step_0" not in snippet.text


def test_names_that_files_like_this_one_use_score_up(tmp_path):
    # Three files share this file's vocabulary and call `fetch_rows`; five unlike files call
    # `spread_row` (more users overall): the like files' choice wins the one slot there is.
    lib = "def spread_row(x):\n    return x\n\n\ndef fetch_rows(x):\n    return x\n"
    shared = "alpha_table beta_column gamma_index delta_cursor epsilon_schema zeta_query"
    like = "from .lib import fetch_rows\n\n{names}\nfetch_rows(1)\n"
    unlike = "from .lib import spread_row\n\nspread_row(2)\nunrelated_{n}\n"
    files = {"pkg/__init__.py": "", "pkg/lib.py": lib,
             **{f"pkg/like_{n}.py": like.format(names=shared) for n in range(3)},
             **{f"pkg/unlike_{n}.py": unlike.format(n=n) for n in range(5)}}
    user = f"from . import lib\n\n\ndef main():\n    {shared}\n    \n"
    files["pkg/main.py"] = user
    write(tmp_path, files)
    index = WorkspaceIndex(str(tmp_path))
    index.build()
    offset = user.rindex("    \n") + 4
    shown = _names_in(_prepare(index, tmp_path / "pkg" / "main.py", user, offset, CrossFileSources(index),
                               budget=25))
    assert "def fetch_rows(x):" in shown and "spread_row" not in shown


def _go_module(tmp_path: Path, files: dict[str, str]) -> tuple[WorkspaceIndex, int]:
    """Index a Go module of `files` (with `web/web.go`); (the index, the offset of web.go's blank line)."""
    write(tmp_path, {"go.mod": "module example.com/m\n", **files})
    index = WorkspaceIndex(str(tmp_path))
    index.build()
    return index, files["web/web.go"].index("\t\n") + 1


def test_another_go_package_shows_only_what_it_exports(tmp_path):
    util = ('package util\n\nfunc Helper(s string) string { return s }\n\n'
            'func helperInternal(s string) string { return s }\n\ntype Cache struct {\n\tsize int\n}\n\n'
            'func (c *Cache) Get(key string) string { return key }\n\nfunc (c *Cache) evict() {}\n')
    web = 'package web\n\nimport "example.com/m/util"\n\nfunc Serve(c *util.Cache) {\n\tutil.Helper("x")\n\t\n}\n'
    index, offset = _go_module(tmp_path, {"util/util.go": util, "web/web.go": web})
    shown = _names_in(_prepare(index, tmp_path / "web" / "web.go", web, offset, CrossFileSources(index),
                               budget=512, language="go"))
    assert "func (c *Cache) Get(key string) string" in shown
    assert "helperInternal" not in shown and "evict" not in shown  # not reachable from package web


def test_the_name_that_code_like_the_cursors_uses_elsewhere_scores_up(tmp_path):
    # Six helpers alike in all but where a sibling calls them: `step_4` right after code like the
    # lines before the cursor (`subtotal`, `shipping_fee` of an invoice), the others after unlike
    # code. Every other signal ties (same words, same users); the similar window breaks the tie.
    lib = "".join(f"def step_{n}(value):\n    return value\n\n\n" for n in range(6))
    contexts = {0: ("render", "page", "header = page.header", "footer = page.footer"),
                1: ("mail", "letter", "sender = letter.sender", "stamp = letter.stamp"),
                2: ("parse", "source", "tokens = source.tokens", "cursor = source.cursor"),
                3: ("plot", "chart", "axis = chart.axis", "legend = chart.legend"),
                4: ("tally", "invoice", "subtotal = invoice.subtotal", "shipping_fee = invoice.shipping_fee"),
                5: ("greet", "guest", "badge = guest.badge", "table = guest.table")}
    blank = "\n" * 9  # further apart than a window: each call follows its own function's code only
    peer = "from .lib import step_0, step_1, step_2, step_3, step_4, step_5\n" + blank + "".join(
        f"def {name}({arg}):\n    {first}\n    {second}\n    step_{n}({first.split()[0]})\n    return None\n{blank}"
        for n, (name, arg, first, second) in contexts.items())
    user = ("from . import lib\n\n\ndef charge(invoice):\n    subtotal = invoice.subtotal\n"
            "    shipping_fee = invoice.shipping_fee\n    \n    return subtotal\n")
    index, sources, offset, (snippet,) = _blank_line_snippets(
        tmp_path, {"pkg/__init__.py": "", "pkg/lib.py": lib, "pkg/peer.py": peer, "pkg/user.py": user})
    assert (snippet.path, snippet.text) == ("pkg/lib.py", "def step_4(value): ...")
    # The sibling changes (the invoice's code now calls step_2): its windows are read again.
    write(tmp_path, {"pkg/peer.py": peer.replace("step_4(subtotal)", "step_2(subtotal)")})
    index.update(str(tmp_path / "pkg" / "peer.py"))
    (snippet,) = _prepare(index, tmp_path / "pkg" / "user.py", user, offset, sources, budget=25).context.cross_file
    assert snippet.text == "def step_2(value): ..."


def test_the_windows_of_an_open_document_are_its_unsaved_code(tmp_path):
    # As the test above, but the sibling's change is unsaved: the editor's buffer, which the index
    # outlines (the server reindexes an open document from its text), not the file on disk.
    lib = "".join(f"def step_{n}(value):\n    return value\n\n\n" for n in range(6))
    contexts = {2: ("parse", "source", "tokens = source.tokens"), 4: ("tally", "invoice", "subtotal = invoice.subtotal")}
    blank = "\n" * 9
    peer = "from .lib import step_0, step_1, step_2, step_3, step_4, step_5\n" + blank + "".join(
        f"def {name}({arg}):\n    {first}\n    step_{n}({first.split()[0]})\n    return None\n{blank}"
        for n, (name, arg, first) in contexts.items())
    user = "from . import lib\n\n\ndef charge(invoice):\n    subtotal = invoice.subtotal\n    \n    return subtotal\n"
    files = {"pkg/__init__.py": "", "pkg/lib.py": lib, "pkg/peer.py": peer, "pkg/user.py": user}
    _, _, offset, (snippet,) = _blank_line_snippets(tmp_path, files)
    assert snippet.text == "def step_4(value): ..."
    unsaved = peer.replace("step_4(subtotal)", "step_2(subtotal)").replace("step_2(tokens)", "step_4(tokens)")
    peer_path = str(tmp_path / "pkg" / "peer.py")
    index = WorkspaceIndex(str(tmp_path))
    index.build()
    index.update(peer_path, unsaved)
    sources = CrossFileSources(index, lambda: [OpenFile(peer_path, "python", unsaved, 2)])
    (snippet,) = _prepare(index, tmp_path / "pkg" / "user.py", user, offset, sources, budget=36).context.cross_file  # a quarter kept for open documents
    assert snippet.text == "def step_2(value): ..."
    assert (tmp_path / "pkg" / "peer.py").read_text() == peer  # the disk still says step_4


def test_a_name_defined_in_two_files_is_shown_once_but_each_type_keeps_its_constructor(tmp_path):
    # Go build-tag twins (`fips_on.go`, `fips_off.go`) define the same function: the prompt shows one
    # of them, and the tokens the other would take go to the next definition. Two classes' `__init__`
    # are not twins: each says how to make its own type.
    twin = "package web\n\nfunc curvePreferences(c *Config) []int {\n\treturn nil\n}\n"
    server = "package web\n\nfunc (s *Server) Serve(c *Config) error {\n\tprefs := curves(c)\n\t\n\treturn nil\n}\n"
    write(tmp_path, {"web/fips_on.go": twin, "web/fips_off.go": twin, "web/server.go": server,
                     "web/config.go": "package web\n\ntype Config struct {\n\tName string\n}\n\n"
                                      "func curves(c *Config) []int {\n\treturn nil\n}\n"})
    index = WorkspaceIndex(str(tmp_path))
    index.build()
    path = tmp_path / "web" / "server.go"
    shown = _names_in(_prepare(index, path, server, server.index("\t\n") + 1, CrossFileSources(index), language="go"))
    assert shown.count("func curvePreferences(c *Config) []int") == 1
    models = ("class Letter:\n    def __init__(self, text):\n        self.text = text\n\n\n"
              "class Parcel:\n    def __init__(self, weight):\n        self.weight = weight\n")
    user = "from .models import Letter, Parcel\n\n\ndef send(text, weight):\n    \n    return text\n"
    _, _, _, snippets = _blank_line_snippets(tmp_path / "py", {"pkg/__init__.py": "", "pkg/models.py": models,
                                                               "pkg/user.py": user}, budget=200)
    text = "\n".join(s.text for s in snippets)
    assert "def __init__(self, text):" in text and "def __init__(self, weight):" in text


def test_a_name_that_comes_with_the_names_near_the_cursor_elsewhere_scores_over_one_that_comes_everywhere(tmp_path):
    # In three files `open_mailbox` comes with `seal_envelope` in every window that uses it, but so does
    # `log_event`, which comes with everything; `stamp_letter` never comes with it. Seen from a cursor
    # after `open_mailbox(...)`, `seal_envelope` scores highest: coming along more than anywhere (the
    # lift) is what tells them apart.
    filler = "".join(f"    log_event(step_{n})\n    tally_{n} = step_{n} + 1\n" for n in range(6))
    with_it = "def deliver_{0}(path):\n    box = open_mailbox(path)\n    seal_envelope(box)\n    log_event(box)\n\n\n"
    without = "def stamp_{0}(item):\n    stamp_letter(item)\n    log_event(item)\n\n\n"
    files = []
    for number in range(3):
        path = tmp_path / f"post_{number}.py"
        path.write_text(with_it.format(number) + "def busy():\n" + filler + "\n\n" + without.format(number))
        files.append((str(path), object()))
    scores = FileWindows().names_alongside("def deliver(path):\n    box = open_mailbox(path)\n", files,
                                           lambda name: 1.0 if len(name) > 2 else 0.0, "",
                                           frozenset({"seal_envelope", "log_event", "stamp_letter"}))
    assert scores["seal_envelope"] > scores["log_event"] > scores.get("stamp_letter", 0.0)


def test_a_file_is_named_from_the_completed_files_folder_when_inside_it():
    assert shown_path("app/models.py", "app/report.py") == "models.py"
    assert shown_path("app/db/conn.py", "app/report.py") == "db/conn.py"
    assert shown_path("lib/util.py", "app/report.py") == "lib/util.py"
    assert shown_path("application/x.py", "app/report.py") == "application/x.py"  # a folder, not a prefix
    assert shown_path("util.py", "report.py") == "util.py"


def test_a_go_method_comes_without_its_types_header(tmp_path):
    # Go names a method's type in its receiver (`func (c *Cache) Get`): the type's `type Cache
    # struct {` line over it would say nothing more, and its tokens go to the next definition.
    cache = ('package web\n\ntype Cache struct {\n\tsize int\n}\n\n'
             'func (c *Cache) Get(key string) string { return key }\n\nfunc (c *Cache) Put(key, value string) {}\n')
    web = 'package web\n\nfunc Serve(c *Cache) {\n\tc.Put("a", "b")\n\t\n}\n'
    index, offset = _go_module(tmp_path, {"web/cache.go": cache, "web/web.go": web})
    prepared = _prepare(index, tmp_path / "web" / "web.go", web, offset, CrossFileSources(index), budget=24,
                        language="go")
    (snippet,) = prepared.context.cross_file
    assert (snippet.path, snippet.shown_path, snippet.text) == ("web/cache.go", "cache.go",
                                                                "func (c *Cache) Get(key string) string")
    assert (snippet.start_line, snippet.end_line) == (6, 7)  # the method's lines, not the type's
    # With room for the type too, it heads its methods, once.
    roomy = _prepare(index, tmp_path / "web" / "web.go", web, offset, CrossFileSources(index), budget=60,
                     language="go").context.cross_file
    assert [s.text for s in roomy] == ["type Cache struct {\nfunc (c *Cache) Get(key string) string\n"
                                       "func (c *Cache) Put(key, value string)"]
