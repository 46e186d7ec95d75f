"""engine/crossfile/editor.py: which names the editor is asked about, what of its answers the prompt shows.

Model-free and LSP-free; the request itself over a real LSP connection is in
tests/server/test_editor_definitions.py, answered by real Neovim in tests/editors and by real VS Code
in editors/vscode/e2e.
"""

from __future__ import annotations

from dgemma_lsp.engine.api import CrossFileSnippet
from dgemma_lsp.engine.crossfile.editor import EditorDefinition, choose, header_of, names_near

SOURCE = '''from .models import Invoice


def summary(invoice: Invoice) -> str:
    receipt = payments.charge(invoice, "total")  # len(x)
    amount = invoice.total_with_tax(rate)
    label = describe(amount)
'''.split("\n")


def test_names_come_from_around_the_cursors_line_never_from_it_calls_and_attributes_first():
    names = names_near(SOURCE, 0, 5, "python")
    keys = [name.key for name in names]
    assert "invoice.total_with_tax" not in keys and "rate" not in keys  # the cursor's line: typing there changes nothing
    assert keys[:3] == ["payments.charge", "Invoice", "describe"]  # reached through / a type / called, nearest first
    assert "len" not in keys and "total" not in keys and "summary" not in keys  # a builtin; a string; defined here
    charge = next(name for name in names if name.key == "payments.charge")
    assert (charge.line, charge.column) == (4, SOURCE[4].index("charge"))
    # The same names whatever is typed on the cursor's line.
    typed = SOURCE[:5] + ["    amount = invoice.total_with_tax(rate) + other_thing(3)"] + SOURCE[6:]
    assert names_near(typed, 0, 5, "python") == names


def test_the_header_of_a_definition_never_its_body():
    assert header_of("def charge(invoice,\n           currency):\n    return 1\n") == \
        "def charge(invoice,\n           currency):"
    assert header_of("export function total(a: number): number {\n  return a;\n}") == \
        "export function total(a: number): number {"
    assert header_of("class Invoice:\n    x = 1") == "class Invoice:"
    assert header_of("MAX_RETRIES = 3\nother = 4") == "MAX_RETRIES = 3"
    assert header_of("\n\n") == ""


def test_choose_skips_the_current_file_what_is_shown_already_and_what_does_not_fit():
    charge = EditorDefinition("/lib/payments.py", 3, 4, "def charge(invoice, currency):")
    invoice = EditorDefinition("/ws/app/models.py", 0, 1, "class Invoice:")
    summary = EditorDefinition("/ws/app/report.py", 3, 4, "def summary(invoice):")
    shown = CrossFileSnippet(path="app/models.py", start_line=0, end_line=6, source="definition", score=1.0,
                             tokens=20, text="class Invoice:\n    ...")

    def relative(path: str) -> str:
        return path.removeprefix("/ws/")

    found = [("payments.charge", (charge,)), ("Invoice", (invoice,)), ("summary", (summary,))]
    (picked,) = choose(found, (shown,), 512, "/ws/app/report.py", relative)
    assert (picked.path, picked.source, picked.start_line, picked.text) == \
        ("/lib/payments.py", "editor", 3, "def charge(invoice, currency):")
    assert choose(found, (shown,), 20 + 12 + 12, "/ws/app/report.py", relative) == ()  # no room left
