"""Turns the model's raw middle into the text to insert at the cursor.

Rules, in order: strip Markdown fences; strip a repeated copy of the cursor line's
prefix (or of the last lines before the cursor), which instruction-tuned models emit;
stop where the hole's plan says (line end for `line`, before the closer for
`expression`, where the block dedents or closes for `block`, before the suffix's next
statement for `statement`, and every kind at `max_lines`); re-indent to the cursor's
block; never insert a closer the suffix already has; trim text that repeats the start
of the suffix; and drop whitespace-only or degenerate repetitive output (empty text).
`replace_chars` > 0 only for an expression hole whose rest of line is nothing but
auto-inserted closers that the model wrote itself and then continued past.
Knows nothing of tokens, trees or LSP: it reads the plan and the context's text.
"""

from __future__ import annotations

import re

import msgspec

from ..api import HolePlan, InfillContext
from .block_words import answer_opens, block_end_walker, bracket_view
from .brackets import CLOSERS, OPENERS, balanced, code_chars, depth_change, first_unmatched_closer, open_depth
from .languages import INDENT_SCOPED

_DEGENERATE_WHOLE = re.compile(r"(.{1,16}?)\1{4,}", re.DOTALL)
_REPEATED_RUN = re.compile(r"(.{2,24}?)\1{7,}", re.DOTALL)
_IDENT = re.compile(r"\w")
_LONG_LINE_CUT = 200
"""A cursor line at least this long, alone in the context's prefix, may have been cut by the budget."""
_LOOP_COPIES = 16
"""Copies of a repeated run that are a loop wherever they stand (8 are one only at the text's end)."""
MAX_PLAIN_LINES = 8
"""Plain text's cap when the plan has none (planning gives 8)."""
MAX_PLAIN_BODY_LINES = 32
MAX_PLAIN_STATEMENT_LINES = 16
"""Plain text on a blank line among siblings: capped as a grammar's statement hole is."""
PLAIN_OPENERS = ("{", "(", "[")
"""What opens a body in plain text: brackets; not `:`, which ends prose lines (`Notes:`) as often."""
"""Plain text after an opener that ends the line: a body, capped as a grammar's block hole is."""


class FinishedText(msgspec.Struct, frozen=True):
    """Post-processed infill, ready to insert at the cursor."""

    text: str
    """Text to insert at the cursor (empty: nothing worth showing)."""
    replace_chars: int = 0
    """Characters right of the cursor the text replaces (auto-closed brackets the text rewrites)."""


EMPTY = FinishedText("")


def strip_markdown_fences(text: str) -> str:
    """The content of the first Markdown code fence, or the text itself when it has none.

    An opening fence without a closing one (a draft still being denoised) yields
    everything after it; prose around a fenced block is dropped.
    """
    lines = text.split("\n")
    fences = [i for i, line in enumerate(lines) if line.lstrip().startswith("```")]
    if not fences:
        return text
    first = fences[0]
    code_before = any(line.strip() for line in lines[:first])
    if len(fences) == 1 and code_before and lines[first].strip() == "```":
        # A bare lone fence after code closes a block whose opening fence was not emitted.
        return "\n".join(lines[:first])
    end = fences[1] if len(fences) > 1 else len(lines)
    return "\n".join(lines[first + 1:end])


def finish_text(raw: str, context: InfillContext, plan: HolePlan) -> FinishedText:
    """The text to insert for the model's raw middle, under the plan's stop rule."""
    text = strip_markdown_fences(raw).replace("\r\n", "\n")
    prefix, suffix = context.prefix, context.suffix
    line_before = prefix[prefix.rfind("\n") + 1:]
    rest_of_line = suffix.split("\n", 1)[0]
    text = _strip_repeated_prefix(text, prefix, line_before, rest_of_line)
    text = _cut_degenerate(text)
    if not text.strip():
        return EMPTY

    replace_chars = 0
    if plan.kind == "expression":
        text, replace_chars = _finish_expression(text, plan, line_before, rest_of_line)
    elif plan.kind == "line":
        text = _finish_line(text, plan, line_before, suffix, context.language)
    elif plan.kind in ("block", "statement"):
        text = _finish_lines(text, plan, line_before, suffix, context.language)
    else:
        text, replace_chars = _finish_plain(text, plan, prefix, suffix, rest_of_line)
    if not text.strip():
        return EMPTY
    return FinishedText(text, replace_chars)


