"""Builds the prompt's text window around the cursor (first version). Knows nothing of LSP or tensors."""

from __future__ import annotations

import re

from .syntax_tree import SyntaxDocument
from .types import HolePlan, InfillContext

_TOKEN = re.compile(r"[A-Za-z_]{1,4}|[0-9]| {1,8}|\t{1,4}|\n|[^\x00-\x7f]|\S")


def approx_token_count(text: str) -> int:
    """A conservative tokenizer-free estimate of the tokens in `text`."""
    return len(_TOKEN.findall(text))


def build_context(doc: SyntaxDocument, offset: int, plan: HolePlan, budget_tokens: int) -> InfillContext:
    """Prefix/suffix windows around `offset` under `budget_tokens`."""
    lines_before = doc.text[:offset].split("\n")
    prefix_lines: list[str] = []
    used = 0
    for line in reversed(lines_before):
        cost = approx_token_count(line) + 1
        if used + cost > budget_tokens * 2 // 3:
            break
        prefix_lines.insert(0, line)
        used += cost
    prefix = "\n".join(prefix_lines)
    suffix_lines: list[str] = []
    for line in doc.text[offset:].split("\n"):
        cost = approx_token_count(line) + 1
        if used + cost > budget_tokens:
            break
        suffix_lines.append(line)
        used += cost
    suffix = "\n".join(suffix_lines)
    tokens = approx_token_count(prefix) + approx_token_count(suffix)
    return InfillContext(prefix=prefix, suffix=suffix, language=doc.language, tokens=tokens)
