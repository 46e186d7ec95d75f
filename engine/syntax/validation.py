"""Checks finished candidates against the grammar and ranks them.

For each candidate, only the enclosing definition is parsed (the top-level nodes around
the hole, or in a big class the members around it with the class's opening and
closing lines: `SyntaxDocument.enclosing_ranges`), once as it stands and then
incrementally with each candidate in place (replacing `replace_chars` chars right of
the cursor), through `Parser.included_ranges` so that rows, columns and byte offsets
are the document's own. The first parse can run while the engine denoises
(`CandidateChecker`), leaving only the incremental reparses for after the answer. The candidate is `syntax_ok` when its parse has no more ERROR/MISSING
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
from .brackets import closing_end, open_depth
from .document import SyntaxDocument, byte_points, byte_ranges

CLOSER_REACH = 4000
"""How far into the suffix (chars) to look for the closers of brackets a candidate leaves open."""


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


class CandidateChecker:
    """The enclosing definition of one hole, parsed once as it stands; each candidate is an
    incremental reparse of that tree with the candidate in place.

    Build it while the engine denoises (it needs only the document and the cursor), and
    checking a candidate after the answer costs an edit and a reparse of what changed,
    a few hundredths of a millisecond instead of a fresh parse of the definition.
    `reach`: how many chars right of the cursor a candidate may replace and still be
    checked here (a candidate that replaces more needs a checker of its own).
    """

    def __init__(self, doc: SyntaxDocument, offset: int, reach: int = 0) -> None:
        assert doc.tree is not None, "a checker needs a grammar"
        self.doc = doc
        self.offset = offset
        self.reach = min(reach, len(doc.text) - offset)
        self.start_byte = doc.byte_offset(offset)
        # An empty document has no region around the hole: the hole alone is one (a new file is empty).
        self.ranges = (doc.enclosing_ranges(self.start_byte, doc.byte_offset(offset + self.reach))
                       or [(self.start_byte, self.start_byte)])
        self.parser = tree_sitter.Parser(doc.tree.language)
        first = self.ranges[0][0]
        self.known = (first, doc.source.count(b"\n", 0, first))
        """(byte, row) where the definition starts: the same with any candidate in place (after it)."""
        self.parser.included_ranges = byte_ranges(doc.source, self.ranges, known=self.known)
        self.tree = self.parser.parse(doc.source)
        self.baseline = count_syntax_errors(self.tree)
        """ERROR/MISSING nodes of the definition as it stands (the hole itself often is one)."""
        self._through_closers: dict[int, CandidateChecker] = {}

    @classmethod
    def at_line_end(cls, doc: SyntaxDocument, offset: int) -> CandidateChecker:
        """A checker for candidates that replace at most the rest of the cursor's line."""
        line_end = doc.text.find("\n", offset)
        return cls(doc, offset, (len(doc.text) if line_end < 0 else line_end) - offset)

    def covers(self, doc: SyntaxDocument, offset: int, candidate: Candidate) -> bool:
        return doc is self.doc and offset == self.offset and candidate.replace_chars <= self.reach

    def errors_with(self, candidate: Candidate) -> int:
        """ERROR/MISSING nodes of the definition with the candidate in place of [cursor, cursor + replace_chars)."""
        doc, at = self.doc, self.start_byte
        old_end = doc.byte_offset(self.offset + candidate.replace_chars)
        inserted = candidate.text.encode("utf-8")
        source = doc.source[:at] + inserted + doc.source[old_end:]
        new_end = at + len(inserted)
        delta = new_end - old_end
        # Ranges before the hole stay, the one holding it stretches, the ones after it move.
        holder = max(i for i, (s, e) in enumerate(self.ranges) if s <= at <= e)
        moved = [(s, e) if i < holder else (s, max(e, old_end) + delta) if i == holder else (s + delta, e + delta)
                 for i, (s, e) in enumerate(self.ranges)]
        edited = self.tree.copy()
        start_point, old_end_point = byte_points(doc.source, [at, old_end], known=self.known)
        [new_end_point] = byte_points(source, [new_end], known=self.known)
        edited.edit(start_byte=at, old_end_byte=old_end, new_end_byte=new_end,
                    start_point=start_point, old_end_point=old_end_point, new_end_point=new_end_point)
        self.parser.included_ranges = byte_ranges(source, moved, known=self.known)
        return count_syntax_errors(self.parser.parse(source, edited))

    def syntax_ok(self, candidate: Candidate) -> bool:
        """Whether the candidate adds no ERROR/MISSING nodes to its definition."""
        checker = self._reaching_closers(candidate) or self
        return checker.errors_with(candidate) <= checker.baseline

    def _reaching_closers(self, candidate: Candidate) -> CandidateChecker | None:
        """A checker whose region reaches the closers of the brackets the candidate leaves open.

        `header = (|` above the lines of its tuple and their `)`: the region as the document
        stands ends before that `)` (without the `(` those lines are statements of their own), so
        the candidate would leave a bracket open inside it. None when the candidate closes what it
        opens, or the suffix does not close it within CLOSER_REACH, or the region already reaches."""
        depth = open_depth(candidate.text)
        if not depth:
            return None
        after = self.offset + candidate.replace_chars
        closed = closing_end(self.doc.text[after:after + CLOSER_REACH], depth)
        if closed is None:
            return None
        reach = after + closed - self.offset
        if self.doc.byte_offset(self.offset + reach) <= self.ranges[-1][1]:
            return None
        if reach not in self._through_closers:
            self._through_closers[reach] = CandidateChecker(self.doc, self.offset, reach)
        return self._through_closers[reach]


def rank_candidates(
    doc: SyntaxDocument, offset: int, candidates: list[Candidate], checker: CandidateChecker | None = None
) -> list[Candidate]:
    """Candidates with `syntax_ok` set, best first: syntax ok, then unknown, then broken; by confidence.

    `checker`: one built beforehand for this document and cursor (see CandidateChecker); a
    new one is built when it is missing or cannot check every candidate."""
    if not candidates:
        return []
    if doc.tree is None:
        checked = [msgspec.structs.replace(c, syntax_ok=None) for c in candidates]
    else:
        if checker is None or not all(checker.covers(doc, offset, c) for c in candidates):
            checker = CandidateChecker(doc, offset, max(c.replace_chars for c in candidates))
        checked = [msgspec.structs.replace(c, syntax_ok=checker.syntax_ok(c)) for c in candidates]
    order = {True: 0, None: 1, False: 2}
    return sorted(checked, key=lambda c: (order[c.syntax_ok], -c.confidence))