# --- per kind -------------------------------------------------------------------------


def _finish_expression(text: str, plan: HolePlan, line_before: str, rest_of_line: str) -> tuple[str, int]:
    if line_before.endswith((" ", "\t")):
        text = text.lstrip(" \t")
    closer = plan.closer
    if closer is None:
        # A gap inside the line: one line at most, minus any copy of what follows the cursor.
        text = text.split("\n", 1)[0].rstrip("\n")
        rest = rest_of_line.strip()
        body = text.rstrip()
        for k in range(len(rest), 0, -1):
            # The model rewrote (the start of) what follows the cursor: keep only the gap. Under
            # three characters only punctuation that cannot end the gap itself (`;`, `,`).
            at = len(body) - k
            if k < 3 and not all(c in ";," for c in rest[:k]):
                continue
            if at > 0 and body.endswith(rest[:k]) and (
                    not _IDENT.match(body[at - 1]) or not _IDENT.match(rest[0])):
                text = body[:at]
                break
        if rest_of_line[:1] in (" ", "\t"):
            text = text.rstrip(" \t")
        return text, 0
    if closer in CLOSERS:
        # The cursor in a quote (`['a', '|]`, `$( "|)` in an HTML page's script): the text's
        # brackets count after the quote closes in it.
        stop = _first_closer_after(line_before, text) if _in_quote(line_before) else None
        if stop is None:
            stop = first_unmatched_closer(text)
        if stop is None:
            stop = _first_closer_after(line_before, text)
    else:
        stop = _first_unescaped(text, closer)
    newline = text.find("\n")
    if stop is None or (newline >= 0 and newline < stop):
        # No closer written: keep the first line(s) up to the line cap; brackets the model
        # opened may spill onto further lines.
        lines = text.split("\n")
        return _cap_balanced(lines, plan.max_lines or 1).rstrip(), 0
    head, after = text[:stop], text[stop:]
    auto_closed = rest_of_line.rstrip()
    continuation = after.split("\n", 1)[0]
    went_on = continuation[len(auto_closed):]
    if (auto_closed and all(c in ")]}\"'`;" for c in auto_closed) and continuation.startswith(auto_closed)
            and went_on.strip() and first_unmatched_closer(went_on) is None):
        # `foo(|)` -> `x).strip()`: the model closed the call and went on; replace the `)`.
        return head + continuation.rstrip(), len(auto_closed)
    return head, 0


def _finish_line(text: str, plan: HolePlan, line_before: str, suffix: str, language: str = "plaintext") -> str:
    if line_before.endswith((" ", "\t")):
        text = text.lstrip(" \t")
    if text.startswith("\n"):
        return ""
    depth = open_depth(bracket_view(language, line_before))
    lines = text.split("\n")
    kept: list[str] = []
    body_follows = _deeper_line_follows(suffix, line_before)
    for line in lines[: plan.max_lines or 1]:
        if not kept:
            # The first line read after the cursor's text: a quote opened before the cursor
            # (`["|`) closes in it, and its brackets count outside that string.
            depth = open_depth(bracket_view(language, line_before + line))
        else:
            depth += depth_change(bracket_view(language, line))
        kept.append(line)
        if depth <= 0 or body_follows:
            # A bracket left open grows the line, unless what it opens is already in the suffix
            # (its next line is indented deeper than the cursor's): then the model ran on into it.
            break
    out = "\n".join(kept).rstrip()
    return _drop_closer_suffix_has(out, suffix, line_before)


