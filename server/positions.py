"""LSP positions <-> Python str offsets, in the negotiated position encoding.

The one place that knows how an editor counts columns: UTF-16 code units (the
LSP default, VS Code), UTF-8 bytes (Neovim's choice when offered) or UTF-32
code points (= Python str indices). Lines end at "\\n", "\\r\\n" or "\\r", as
the LSP specification says. Knows nothing of pygls, documents or the engine:
it works on a `str` and a `LineIndex` built from it.

Out-of-range rules (the specification's, plus one of ours):
- a line past the last line is an error (`PositionError`): the position is
  outside the document;
- a character past the end of its line means the end of the line (the spec:
  "defaults back to the line length");
- a character that lands inside a code point (between the two halves of a
  surrogate pair, or inside a UTF-8 sequence) rounds down to its start, except
  at the end of a non-empty range (`span`), where it rounds up to the code
  point's end: a selection that ends one unit into a character covers it
  (Neovim sends a charwise selection's end one unit into its last character).
"""

from __future__ import annotations

import bisect
from typing import Literal

Encoding = Literal["utf-8", "utf-16", "utf-32"]
ENCODINGS: tuple[Encoding, ...] = ("utf-16", "utf-8", "utf-32")
"""Supported encodings, the LSP default first."""


class PositionError(ValueError):
    """A position or range that does not lie in the document."""


def choose_encoding(offered: list[str] | None) -> Encoding:
    """The client's most preferred encoding that we support; UTF-16 when it offers none."""
    for name in offered or ():
        if name in ENCODINGS:
            return name  # type: ignore[return-value]
    return "utf-16"


def code_units(text: str, encoding: Encoding) -> int:
    """Length of `text` in the encoding's code units."""
    if encoding == "utf-32" or text.isascii():
        return len(text)
    if encoding == "utf-16":
        return len(text) + sum(1 for ch in text if ord(ch) > 0xFFFF)
    return len(text.encode("utf-8", "surrogatepass"))


def _unit_width(ch: str, encoding: Encoding) -> int:
    code = ord(ch)
    if encoding == "utf-32":
        return 1
    if encoding == "utf-16":
        return 2 if code > 0xFFFF else 1
    return 1 if code < 0x80 else 2 if code < 0x800 else 3 if code < 0x10000 else 4


