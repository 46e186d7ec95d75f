"""The one bracket-depth walk (engine/syntax/brackets.py) and the questions post-processing asks of it:
where an answer closes a bracket it did not open, counting the brackets open before it, and
reading it after the cursor's line, whose open quote closes in the answer."""

from dgemma_lsp.engine.syntax.brackets import (
    balanced,
    bracket_depths,
    closing_end,
    depth_change,
    first_unmatched_closer,
    open_depth,
)


def test_the_walk_counts_brackets_outside_strings_and_comments():
    assert list(bracket_depths("f(a, ')') [x]  # (")) == [(1, "(", 1), (8, ")", 0), (10, "[", 1), (12, "]", 0)]
    assert list(bracket_depths("b)", depth=2)) == [(1, ")", 1)]


def test_a_closer_is_unmatched_only_past_the_brackets_open_before_the_text():
    assert first_unmatched_closer("x) + g(y))") == 1
    assert first_unmatched_closer("x) + g(y))", depth=1) == 9
    assert first_unmatched_closer("x) + g(y))", depth=2) is None


def test_the_line_before_the_cursor_is_read_for_its_quote_but_its_brackets_do_not_count():
    line_before = "xs = ['a', '"
    text = line_before + "b'], 1)"
    assert first_unmatched_closer(text, start=len(line_before)) == len(line_before) + 2
    assert first_unmatched_closer(line_before + "b, 1)", start=len(line_before)) is None  # still in the quote


def test_what_brackets_open_and_close():
    assert depth_change("a) (b") == 0 and open_depth("a) (b") == 1
    assert depth_change("((x)") == 1 == open_depth("((x)")
    assert closing_end("a, (b)) + c", 1) == len("a, (b))")
    assert balanced("f(x[1], {2})") and not balanced("a) (b") and not balanced("(")