def _finish_lines(text: str, plan: HolePlan, line_before: str, suffix: str, language: str) -> str:
    """block and statement holes: whole lines at the plan's indentation."""
    if line_before.strip() and not plan.closer and not text.startswith("\n"):
        first = text.split("\n", 1)[0]
        if first.strip() and first_unmatched_closer(first) is not None:
            # `{ delete p; }` on the header's own line: a one-line body, kept as written.
            return first.rstrip()
        if first.strip() and _header_unfinished(language, line_before):
            # `rescue |`, `def name|`, `Errno::|`: the answer's first line finishes the header
            # line; a body, if the answer has one, follows on the next lines (not after a blank,
            # and not where the suffix has the body already: a statement plan).
            rest = text.split("\n", 1)[1] if "\n" in text else ""
            if plan.kind == "statement" or not rest.split("\n", 1)[0].strip():
                return first.rstrip()
            return first.rstrip() + _finish_lines("\n" + rest, plan, line_before + first, suffix, language)
    lines = text.split("\n")
    written_at_cursor = bool(lines[0].strip())
    while lines and not lines[0].strip():
        lines.pop(0)
    if not lines:
        return ""
    walk_words = _lua_depth_walk if language == "lua" else block_end_walker(language)
    if language in INDENT_SCOPED:
        # The answer's first line starts at the cursor, after the cursor's line (its indentation, or
        # a header `for x in xs:`): its own column is not in the text, the later lines' are.
        first_at_cursor = bool(line_before) and written_at_cursor
    else:
        first_at_cursor = not line_before.strip() and bool(line_before)
    lines = _rebase(lines, plan.indent, first_at_cursor=first_at_cursor, opens=answer_opens(language, lines),
                    scoped_by_indent=language in INDENT_SCOPED)
    kept: list[str] = []
    depth = 0
    keyword_depth = 0
    for index, line in enumerate(lines):
        stripped = line.strip()
        if stripped:
            if index > 0 and _indent_width(line) < _indent_width(plan.indent) and not _is_directive(line):
                break
            keywords_before = keyword_depth
            if walk_words is not None:
                keyword_depth, closes_outer = walk_words(line, keyword_depth)
                if closes_outer and (kept or keyword_depth < 0):
                    break  # (a first line `else`/`rescue` is the answer: the cursor is where it goes)
            if plan.kind in ("statement", "block") and kept and depth == keywords_before == 0 \
                    and _is_suffix_start(lines, index, suffix, same_indent=language == "plaintext"):
                while kept and (not kept[-1].strip() or _is_comment(kept[-1])):
                    kept.pop()  # the comment above the suffix's statement is the suffix's too
                break
            view = bracket_view(language, line)
            dip = first_unmatched_closer(view, depth)
            if dip is not None:
                # The line closes a bracket opened before the hole: the suffix has that closer.
                # (Cut the line itself where its view is cut: the view blanks CSS's `#fff`.)
                cut = line[:dip]
                if cut.strip():
                    kept.append(cut.rstrip())
                break
            depth += depth_change(view)
        kept.append(line.rstrip())
        if len(kept) >= (plan.max_lines or len(lines)):
            break
    while kept and not kept[-1].strip():
        kept.pop()
    if not kept:
        return ""
    # The first line goes at the cursor: only the indentation the cursor's line lacks.
    first = kept[0].lstrip(" \t")
    if line_before.strip():
        body = "\n" + "\n".join([plan.indent + first] + kept[1:])
    else:
        missing = plan.indent[len(line_before):] if plan.indent.startswith(line_before) else ""
        body = "\n".join([missing + first] + kept[1:])
    if plan.closer:
        # `{|}` on one line: the body goes on its own lines, the `}` back at the header's indentation.
        outer = line_before[: len(line_before) - len(line_before.lstrip(" \t"))]
        if not body.startswith("\n"):
            body = "\n" + plan.indent + body.lstrip(" \t")
        body += "\n" + outer
    return body


