"""The edit window: the whole lines the model may rewrite for a next edit.

Zeta (REFERENCE.md) grows an editable region around the cursor to a syntax node. Here the seed
is the lines from the cursor to the user's last edit (when that is near: within `max_lines`),
and the window is the largest syntax node around the seed (short of the file itself) that spans at most
`max_lines` lines: in a function, usually the function itself, which is where a renamed parameter or a
changed signature asks for its next edit. A window of fewer than `min_lines` lines (a short
function, a statement at top level) is padded with lines around it, so that neighbours can be
proposed too. Without a grammar the window is `min_lines` lines around the seed.

The line bound keeps the canvas small (a rewrite denoises canvas by canvas) and keeps the
proposal where the user looks. Knows tree-sitter through SyntaxDocument; no torch, no LSP.
"""

from __future__ import annotations

import bisect

from ..api import Region
from ..syntax.document import SyntaxDocument

MAX_LINES = 30
"""Longest window, in lines (~300 tokens of typical code: Zeta's ~350-token region)."""
MIN_LINES = 12
"""A window shorter than this is padded with the lines around it."""


def edit_window(
    doc: SyntaxDocument, cursor: int, anchor: int | None = None, *, max_lines: int = MAX_LINES,
    min_lines: int = MIN_LINES,
) -> Region:
    """Whole lines [start, end) of `doc.text` around `cursor` and `anchor` (the last edit's offset)."""
    assert max_lines >= 1 and 0 <= cursor <= len(doc.text), (max_lines, cursor)
    text = doc.text
    min_lines = min(min_lines, max_lines)
    starts = _line_starts(text)
    total = len(starts)
    cursor_row = _row(starts, cursor)
    first = last = cursor_row
    if anchor is not None and 0 <= anchor <= len(text):
        anchor_row = _row(starts, anchor)
        if abs(anchor_row - cursor_row) < max_lines:
            first, last = min(first, anchor_row), max(last, anchor_row)
    tree = doc.whole_tree if doc.whole_tree is not None else doc.tree
    if tree is not None:
        lo, hi = starts[first], _line_end(text, starts, last)
        node = tree.root_node.descendant_for_byte_range(doc.byte_offset(lo), doc.byte_offset(max(lo, hi - 1)))
        while node is not None and node.parent is not None:  # the file itself is never the node
            node_start, node_end = doc.node_span(node)
            node_first, node_last = _row(starts, node_start), _row(starts, max(node_start, node_end - 1))
            if node_last - node_first + 1 > max_lines:
                break
            first, last = min(first, node_first), max(last, node_last)
            node = node.parent
    # Pad to min_lines, alternating after and before (what follows an edit is likelier to need one).
    while last - first + 1 < min_lines and (first > 0 or last < total - 1):
        if last < total - 1:
            last += 1
        if last - first + 1 < min_lines and first > 0:
            first -= 1
    return Region(starts[first], _line_end(text, starts, last))


def _line_starts(text: str) -> list[int]:
    starts = [0]
    at = text.find("\n")
    while at >= 0:
        if at + 1 < len(text):
            starts.append(at + 1)
        at = text.find("\n", at + 1)
    return starts


def _row(starts: list[int], offset: int) -> int:
    return max(0, bisect.bisect_right(starts, offset) - 1)


def _line_end(text: str, starts: list[int], row: int) -> int:
    """Offset one past row's line break (or the end of the text)."""
    return starts[row + 1] if row + 1 < len(starts) else len(text)
