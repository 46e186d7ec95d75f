"""One next-edit request shared by the engine-client tests (in-process, daemon, vLLM)."""

from __future__ import annotations

from dgemma_lsp.engine.api import GenerationSettings
from dgemma_lsp.engine.nextedit.edits import EditLog
from dgemma_lsp.engine.nextedit.request import PreparedNextEdit, prepare_next_edit
from dgemma_lsp.engine.syntax.document import SyntaxDocument

BEFORE = '''def load(path, mode):
    """Read the file at path."""
    with open(path, mode) as handle:
        return handle.read()
'''


def renamed() -> tuple[str, PreparedNextEdit]:
    """The text after renaming the parameter in the signature, and the next edit's request there."""
    log = EditLog()
    at = BEFORE.index("path")
    log.record(BEFORE, at, at + 4, "filename")
    text = BEFORE[:at] + "filename" + BEFORE[at + 4:]
    settings = GenerationSettings(steps=4, seed=5, early_stop=False)
    prepared = prepare_next_edit(SyntaxDocument(text, "python"), at + 8, log, 0.5, settings, path="load.py")
    assert prepared is not None
    return text, prepared