def _finish_plain(text: str, plan: HolePlan, prefix: str, suffix: str, rest_of_line: str) -> tuple[str, int]:
    """No grammar: the stops of the kind the cursor's line suggests, from brackets and indentation
    alone. Text after the cursor: an expression up to the first closer the text does not open
    (else one line); code before it: the line, growing while brackets stay open, or a body after an
    opener that ends the line; a blank line: lines at the cursor's indentation or deeper, ending
    where they dedent, close a bracket opened before the hole, or run into the suffix's next line.
    Within the plan's line cap, except a body (after an opener: MAX_PLAIN_BODY_LINES)."""
    cap = plan.max_lines or MAX_PLAIN_LINES

    def as_kind(kind: str, indent: str, closer: str | None = None, max_lines: int = cap) -> HolePlan:
        return HolePlan(kind=kind, region=plan.region, stop=plan.stop, indent=indent, max_lines=max_lines,
                        closer=closer)

    line_before = prefix[prefix.rfind("\n") + 1:]
    indent = _leading(line_before)
    if rest_of_line.strip():
        closer_at = first_unmatched_closer(rest_of_line)
        closer = None if closer_at is None else rest_of_line[closer_at]
        return _finish_expression(text, as_kind("expression", indent, closer, 4 if closer else 1),
                                  line_before, rest_of_line)
    if line_before.strip():
        if line_before.rstrip().endswith(PLAIN_OPENERS):
            following = next((line for line in suffix.split("\n")[1:] if line.strip()), "")
            if _indent_width(following) > _indent_width(line_before):
                body_indent = _leading(following)  # the body is there: new lines on top of it
            else:
                body_indent = indent + ("\t" if indent.startswith("\t") else "    ")
            if text.startswith("\n") or first_unmatched_closer(text.split("\n", 1)[0]) is None:
                return _finish_lines(text, as_kind("block", body_indent, max_lines=MAX_PLAIN_BODY_LINES),
                                     line_before, suffix, "plaintext"), 0
        return _finish_line(text, as_kind("line", indent), line_before, suffix), 0
    previous = next((line for line in reversed(prefix.split("\n")[-8:-1]) if line.strip()), "")
    # A body's first line: after an opener, or indented deeper than the code line before it (the
    # body of `if x:`, `then`, `do`: the editor indented it). Else statements among siblings,
    # capped as a grammar's statement hole: the stops above end them, not the 8-line cap.
    opened = previous.rstrip().endswith(PLAIN_OPENERS) or _indent_width(line_before) > _indent_width(previous)
    body = as_kind("statement", line_before, max_lines=MAX_PLAIN_BODY_LINES if opened else MAX_PLAIN_STATEMENT_LINES)
    return _finish_lines(text, body, line_before, suffix, "plaintext"), 0


# --- repetition ---------------------------------------------------------------------------


def _strip_repeated_prefix(text: str, prefix: str, line_before: str, rest_of_line: str = "") -> str:
    """Drop a copy of the cursor line's prefix, or of the last lines before it, at the text's start.

    Not where a line of openers balances its brackets only with the copy kept: after a lone `[`, the answer
    `[bin]]` is TOML's `[[bin]]` (kept), `[package]` a copy of the `[` (dropped)."""
    stripped_before = line_before.strip()
    if "\n" not in prefix and len(line_before) >= _LONG_LINE_CUT:
        # The context cut the cursor's line (a 7,000-character list): a copy of the whole line
        # ends with what the context kept of it.
        at = text.find(line_before)
        if at > 0 and "\n" not in text[:at]:
            return text[at + len(line_before):]
    if stripped_before:
        if text.startswith(line_before):
            if _balances_only_kept(line_before, text, len(line_before), rest_of_line):
                return text
            if len(stripped_before) < 3 and not text[len(line_before):].strip():
                return text  # `}|` answered `}` (a `}}` line): a short closer is the answer, not a copy
            return text[len(line_before):]
        body = text.lstrip(" \t")
        if body.startswith(stripped_before):
            after = body[len(stripped_before):]
            joins_word = _IDENT.match(stripped_before[-1]) and after[:1] and _IDENT.match(after[0])
            if not joins_word and len(stripped_before) >= 2 and \
                    not _balances_only_kept(line_before, body, len(stripped_before), rest_of_line):
                return after.lstrip(" \t") if line_before.endswith((" ", "\t")) else after
    # Last few code lines of the prefix repeated at the start (models restate context).
    raw_previous = [line.rstrip() for line in prefix.split("\n")[-6:-1] if line.strip()]
    previous = [line.strip() for line in raw_previous]
    text_lines = text.split("\n")
    for count in range(len(previous), 0, -1):
        tail = previous[-count:]
        if len(text_lines) <= count:
            continue
        # A short line (`}`, `*/`) is repeated only when copied with its indentation.
        if sum(len(line) for line in tail) < 6 and not (count == 1 and text_lines[0].rstrip() == raw_previous[-1]):
            continue
        head = [line.strip() for line in text_lines[:count]]
        if head == tail:
            rest = text_lines[count:]
            if stripped_before and rest and rest[0].lstrip().startswith(stripped_before):
                rest[0] = rest[0].lstrip()[len(stripped_before):]
            return "\n".join(rest)
    return text


