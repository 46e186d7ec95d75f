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
  surrogate pair, or inside a UTF-8 sequence) rounds down to its start.
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
    """Start offsets of every line of one text, for O(log n) position lookups."""

    __slots__ = ("text", "starts")

    def __init__(self, text: str) -> None:
        self.text = text
        starts = [0]
        i, n = 0, len(text)
        find_any = _next_line_break
        while True:
            i = find_any(text, i)
            if i < 0:
                break
            i += 2 if text.startswith("\r\n", i) else 1
            starts.append(i)
            if i >= n:
                break
        self.starts = starts

    @property
    def line_count(self) -> int:
        return len(self.starts)

    def line_end(self, line: int) -> int:
        """Offset of the end of `line`'s content (before its line break)."""
        if line + 1 < len(self.starts):
            end = self.starts[line + 1] - 1
            if end > 0 and self.text[end] == "\n" and self.text[end - 1] == "\r":
                end -= 1
            return end
        return len(self.text)

    def offset(self, line: int, character: int, encoding: Encoding) -> int:
        """The str offset of the LSP position (line, character)."""
        if line < 0 or character < 0:
            raise PositionError(f"negative position {line}:{character}")
        if line >= len(self.starts):
            # One past the last line is the end of the document only when it ends
            # with a line break that we already counted as a line start.
            raise PositionError(
                f"line {line} is outside the document ({len(self.starts)} lines)"
            )
        start, end = self.starts[line], self.line_end(line)
        if encoding == "utf-32":
            return min(start + character, end)
        units = 0
        text = self.text
        for i in range(start, end):
            if units >= character:
                return i
            units += _unit_width(text[i], encoding)
            if units > character:  # inside a code point: round down to its start
                return i
        return end

    def position(self, offset: int, encoding: Encoding) -> tuple[int, int]:
        """The LSP (line, character) of a str offset."""
        if not 0 <= offset <= len(self.text):
            raise PositionError(f"offset {offset} outside the document of {len(self.text)} chars")
        line = bisect.bisect_right(self.starts, offset) - 1
        start = self.starts[line]
        return line, code_units(self.text[start:offset], encoding)


def _next_line_break(text: str, start: int) -> int:
    n = text.find("\n", start)
    r = text.find("\r", start, n if n >= 0 else len(text))
    return r if r >= 0 else n
