"""Brackets in plain text, outside strings and line comments: a rough lexer and the one bracket-depth
walk over it (`bracket_depths`), shared by planning and post-processing.

Used where no tree is at hand (a model's raw output) or where a tree would be
overkill (the rest of the cursor's line). Knows no grammar: `#` (first on its line or before a
space), `//` and `--` start a comment in every language, which is right for the nine we serve often
enough for what these helpers decide (where an expression hole ends).
"""

from __future__ import annotations

from collections.abc import Iterator

OPENERS = {"(": ")", "[": "]", "{": "}"}
CLOSERS = {")": "(", "]": "[", "}": "{"}
QUOTES = "\"'`"


def code_chars(text: str) -> Iterator[tuple[int, str]]:
    """Yield (index, char) of the characters outside strings and line comments."""
    quote = None
    i = 0
    n = len(text)
    while i < n:
        c = text[i]
        if quote:
            if c == "\\":
                i += 2
                continue
            if c == quote or (c == "\n" and quote != "`"):
                quote = None
        elif c in QUOTES and not (c == "'" and _lifetime(text, i)):
            quote = c
        elif (c == "#" and _hash_comment(text, i)) or (c in "/-" and text[i:i + 2] in ("//", "--")):
            nl = text.find("\n", i)
            if nl < 0:
                return
            i = nl
            continue
        else:
            yield i, c
        i += 1


def _lifetime(text: str, i: int) -> bool:
    """Whether the `'` at `i` starts a Rust lifetime (`&'a str`, `<'a>`, `'static`), not a quote."""
    j = i + 1
    while j < len(text) and (text[j].isalnum() or text[j] == "_"):
        j += 1
    if j == i + 1 or text[j:j + 1] == "'":
        return False
    return text[i - 1:i] in ("<", "&") or text[i + 1:j] == "static"


def _hash_comment(text: str, i: int) -> bool:
    """Whether the `#` at `i` starts a comment: first on its line, or followed by a space or the
    line's end. Not `#token` (Lua's length), `this.#field` (JS), `#[attr]` (Rust)."""
    after = text[i + 1:i + 3]
    if after[:1] == "[" or after == "![":
        return False  # a Rust attribute
    if after[:1] in ("", " ", "\t", "\n", "\r", "!"):
        return True
    line_start = text.rfind("\n", 0, i) + 1
    return not text[line_start:i].strip()


def bracket_depths(text: str, depth: int = 0, start: int = 0) -> Iterator[tuple[int, str, int]]:
    """(index, bracket, depth after it) for each bracket outside strings and comments, counting
    from `depth`: the one depth walk the helpers below and post-processing's stops read. Brackets
    before `start` are lexed (a quote opened there closes after it) but not counted."""
    for i, c in code_chars(text):
        if i < start:
            continue
        if c in OPENERS:
            depth += 1
        elif c in CLOSERS:
            depth -= 1
        else:
            continue
        yield i, c, depth


def depth_change(text: str) -> int:
    """Openers minus closers in `text` (negative where it closes more than it opens)."""
    return sum(1 if c in OPENERS else -1 for _, c, _ in bracket_depths(text))


def open_depth(text: str) -> int:
    """Brackets left open at the end of `text` (never negative: a closer with nothing open is ignored)."""
    depth = 0
    for _, c, _ in bracket_depths(text):
        depth = depth + 1 if c in OPENERS else max(0, depth - 1)
    return depth


def closing_end(text: str, depth: int) -> int | None:
    """The index just after the closer in `text` that closes `depth` brackets opened before it, or None."""
    return next((i + 1 for i, c, after in bracket_depths(text, depth) if c in CLOSERS and after == 0), None)


def first_unmatched_closer(text: str, depth: int = 0, start: int = 0) -> int | None:
    """Index of the first closing bracket in `text` that no opener in `text` matches, nor one of
    `depth` brackets open before it; brackets before `start` lexed but not counted (bracket_depths)."""
    return next((i for i, _, after in bracket_depths(text, depth, start) if after < 0), None)


def balanced(text: str) -> bool:
    """Whether every bracket `text` opens it closes, and it closes none it did not open."""
    return first_unmatched_closer(text) is None and depth_change(text) == 0
