"""One open document: its text and its tree-sitter tree, kept in step edit by edit.

Owns the incremental parse: every change edits the tree in place (`Tree.edit`) and
reparses with the old tree, so a keystroke costs a small reparse, never a fresh
parse. Offsets given to and returned by this module are Python str indices; the
tree speaks UTF-8 bytes and (row, byte-column) points, converted here and only here.
Also remembers which part of the text each recent change left untouched, so callers
can reuse work (the context window) while the user types on one line.
Knows nothing of cursors, holes, tokens or LSP.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import tree_sitter

from .languages import normalize_language, parser_for

_HISTORY = 256
"""How many recent changes `unchanged_since` can look back over."""


class SyntaxDocument:
    """Text + tree of one document. `tree` is None for plaintext (no grammar)."""

    def __init__(self, text: str, language: str) -> None:
        self.language: str = normalize_language(language)
        self._parser = parser_for(self.language)
        if self._parser is None:
            self.language = "plaintext"
        self.text: str = ""
        self.source: bytes = b""
        self.tree: tree_sitter.Tree | None = None
        self.revision: int = 0
        """Bumped by every change."""
        self.memo: dict[str, Any] = {}
        """Scratch space for derived data other modules cache per document (e.g. the context window);
        they validate it themselves with `revision` / `unchanged_since`."""
        self._changes: deque[tuple[int, int, int]] = deque(maxlen=_HISTORY)
        self._history_floor = 0
        self.set_text(text)

    # --- changes ------------------------------------------------------------------

    def set_text(self, text: str) -> None:
        """Replace the whole text and parse it from scratch (open, or a full-sync change)."""
        self.text = text
        self.source = text.encode("utf-8")
        self.tree = self._parser.parse(self.source) if self._parser is not None else None
        self.revision += 1
        self._changes.clear()
        self._history_floor = self.revision

    def apply_change(self, start: int, end: int, new_text: str) -> None:
        """Replace text[start:end] with new_text; edit the tree in place and reparse incrementally."""
        text = self.text
        assert 0 <= start <= end <= len(text), f"change {start}-{end} outside document of {len(text)} chars"
        start_byte, start_point = self._locate(start)
        old_end_byte, old_end_point = self._locate(end) if end != start else (start_byte, start_point)
        new_bytes = new_text.encode("utf-8")
        new_end_byte = start_byte + len(new_bytes)
        newlines = new_text.count("\n")
        if newlines:
            last_line = new_bytes[new_bytes.rfind(b"\n") + 1:]
            new_end_point = (start_point[0] + newlines, len(last_line))
        else:
            new_end_point = (start_point[0], start_point[1] + len(new_bytes))

        tail_len = len(text) - end
        self.text = text[:start] + new_text + text[end:]
        self.source = self.source[:start_byte] + new_bytes + self.source[old_end_byte:]
        self.revision += 1
        self._changes.append((self.revision, start, tail_len))
        if self.tree is not None:
            self.tree.edit(
                start_byte=start_byte,
                old_end_byte=old_end_byte,
                new_end_byte=new_end_byte,
                start_point=start_point,
                old_end_point=old_end_point,
                new_end_point=new_end_point,
            )
            self.tree = self._parser.parse(self.source, self.tree)

    def unchanged_since(self, revision: int) -> tuple[int, int] | None:
        """(head, tail): how many chars at the start and at the end of the text no change since
        `revision` touched; None when that revision is older than the remembered history."""
        if revision < self._history_floor:
            return None
        if self._changes and self._changes[0][0] > revision + 1 and len(self._changes) == _HISTORY:
            return None
        head, tail = len(self.text), len(self.text)
        for rev, start, tail_len in self._changes:
            if rev > revision:
                head = min(head, start)
                tail = min(tail, tail_len)
        return head, tail

    # --- offsets ------------------------------------------------------------------

    @property
    def is_ascii(self) -> bool:
        """True when str offsets and byte offsets coincide."""
        return len(self.source) == len(self.text)

    def byte_offset(self, offset: int) -> int:
        """UTF-8 byte offset of a str offset."""
        if self.is_ascii:
            return offset
        return len(self.text[:offset].encode("utf-8"))

    def str_offset(self, byte_offset: int) -> int:
        """Str offset of a UTF-8 byte offset (which must sit on a character boundary)."""
        if self.is_ascii:
            return byte_offset
        return len(self.source[:byte_offset].decode("utf-8", errors="replace"))

    def _locate(self, offset: int) -> tuple[int, tuple[int, int]]:
        """(byte offset, (row, byte column)) of a str offset."""
        text = self.text
        row = text.count("\n", 0, offset)
        line_start = text.rfind("\n", 0, offset) + 1
        if self.is_ascii:
            return offset, (row, offset - line_start)
        column = len(text[line_start:offset].encode("utf-8"))
        return self.byte_offset(offset), (row, column)

    def node_span(self, node: tree_sitter.Node) -> tuple[int, int]:
        """Str offsets [start, end) of a node."""
        if self.is_ascii:
            return node.start_byte, node.end_byte
        return self.str_offset(node.start_byte), self.str_offset(node.end_byte)
