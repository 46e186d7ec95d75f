"""Checks candidates against the grammar and ranks them (first version). Knows nothing of LSP."""

from __future__ import annotations

from .syntax_tree import SyntaxDocument
from .types import Candidate


def rank_candidates(doc: SyntaxDocument, offset: int, candidates: list[Candidate]) -> list[Candidate]:
    """Candidates sorted best first."""
    return sorted(candidates, key=lambda c: -c.confidence)
