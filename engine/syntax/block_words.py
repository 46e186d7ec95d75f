"""Where a block ends in a model's raw text, for the languages that close blocks with words or tags.

Ruby closes with `end`, Bash with `fi`/`done`/`esac`, HTML with an end tag: bracket
depth alone does not see a model write past the body it was asked for (`return a\\nend`
ends the hole's block at `end`). Each walker takes one line and the depth so far (blocks
the answer itself opened) and returns the new depth and whether the line closes or
continues a block opened before the hole (depth below zero, or `else`/`elsif`/`elif`/
`when`/`rescue` at depth zero): post-processing stops there. Lua's walker lives in
postprocess, where it was first. A rough lexer on purpose: it reads model output line
by line with no tree (the text is not in the document yet); words inside strings and
comments are skipped, a Ruby statement modifier (`return x if y`) does not open a block.
Knows nothing of trees, plans or LSP.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from .brackets import code_chars

BlockWalker = Callable[[str, int], tuple[int, bool]]

_RUBY_WORD = re.compile(r"(?<![.:\w$@])(def|class|module|if|unless|while|until|for|case|begin|do|end|"
                        r"else|elsif|when|rescue|ensure)(?![\w?!])")
_RUBY_MODIFIABLE = frozenset({"if", "unless", "while", "until", "rescue"})
"""Words that open a block only at the start of a statement; elsewhere they are modifiers."""
_STATEMENT_START = re.compile(r"(^|[;=(|&]|\bthen|\bdo|\breturn|\bnot)\s*$")


def _code_only(line: str) -> str:
    """The line with strings and comments blanked out (same length)."""
    keep = {i for i, _ in code_chars(line)}
    return "".join(c if i in keep else " " for i, c in enumerate(line))


def ruby_depth_walk(line: str, depth: int) -> tuple[int, bool]:
    code = _code_only(bracket_view("ruby", line))
    opened_by_loop = False
    for match in _RUBY_WORD.finditer(code):
        word = match.group(1)
        if word in ("else", "elsif", "when", "rescue", "ensure") and depth == 0:
            if word != "rescue" or _STATEMENT_START.search(code[: match.start()]):
                return depth, True
        if word == "end":
            depth -= 1
            if depth < 0:
                return depth, True
        elif word in _RUBY_MODIFIABLE:
            if word != "rescue" and _STATEMENT_START.search(code[: match.start()]):
                depth += 1
                opened_by_loop = word in ("while", "until")
        elif word == "do":
            # `while x do` opens one block, not two.
            if not opened_by_loop:
                depth += 1
        elif word in ("def", "class", "module", "case", "begin", "for"):
            if word == "def" and re.match(r"\s*[\w.?!]+(\([^)]*\))?\s*=(?!=)", code[match.end():]):
                continue  # an endless method, `def f(x) = x + 1`
            depth += 1
            opened_by_loop = word == "for"
    return depth, False


_BASH_WORD = re.compile(r"(?<![\w$-])(if|fi|case|esac|for|while|until|do|done|elif|else|select)(?![\w-])")
_BASH_COMMAND_START = re.compile(r"(^|[;&|(]|\bthen|\bdo|\belse|\{)\s*$")


_BASH_ITEM_END = re.compile(r";;&?|;&")


def bash_depth_walk(line: str, depth: int) -> tuple[int, bool]:
    """Reserved words, and case items: a pattern line (`--host)`) opens one, its `;;` closes it;
    a `;;` that closes none ends the case item the hole is in (the suffix has it)."""
    code = _code_only(bracket_view("bash", line))
    if _is_case_pattern(line):
        depth += 1
    for _ in _BASH_ITEM_END.finditer(code):
        depth -= 1
        if depth < 0:
            return depth, True
    for match in _BASH_WORD.finditer(code):
        word = match.group(1)
        if not _BASH_COMMAND_START.search(code[: match.start()]):
            continue  # an argument (`echo done`), not a reserved word
        if word in ("elif", "else") and depth == 0:
            return depth, True
        if word in ("fi", "esac", "done"):
            depth -= 1
            if depth < 0:
                return depth, True
        elif word in ("if", "case", "do"):
            # Loops open at `do` (`for`/`while`/`until` header first), closing at `done`.
            depth += 1
    return depth, False


_HTML_TAG = re.compile(r"<(/?)([A-Za-z][\w:.-]*)\b[^<>]*?(/?)(?:>|$)|<!--.*?-->")
"""A tag, or the start of one that goes on over the next lines (its `>` not on this line)."""
_HTML_TAG_END = re.compile(r"^[^<]*?(/?)>")
"""The end of a tag begun on an earlier line: `/>` undoes the depth its start added."""
_HTML_VOID = frozenset({"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source",
                        "track", "wbr"})


def html_depth_walk(line: str, depth: int) -> tuple[int, bool]:
    # Not `code_chars`: an apostrophe in text (`don't`) is no string delimiter in HTML.
    end = _HTML_TAG_END.match(line)
    if end is not None and end.group(1) and depth > 0:
        depth -= 1  # `/>` of a multi-line self-closing tag (`<path\n  d="..."\n/>`)
    for match in _HTML_TAG.finditer(line):
        closing, name, self_closing = match.group(1), match.group(2), match.group(3)
        if name is None or self_closing or name.lower() in _HTML_VOID:
            continue
        if closing:
            depth -= 1
            if depth < 0:
                return depth, True
        else:
            depth += 1
    return depth, False


_WALKERS: dict[str, BlockWalker] = {"ruby": ruby_depth_walk, "bash": bash_depth_walk, "html": html_depth_walk}


def block_end_walker(language: str) -> BlockWalker | None:
    """The walker of a language that closes blocks with words or tags; None where brackets do."""
    return _WALKERS.get(language)


def answer_opens(language: str, lines: list[str]) -> bool | None:
    """Whether the answer's first line opens a block, where its last character does not say so
    (`if x`, `<div>`), or None to let the line's end decide (`:`, `{`). False for YAML's compact
    sequence: `key:` followed by `- item` at the same indentation opens nothing deeper."""
    if language == "yaml":
        following = next((line for line in lines[1:] if line.strip()), "")
        if lines[0].rstrip().endswith(":") and following.lstrip().startswith("- "):
            return False
        return None
    walk = block_end_walker(language)
    if language == "bash" and _is_case_pattern(lines[0]):
        return None  # a case item's body keeps the answer's own indentation
    return True if walk is not None and walk(lines[0], 0)[0] > 0 else None


_EXTGLOB = re.compile(r"[?*+@!]\([^()]*\)")
_BASH_CASE_PATTERN = re.compile(r"^\s*\(?(?:[^()\s;]|[?*+@!]\([^()]*\))(?:[^();]|[?*+@!]\([^()]*\))*\)")
"""`--host|-H)` / `*)` / `-!(-*)[vh])`: a case item's pattern (extglob groups in it); its last `)`
closes no bracket."""
def _is_case_pattern(line: str) -> bool:
    match = _BASH_CASE_PATTERN.match(line)
    return match is not None and "(" not in _EXTGLOB.sub("", match.group(0)).lstrip()[1:]


_NO_DASH_COMMENTS = frozenset({"bash", "css", "csharp", "php", "kotlin", "swift", "scala", "ruby"})
"""Languages where `--` is an operator, a flag or a custom property, never a comment."""
_HASH_IN_WORD = re.compile(r"(?<=\S)#")
_APOSTROPHE = re.compile(r"(?<=[^\W\d_])'(?=[^\W\d_])")
"""An apostrophe in a word (`I'm`, `don't`): HTML's text, not a quote."""
_SCALA_SYMBOL = re.compile(r"'(?=[A-Za-z_]\w*(?![\w']))")
"""Scala's symbol literal (`'t`, `@deprecatedName('t)`): a quote that opens nothing (`'a'` is a char)."""


def bracket_view(language: str, line: str) -> str:
    """The line as the shared bracket lexer (`brackets.code_chars`, which takes `#`, `//` and `--`
    for comments in every language) should read it, same length: Bash's case-pattern `)`, `$#`/
    `${#x}` and `--flag`, CSS's `#id`/`#fff`, `--var` and `//` in URLs, Scala's `'symbol`, HTML's
    `I'm` and `i--` blanked."""
    if language in _NO_DASH_COMMENTS:
        line = line.replace("--", "  ")
    if language == "bash":
        line = _HASH_IN_WORD.sub(" ", line)
        match = _BASH_CASE_PATTERN.match(line)
        if _is_case_pattern(line):
            line = line[: match.end() - 1] + " " + line[match.end():]
    elif language == "css":
        line = line.replace("#", " ").replace("//", "  ")
    elif language == "scala":
        line = _SCALA_SYMBOL.sub(" ", line)
    elif language == "html":
        line = _APOSTROPHE.sub(" ", line)
    return line
