"""positions.py against an independent oracle (encode the line prefix and count)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dgemma_lsp.server.positions import LineIndex, PositionError, choose_encoding

ENCODINGS = ["utf-8", "utf-16", "utf-32"]
# Valid text as editors send it: no lone surrogates; some line breaks of every kind.
texts = st.lists(
    st.one_of(
        st.characters(exclude_categories=["Cs"]),
        st.sampled_from(["\n", "\r\n", "\r", "😀", "漢", "é", "\u0301", "𝒳"]),
    ),
    max_size=60,
).map("".join)


def oracle_units(text: str, encoding: str) -> int:
    if encoding == "utf-8":
        return len(text.encode("utf-8"))
    if encoding == "utf-16":
        return len(text.encode("utf-16-le")) // 2
    return len(text)


def oracle_position(text: str, offset: int, encoding: str) -> tuple[int, int]:
    lines = text[:offset].replace("\r\n", "\n").replace("\r", "\n").split("\n")
    return len(lines) - 1, oracle_units(lines[-1], encoding)


@given(texts, st.sampled_from(ENCODINGS), st.data())
def test_offsets_round_trip_through_positions(text, encoding, data):
    index = LineIndex(text)
    offset = data.draw(st.integers(0, len(text)))
    if text[offset - 1:offset + 1] == "\r\n":  # between \r and \n is no position at all
        offset -= 1
    line, character = index.position(offset, encoding)
    assert (line, character) == oracle_position(text, offset, encoding)
    assert index.offset(line, character, encoding) == offset


@pytest.mark.parametrize(
    "encoding, character, expected",
    [("utf-16", 1, 0), ("utf-16", 2, 1), ("utf-8", 2, 0), ("utf-8", 4, 1), ("utf-32", 1, 1)],
)
def test_a_column_inside_a_code_point_rounds_down(encoding, character, expected):
    assert LineIndex("😀x").offset(0, character, encoding) == expected


@pytest.mark.parametrize(
    "encoding, end, expected",
    [("utf-16", 1, (0, 1)), ("utf-8", 1, (0, 1)), ("utf-8", 3, (0, 1)), ("utf-8", 4, (0, 1)), ("utf-32", 1, (0, 1))],
)
def test_a_range_end_inside_a_code_point_covers_it_and_an_empty_range_stays_empty(encoding, end, expected):
    index = LineIndex("😀x")
    assert index.span((0, 0), (0, end), encoding) == expected
    assert index.span((0, end), (0, end), encoding) == (index.offset(0, end, encoding),) * 2


def test_a_column_past_the_line_end_means_the_line_end():
    index = LineIndex("ab\r\ncd")
    assert index.offset(0, 99, "utf-16") == 2
    assert index.offset(1, 99, "utf-16") == 6


def test_a_line_past_the_end_is_outside_the_document():
    index = LineIndex("a\n")
    assert index.offset(1, 0, "utf-16") == 2  # the empty last line exists
    with pytest.raises(PositionError):
        index.offset(2, 0, "utf-16")
    with pytest.raises(PositionError):
        index.offset(-1, 0, "utf-16")


def test_encoding_negotiation_takes_the_clients_first_supported_choice():
    assert choose_encoding(None) == "utf-16"
    assert choose_encoding(["utf-8", "utf-16"]) == "utf-8"
    assert choose_encoding(["latin-1", "utf-32"]) == "utf-32"
    assert choose_encoding(["latin-1"]) == "utf-16"


# -- the incremental index -------------------------------------------------------------------

edits = st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 6), texts), min_size=1, max_size=12)


@given(texts, edits, st.sampled_from(ENCODINGS), st.data())
def test_an_index_kept_up_by_changes_equals_a_fresh_one(text, changes, encoding, data):
    index = LineIndex(text)
    for at, length, new_text in changes:
        start = at % (len(text) + 1)
        end = min(len(text), start + length)
        text = text[:start] + new_text + text[end:]
        index.apply_change(start, end, new_text)
        # Lookups in between read the lazily shifted starts; they must agree too.
        offset = data.draw(st.integers(0, len(text)))
        if text[offset - 1:offset + 1] == "\r\n":
            offset -= 1
        assert index.position(offset, encoding) == oracle_position(text, offset, encoding)
    fresh = LineIndex(text)
    assert index.text == text
    assert index.starts == fresh.starts
    for line in range(fresh.line_count):
        assert index.line_end(line) == fresh.line_end(line)
        assert index.offset(line, 3, encoding) == fresh.offset(line, 3, encoding)


def test_typing_on_one_line_shifts_the_lines_below():
    index = LineIndex("a\nb\nc\n")
    for i, ch in enumerate("xyz"):
        index.apply_change(1 + i, 1 + i, ch)
    assert index.text == "axyz\nb\nc\n"
    assert index.position(len(index.text) - 1, "utf-16") == (2, 1)
    assert index.offset(1, 0, "utf-16") == 5


def test_a_change_outside_the_text_is_refused_and_changes_nothing():
    index = LineIndex("ab\n")
    with pytest.raises(PositionError):
        index.apply_change(2, 9, "x")
    assert index.text == "ab\n" and index.starts == [0, 3]