def _balances_only_kept(line_before: str, text: str, copy_chars: int, rest_of_line: str) -> bool:
    """Whether the cursor's line, openers only before the cursor (`[`, `  ({`), balances its
    brackets with the text's first `copy_chars` kept and not with them dropped: then they are the
    answer, not a copy of the line (a one-line answer is read with the rest of the line, whose
    closers it may need). Only there: a line with more before the cursor often continues brackets
    opened on the lines above, and a copy of its text is a copy."""
    if not all(c in OPENERS for c in line_before.strip()):
        return False
    first = text.split("\n", 1)[0]
    tail = rest_of_line if "\n" not in text else ""
    return balanced(line_before + first + tail) and not balanced(line_before + first[copy_chars:] + tail)


def _cut_degenerate(text: str) -> str:
    """Empty for output that is one short pattern repeated; otherwise cut where a long repeat begins."""
    compact = re.sub(r"\s+", "", text)
    whole = _DEGENERATE_WHOLE.fullmatch(compact)
    if compact and whole is not None:
        return ""
    lines = text.split("\n")
    for i in range(len(lines) - 4):
        # Five equal lines in a row: three (`any,` in a type's arguments) are code often enough.
        line = lines[i].strip()
        if len(line) >= 3 and all(lines[i + k].strip() == line for k in range(1, 5)):
            text = "\n".join(lines[: i + 1])
            break
    pos = 0
    while (run := _REPEATED_RUN.search(text, pos)) is not None:
        unit = run.group(1)
        rest = text[run.end():]
        # A loop runs to the end of the text (the budget stops it, maybe mid-copy); a run that
        # stops and gives way to other text is data unless it is long (a word list's `, Vajnorská`
        # nine times in a YAML flow sequence).
        looped = unit.startswith(rest.rstrip()) or len(run.group(0)) >= _LOOP_COPIES * len(unit)
        if unit.strip() and looped:
            return text[: run.start() + len(unit)]
        # Whitespace repeated is indentation (16 spaces are "  " eight times), not a loop.
        pos = run.end()
    return text


# --- brackets and indentation -------------------------------------------------------------


def _first_closer_after(line_before: str, text: str) -> int | None:
    """The first closer in `text` that closes nothing `text` opens, reading `text` after the
    cursor's line (a quote opened before the cursor closes in `text`)."""
    at = first_unmatched_closer(line_before + text, start=len(line_before))
    return None if at is None else at - len(line_before)


def _in_quote(line_before: str) -> bool:
    """Whether the cursor's line leaves a quote open (or a comment) at the cursor."""
    sentinel = len(line_before)
    return all(i != sentinel for i, _ in code_chars(line_before + "("))


_LUA_KEYWORD = re.compile(r"\b(function|if|do|repeat|end|until|elseif|else)\b")


def _lua_depth_walk(line: str, depth: int) -> tuple[int, bool]:
    """Lua block depth after `line`, and whether the line ends or continues an outer block
    (`end`/`until` below depth 0, or `else`/`elseif` at depth 0): the hole's block is over."""
    code_at = {i for i, _ in code_chars(line)}
    code = "".join(c if i in code_at else " " for i, c in enumerate(line))
    for match in _LUA_KEYWORD.finditer(code):
        word = match.group(1)
        if word in ("else", "elseif") and depth == 0:
            return depth, True
        if word in ("end", "until"):
            depth -= 1
            if depth < 0:
                return depth, True
        elif word in ("function", "if", "repeat", "do"):
            # `for`/`while` open their block at `do`; `elseif`/`else` continue one.
            depth += 1
    return depth, False


def _first_unescaped(text: str, quote: str) -> int | None:
    i = 0
    while i < len(text):
        if text[i] == "\\":
            i += 2
            continue
        if text.startswith(quote, i):
            return i
        i += 1
    return None


