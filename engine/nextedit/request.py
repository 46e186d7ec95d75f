"""One next edit before and after the denoiser: the request for the window, the proposal from the answer.

The window (window.py) becomes a rewrite (engine/syntax/infill.py `prepare_rewrite`): its text is
the starting canvas, renoised at the next edit's own strength and denoised with the rest of the
file around it; the recent edits go into the prompt as unified diffs (`DenoiseRequest.recent_edits`,
which turns the rewrite instruction into the next-edit one: engine/model/prompting.py). The
window's kept tokens are pinned in the canvas and shown in the prompt ("both"): a next edit
changes a few tokens of a window that mostly stays. The prompt cache is not used (the diffs
change with every edit, and the completion's cached prompt for the same document must survive).

Runs where the document lives (the server's syntax worker); knows tree-sitter, no torch, no LSP.
"""

from __future__ import annotations

import msgspec

from ..api import DenoiseRequest, GenerationSettings, Region
from ..syntax.document import SyntaxDocument
from ..syntax.infill import DEFAULT_CONTEXT_TOKENS, prepare_rewrite
from ..syntax.postprocess import strip_markdown_fences
from .edits import EditLog
from .proposal import ProposedEdit, pick_proposal
from .window import MAX_LINES, edit_window

DEFAULT_STRENGTH = 0.4
"""How much of the window a next edit renoises: enough to change a name in every line, little
enough that most of the window is kept (bench/nextedit.py measures what this keeps)."""


class PreparedNextEdit(msgspec.Struct, frozen=True, kw_only=True):
    """What was decided before denoising, kept to turn the answer into a proposal."""

    window: Region
    """The lines the model rewrites."""
    anchor: int
    """Where the user's last edit ends (the cursor when none is logged): the proposal is the hunk nearest it."""
    request: DenoiseRequest
    """What the denoiser is asked."""


def prepare_next_edit(
    doc: SyntaxDocument,
    cursor: int,
    edits: EditLog,
    strength: float,
    settings: GenerationSettings,
    *,
    path: str = "file",
    max_lines: int = MAX_LINES,
    budget_tokens: int = DEFAULT_CONTEXT_TOKENS,
    priority: int = 0,
) -> PreparedNextEdit | None:
    """The request for a next edit at `cursor` in `doc` (whose text `edits` describes); None when
    the document is empty (nothing to rewrite)."""
    if not doc.text.strip():
        return None
    last = edits.last
    anchor = last.end if last is not None else cursor
    window = edit_window(doc, cursor, anchor, max_lines=max_lines)
    request = prepare_rewrite(
        doc, window.start, window.end, strength, settings, budget_tokens=budget_tokens, keep="both",
        priority=priority,
    )
    request = msgspec.structs.replace(request, recent_edits=edits.diffs(doc.text, path))
    return PreparedNextEdit(window=window, anchor=anchor, request=request)


def finish_next_edit(prepared: PreparedNextEdit, document: str, answer: str) -> ProposedEdit | None:
    """The edit proposed by `answer` (the model's rewrite of the window in `document`); None: no edit."""
    text = strip_markdown_fences(answer)
    return pick_proposal(document, prepared.window.start, prepared.window.end, text, prepared.anchor)
