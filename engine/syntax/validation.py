"""Checks finished candidates against the grammar and ranks them.

For each candidate: a copy of the document's tree is edited as if the candidate were
inserted (replacing `replace_chars` chars right of the cursor) and reparsed
incrementally; the candidate is `syntax_ok` when the result has no more ERROR/MISSING
nodes than the document as it stands (the hole itself often is the current error).
Errors are counted by descending only into subtrees that report `has_error`, so the
check costs the size of the damage, not of the file. Plaintext gives None.
Knows nothing of tokens or LSP; offsets are str indices.
"""

from __future__ import annotations

import msgspec
import tree_sitter

from ..api import Candidate
from .document import SyntaxDocument
from .languages import parser_for


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


def check_candidate(doc: SyntaxDocument, offset: int, candidate: Candidate, baseline: int) -> bool | None:
    """Whether inserting the candidate adds no ERROR/MISSING nodes; None without a grammar."""
    parser = parser_for(doc.language)
    if doc.tree is None or parser is None:
        return None
    end = min(len(doc.text), offset + candidate.replace_chars)
    start_byte = doc.byte_offset(offset)
    old_end_byte = doc.byte_offset(end)
    inserted = candidate.text.encode("utf-8")
    source = doc.source[:start_byte] + inserted + doc.source[old_end_byte:]
    tree = doc.tree.copy()
    tree.edit(
        start_byte=start_byte,
        old_end_byte=old_end_byte,
        new_end_byte=start_byte + len(inserted),
        start_point=_point(doc.source, start_byte),
        old_end_point=_point(doc.source, old_end_byte),
        new_end_point=_point(source, start_byte + len(inserted)),
    )
    return count_syntax_errors(parser.parse(source, tree)) <= baseline


def rank_candidates(doc: SyntaxDocument, offset: int, candidates: list[Candidate]) -> list[Candidate]:
    """Candidates with `syntax_ok` set, best first: syntax ok, then unknown, then broken; by confidence."""
    if not candidates:
        return []
    baseline = count_syntax_errors(doc.tree) if doc.tree is not None else 0
    checked = [
        msgspec.structs.replace(c, syntax_ok=check_candidate(doc, offset, c, baseline)) for c in candidates
    ]
    order = {True: 0, None: 1, False: 2}
    return sorted(checked, key=lambda c: (order[c.syntax_ok], -c.confidence))


def _point(source: bytes, byte: int) -> tuple[int, int]:
    """(row, byte column) of a byte offset."""
    line_start = source.rfind(b"\n", 0, byte) + 1
    return source.count(b"\n", 0, byte), byte - line_start