def _cap_balanced(lines: list[str], max_lines: int) -> str:
    kept: list[str] = []
    depth = 0
    for line in lines:
        kept.append(line)
        depth += depth_change(line)
        if depth <= 0 or len(kept) >= max_lines:
            break
    return "\n".join(kept)


def _drop_closer_suffix_has(text: str, suffix: str, line_before: str) -> str:
    """Cut the text before a closer it does not open when the suffix starts with that closer:
    on the cursor's line, or on the next line at the cursor line's indentation (where a
    formatter puts the closer of a bracket the cursor's line opened; a closer indented
    less closes an outer block, which the text's closer does not)."""
    rest, _, later = suffix.partition("\n")
    upcoming = rest.strip()[:1]
    if not upcoming:
        next_line = next((line for line in later.split("\n") if line.strip()), "")
        if _leading(next_line) == _leading(line_before):
            upcoming = next_line.strip()[:1]
    at = first_unmatched_closer(text)
    return text[:at].rstrip() if at is not None and text[at] == upcoming else text


def _leading(line: str) -> str:
    return line[: len(line) - len(line.lstrip(" \t"))]


def _indent_width(line: str) -> int:
    width = 0
    for c in line:
        if c == " ":
            width += 1
        elif c == "\t":
            width += 4
        else:
            break
    return width


