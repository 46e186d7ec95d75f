"""Checks finished candidates against the grammar and ranks them.

For each candidate, only the enclosing definition is parsed (the top-level nodes around
the hole, or in a big class the members around it with the class's opening and
closing lines: `SyntaxDocument.enclosing_ranges`), once as it stands and once
with the candidate in place (replacing `replace_chars` chars right of the cursor),
through `Parser.included_ranges` so that rows, columns and byte offsets are the
document's own. The candidate is `syntax_ok` when its parse has no more ERROR/MISSING
nodes than the region as it stands (the hole itself often is the current error).
A definition parses in well under a millisecond where a copy of a 5,000-line document
with the candidate in place took milliseconds (more in tree-sitter's error recovery);
a top-level node (or a member with its container's opening and closing) is what a
grammar parses on its own the same way it does in the file. Errors are counted by descending only into subtrees that report `has_error`.
Plaintext gives None. Knows nothing of tokens or LSP; offsets are str indices.
"""

from __future__ import annotations

import msgspec
import tree_sitter

from ..api import Candidate
from .document import SyntaxDocument, byte_range


def count_syntax_errors(tree: tree_sitter.Tree) -> int:
    """ERROR and MISSING nodes in the tree."""
    root = tree.root_node
    if not root.has_error:
        return 0
    count = 0
    stack = [root]
    while stack:
        node = stack.pop()
        if node.is_error or node.is_missing:
            count += 1
        for child in node.children:
            if child.has_error or child.is_missing:
                stack.append(child)
    return count


class _Region:
    """The enclosing definition of one hole, and a parser limited to it."""

    def __init__(self, doc: SyntaxDocument, offset: int, reach: int) -> None:
        self.doc = doc
        self.start_byte = doc.byte_offset(offset)
        self.ranges = doc.enclosing_ranges(self.start_byte, doc.byte_offset(min(len(doc.text), offset + reach)))
        assert doc.tree is not None, "a region needs a grammar"
        self.parser = tree_sitter.Parser(doc.tree.language)

    def errors(self, source: bytes, ranges: list[tuple[int, int]]) -> int:
        """ERROR/MISSING nodes in `source` parsed over the byte ranges."""
        self.parser.included_ranges = [byte_range(source, start, end) for start, end in ranges]
        return count_syntax_errors(self.parser.parse(source))

    def baseline(self) -> int:
        return self.errors(self.doc.source, self.ranges)

    def errors_with(self, offset: int, candidate: Candidate) -> int:
        doc, at = self.doc, self.start_byte
        old_end = doc.byte_offset(min(len(doc.text), offset + candidate.replace_chars))
        inserted = candidate.text.encode("utf-8")
        source = doc.source[:at] + inserted + doc.source[old_end:]
        delta = len(inserted) - (old_end - at)
        # Ranges before the hole stay, the one holding it stretches, the ones after it move.
        holder = max(i for i, (s, e) in enumerate(self.ranges) if s <= at <= e)
        moved = [(s, e) if i < holder else (s, max(e, old_end) + delta) if i == holder else (s + delta, e + delta)
                 for i, (s, e) in enumerate(self.ranges)]
        return self.errors(source, moved)


def check_candidate(doc: SyntaxDocument, offset: int, candidate: Candidate, baseline: int | None = None) -> bool | None:
    """Whether inserting the candidate adds no ERROR/MISSING nodes to its definition; None without a grammar."""
    if doc.tree is None:
        return None
    region = _Region(doc, offset, candidate.replace_chars)
    if baseline is None:
        baseline = region.baseline()
    return region.errors_with(offset, candidate) <= baseline


def rank_candidates(doc: SyntaxDocument, offset: int, candidates: list[Candidate]) -> list[Candidate]:
    """Candidates with `syntax_ok` set, best first: syntax ok, then unknown, then broken; by confidence."""
    if not candidates:
        return []
    if doc.tree is None:
        checked = [msgspec.structs.replace(c, syntax_ok=None) for c in candidates]
    else:
        region = _Region(doc, offset, max(c.replace_chars for c in candidates))
        baseline = region.baseline()
        checked = [
            msgspec.structs.replace(c, syntax_ok=region.errors_with(offset, c) <= baseline) for c in candidates
        ]
    order = {True: 0, None: 1, False: 2}
    return sorted(checked, key=lambda c: (order[c.syntax_ok], -c.confidence))