class LineIndex:
    """Start offsets of every line of one text, for O(log n) position lookups.

    Kept in step with the text by `apply_change`, which rescans only the changed
    span: the starts after it move by the change's length difference, and that
    shift is applied lazily (one pending (index, delta) pair) because a user
    typing on one line shifts the same tail again and again. A rebuild would
    cost a pass over every line per keystroke.
    """

    __slots__ = ("text", "_starts", "_shift_from", "_shift")

    def __init__(self, text: str) -> None:
        self.text = text
        self._starts = [0] + _line_starts(text, 0, len(text))
        self._shift_from = len(self._starts)
        self._shift = 0
        """Starts at index >= _shift_from are stored _shift too small."""

    def copy(self) -> LineIndex:
        """An independent index of the same text (a list copy: microseconds for 10,000 lines)."""
        other = object.__new__(LineIndex)
        other.text, other._starts = self.text, list(self._starts)
        other._shift_from, other._shift = self._shift_from, self._shift
        return other

    @property
    def starts(self) -> list[int]:
        """Every line's start offset (materialized: for tests and debugging)."""
        self._materialize()
        return list(self._starts)

    @property
    def line_count(self) -> int:
        return len(self._starts)

    def apply_change(self, start: int, end: int, new_text: str) -> None:
        """Replace text[start:end] with new_text, updating the line starts around it."""
        text = self.text
        if not 0 <= start <= end <= len(text):
            raise PositionError(f"change {start}-{end} outside the document of {len(text)} chars")
        self.text = text = text[:start] + new_text + text[end:]
        delta = len(new_text) - (end - start)
        lo = self._bisect(start, right=False)  # starts >= start may change ...
        hi = self._bisect(end + 1, right=False)  # ... up to those past the old span's end, which only move
        new_end = start + len(new_text)
        middle = [s for s in _line_starts(text, max(start - 1, 0), new_end) if start <= s <= new_end]
        if start == 0:
            middle.insert(0, 0)  # the first line starts at 0 without a break before it
        if self._shift and self._shift_from != hi:
            self._materialize()
        pending = self._shift if self._shift_from == hi else 0
        self._starts[lo:hi] = middle
        self._shift_from = lo + len(middle)
        self._shift = pending + delta
        if self._shift_from >= len(self._starts):
            self._shift = 0

    def _materialize(self) -> None:
        if self._shift:
            starts, shift = self._starts, self._shift
            starts[self._shift_from:] = [s + shift for s in starts[self._shift_from:]]
        self._shift_from, self._shift = len(self._starts), 0

    def _start(self, line: int) -> int:
        return self._starts[line] + (self._shift if line >= self._shift_from else 0)

    def _bisect(self, offset: int, *, right: bool) -> int:
        """bisect_left/right over the effective starts (the stored ones plus the pending shift)."""
        search = bisect.bisect_right if right else bisect.bisect_left
        starts, k = self._starts, self._shift_from
        if not self._shift or k >= len(starts):
            return search(starts, offset)
        first_shifted = starts[k] + self._shift
        if first_shifted > offset or (not right and first_shifted == offset):
            return search(starts, offset, 0, k)
        return search(starts, offset - self._shift, k, len(starts))

    def line_end(self, line: int) -> int:
        """Offset of the end of `line`'s content (before its line break)."""
        if line + 1 < len(self._starts):
            end = self._start(line + 1) - 1
            if end > 0 and self.text[end] == "\n" and self.text[end - 1] == "\r":
                end -= 1
            return end
        return len(self.text)

    def span(self, start: tuple[int, int], end: tuple[int, int], encoding: Encoding) -> tuple[int, int]:
        """The str offsets of the LSP range [start, end): the start rounds down, a non-empty end up."""
        begin = self.offset(*start, encoding)
        if end == start:
            return begin, begin
        return begin, self.offset(*end, encoding, round_up=True)

    def offset(self, line: int, character: int, encoding: Encoding, *, round_up: bool = False) -> int:
        """The str offset of the LSP position (line, character); inside a code point: its start, or its end."""
        if line < 0 or character < 0:
            raise PositionError(f"negative position {line}:{character}")
        if line >= len(self._starts):
            # One past the last line is the end of the document only when it ends
            # with a line break that we already counted as a line start.
            raise PositionError(
                f"line {line} is outside the document ({len(self._starts)} lines)"
            )
        start, end = self._start(line), self.line_end(line)
        if encoding == "utf-32":
            return min(start + character, end)
        units = 0
        text = self.text
        for i in range(start, end):
            if units >= character:
                return i
            units += _unit_width(text[i], encoding)
            if units > character:  # inside a code point: its start, or (round_up) its end
                return i + 1 if round_up else i
        return end

    def position(self, offset: int, encoding: Encoding) -> tuple[int, int]:
        """The LSP (line, character) of a str offset."""
        if not 0 <= offset <= len(self.text):
            raise PositionError(f"offset {offset} outside the document of {len(self.text)} chars")
        line = self._bisect(offset, right=True) - 1
        start = self._start(line)
        return line, code_units(self.text[start:offset], encoding)


def _line_starts(text: str, begin: int, end: int) -> list[int]:
    """Offsets that start a line because of a line break at an index in [begin, end)."""
    starts = []
    i, n = begin, len(text)
    while True:
        i = _next_line_break(text, i)
        if i < 0 or i >= end:
            break
        i += 2 if text.startswith("\r\n", i) else 1
        starts.append(i)
        if i >= n:
            break
    return starts


def _next_line_break(text: str, start: int) -> int:
    n = text.find("\n", start)
    r = text.find("\r", start, n if n >= 0 else len(text))
    return r if r >= 0 else n