def _rebase(lines: list[str], indent: str, *, first_at_cursor: bool, opens: bool | None = None,
            scoped_by_indent: bool = False) -> list[str]:
    """Re-indent lines so their base indentation is `indent`, keeping relative indentation,
    and drop everything from the first line that dedents below the base (the block ended).

    The base is the first line's indentation. When the cursor already sits at the
    indentation and the model wrote its first line flush left but the following lines at
    the document's indentation, it wrote in document coordinates: the base is `indent`.
    `scoped_by_indent` (languages.INDENT_SCOPED): the following lines are in document
    coordinates, as the models are trained to write them (engine/training/examples.py: the
    middle keeps each line's own indentation), so a flush line after a flush first line is
    past the block (`total += x` / `print(total)` in a loop's body), not a sibling of it.
    """
    target = _indent_width(indent)
    first_width = _indent_width(lines[0])
    second = next((_indent_width(line) for line in lines[1:] if line.strip() and not _is_directive(line)), None)
    if opens is None:  # the language did not say (block_words.answer_opens): the line's end does
        opens = lines[0].rstrip().endswith((":", "{", "(", "[", " then", " do", "=>"))
    base = first_width
    if first_at_cursor and first_width == 0 and target > 0 and second is not None:
        # Indented later lines after a flush first line: document coordinates (a later line
        # left of the cursor is then a dedent). After an opener, only deeper than the cursor.
        # A flush line after a blank one starts a new top-level chunk: document coordinates too.
        if scoped_by_indent:
            # Relative only where document coordinates give an opener an empty body: its next
            # line indented, but no deeper than the cursor (`if x:` / `    y = 1`).
            document = not (opens and 0 < second <= target)
        else:
            document = second > target if opens else second > 0
        if document or _flush_after_blank(lines):
            base = target
    # Tabs where the cursor's block has them, or (at the top level) where the text has them.
    tabbed = indent.startswith("\t") or (not indent and any(line.startswith("\t") for line in lines[1:]))
    unit = "\t" if tabbed else " "
    out = []
    for index, line in enumerate(lines):
        if not line.strip():
            out.append("")
            continue
        width = first_width if index == 0 else _indent_width(line)
        if _is_directive(line):
            out.append(line.lstrip(" \t"))  # `#if` / `#endif` inside a body: at column 0 as written
            continue
        if index > 0 and width < base:
            break
        extra = max(0, width - base) if index > 0 else 0
        relative = "\t" * (extra // 4) if unit == "\t" else " " * extra
        out.append(indent + relative + line.lstrip(" \t"))
    return out


_DIRECTIVE = re.compile(r"#\s*(if|ifdef|ifndef|elif|else|endif|define|undef|pragma|include|error|warning)\b")


def _is_directive(line: str) -> bool:
    """A C preprocessor line, which sits at column 0 inside any body."""
    return line.startswith("#") and _DIRECTIVE.match(line) is not None


def _is_comment(line: str) -> bool:
    """A line of comment only (`*` lines of a block comment included), in any of our languages."""
    stripped = line.lstrip()
    if stripped.startswith("#"):  # not `#[attr]` (Rust) nor `#include` (C)
        return not (stripped[1:2].isalnum() or stripped[1:2] == "[")
    if stripped.startswith("*"):  # a block comment's `* text` or `*/`, not `*p = x;`
        return stripped[1:2] in ("", " ", "/", "\t")
    return stripped.startswith(("//", "/*", "--"))


def _deeper_line_follows(suffix: str, line_before: str) -> bool:
    """Whether the suffix's next non-blank line is indented deeper than the cursor's line."""
    for line in suffix.split("\n")[1:]:
        if line.strip():
            return _indent_width(line) > _indent_width(line_before)
    return False


_WORD_BLOCK_LANGUAGES = frozenset({"ruby", "lua", "bash"})
_COMPLETE_HEADER_WORDS = frozenset({"do", "then", "else", "begin", "ensure", "end", "in"})
_ARGUMENT_WORDS = frozenset({"rescue", "when", "elsif", "elseif", "if", "unless", "while", "until", "def",
                             "class", "module", "case", "for", "function", "local", "return"})
_LAST_WORD = re.compile(r"(\w+)\s*$")


def _header_unfinished(language: str, line_before: str) -> bool:
    """Whether a block opener's line stops mid-way at the cursor (a language whose blocks open with
    words): it ends in a name or an operator (`def mkintpath`, `Errno::`), not an opening word, or
    in a space after a word that takes an argument (`rescue `)."""
    if language not in _WORD_BLOCK_LANGUAGES:
        return False
    word = _LAST_WORD.search(line_before)
    if line_before.endswith((" ", "\t")):
        return word is not None and word.group(1) in _ARGUMENT_WORDS
    if word is not None:
        return word.group(1) not in _COMPLETE_HEADER_WORDS
    return line_before.rstrip().endswith(("::", ".", ",", "(", "[", "=", "<"))


def _is_suffix_start(lines: list[str], index: int, suffix: str, same_indent: bool = False) -> bool:
    """Whether the text from `lines[index]` on starts as the suffix's next statement does: the
    model ran on into the code after the hole. Two lines must match when the text has two, and
    a lone line must say something (a `}` or `/**` line is in every file, not the suffix's).
    `same_indent` (plain text, where no grammar says what a line closes): the line must also stand
    at the suffix line's indentation (`\tend` in the answer is not the suffix's `end`)."""
    if same_indent:
        ahead_line = next((line for line in suffix.split("\n")[1:] if line.strip()), None)
        if ahead_line is not None and _indent_width(ahead_line) != _indent_width(lines[index]):
            return False
    rest = [line.strip() for line in lines[index:] if line.strip()]
    following = [line.strip() for line in suffix.split("\n")[1:] if line.strip()][:len(rest)]
    if len(following) == len(rest) and rest[:-1] == following[:-1] and following[-1].startswith(rest[-1]) \
            and any(_IDENT.search(line) for line in rest):
        return True  # all that is left of the text is the suffix's start (comments too)
    if _is_comment(lines[index]):
        return False
    ahead = [line.strip() for line in suffix.split("\n")[1:] if line.strip() and not _is_comment(line)][:2]
    mine = [line.strip() for line in lines[index:] if line.strip() and not _is_comment(line)][:2]
    if not ahead or not mine or mine[0] != ahead[0]:
        return False
    if len(mine) == 2 and len(ahead) == 2:
        return mine[1] == ahead[1]
    return len(mine[0]) >= 4 and _IDENT.search(mine[0]) is not None


def _flush_after_blank(lines: list[str]) -> bool:
    """Whether a later line at column 0 follows a blank line."""
    return any(not lines[i - 1].strip() and lines[i].strip() and _indent_width(lines[i]) == 0
               for i in range(2, len(lines)))


def _first_code_line(suffix: str) -> str:
    """The suffix's first non-blank line after the cursor's line, stripped."""
    for line in suffix.split("\n")[1:]:
        if line.strip():
            return line.strip()
    return ""
