"""Plans the hole at the cursor (first version: plain-text fallback). Knows nothing of tokens or LSP."""

from __future__ import annotations

from .syntax_tree import SyntaxDocument
from .types import HolePlan, Region


def plan_hole(doc: SyntaxDocument, offset: int) -> HolePlan:
    """The hole at `offset` (str index)."""
    line_start = doc.text.rfind("\n", 0, offset) + 1
    before = doc.text[line_start:offset]
    indent = before[: len(before) - len(before.lstrip())]
    return HolePlan(kind="text", region=Region(offset, offset), stop="max-lines", indent=indent, max_lines=8)
