"""server/line_endings.py: every line break of a text sent into a document becomes the document's own."""

from __future__ import annotations

import pytest

from dgemma_lsp.server.line_endings import line_ending, with_line_ending
from dgemma_lsp.server.positions import LineIndex


@pytest.mark.parametrize(("document", "ending"), [
    ("a\r\nb\r\n", "\r\n"), ("a\nb\r\n", "\n"), ("\r\nx", "\r\n"), ("no break", "\n"), ("", "\n"),
    ("old\rmac\r", "\n"),  # lone-CR documents get LF: a lone CR is what must never be sent
])
def test_the_documents_ending_is_its_first_line_breaks(document: str, ending: str):
    assert line_ending(document) == ending


@pytest.mark.parametrize("ending", ["\n", "\r\n"])
def test_every_break_becomes_the_documents_and_no_lone_cr_is_left(ending: str):
    answer = "x = 1\ry = 2\r\nz = 3\n\r\r\n"
    out = with_line_ending(answer, ending)
    assert out == ending.join(["x = 1", "y = 2", "z = 3", "", "", ""])
    # The editor's line count (LSP's: CR, LF, CRLF) now matches what it shows: no hidden break.
    assert LineIndex(out).line_count == out.count("\n") + 1


def test_a_text_without_breaks_is_returned_as_is():
    text = "return fib(n - 1)"
    assert with_line_ending(text, "\r\n") is text
