"""Turns raw model text into the text to insert (first version). Knows nothing of tokens or LSP."""

from __future__ import annotations

import msgspec

from .types import HolePlan, InfillContext


class FinishedText(msgspec.Struct, frozen=True):
    """Post-processed infill."""

    text: str
    """Text to insert at the cursor."""
    replace_chars: int = 0
    """Characters right of the cursor the text replaces."""


def strip_markdown_fences(text: str) -> str:
    """The content of the first Markdown code fence, or the text itself when there is none."""
    lines = text.split("\n")
    fences = [i for i, line in enumerate(lines) if line.lstrip().startswith("```")]
    if not fences:
        return text
    end = fences[1] if len(fences) > 1 else len(lines)
    return "\n".join(lines[fences[0] + 1 : end])


def finish_text(raw: str, context: InfillContext, plan: HolePlan) -> FinishedText:
    """The text to insert for `raw` (first version: fences stripped, line cap)."""
    text = strip_markdown_fences(raw)
    if plan.max_lines is not None:
        text = "\n".join(text.split("\n")[: plan.max_lines])
    if not text.strip():
        return FinishedText("")
    return FinishedText(text.rstrip())
