"""Definitions the editor's other language servers found: which names to ask about, and what the prompt shows.

Our VS Code extension and Neovim plugin answer the server's `dgemma/definitions` request by
asking the editor's own definition providers (Pylance, tsserver, gopls, ...), which resolve
what the workspace index cannot: types through inference, third-party packages, generated code.
This module owns the model-free parts of that source (the request itself lives in
server/editor_definitions.py):

- `names_near`: the names the editor is asked about: identifiers of the lines around the
  cursor's line, *never the cursor's line itself* (typing there must not change the question,
  nor the snippets, so the prompt's stable part keeps its cache); calls, attributes and
  capitalised names first, nearest first; keywords and builtins are not asked about;
- `header_of`: of the lines the editor sent from a definition's first line, the signature or
  header only (a body is never shown);
- `choose`: the snippets (source "editor") that fit the cross-file budget left after the other
  sources, none in the current file (the window shows it) and none overlapping a snippet already
  chosen (the workspace index often finds the same definition).

Knows the engine's snippet type; knows nothing of LSP, editors or tree-sitter. Lines are 0-based.
"""

from __future__ import annotations

import builtins
import functools
import keyword
import os
import re
from collections.abc import Callable, Iterable, Sequence

import msgspec

from ..api import CrossFileSnippet
from .gather import heading_tokens, shown_path, snippet_tokens

LINES_BEFORE = 15
LINES_AFTER = 5
"""Lines above and below the cursor's line whose names the editor is asked about."""
MAX_NAMES = 12
"""Names asked about per cursor line (the editor runs one definition request per name)."""
DEFINITION_LINES = 4
"""Lines the editor sends from each definition's first line (a multi-line signature fits)."""
MAX_LINE_CHARS = 240
"""A longer line of a definition is cut (minified or generated code)."""

_CHAIN = re.compile(r"[A-Za-z_$][\w$]*(?:\s*\.\s*[A-Za-z_$][\w$]*)*")
_NAME = re.compile(r"[A-Za-z_$][\w$]*")
_DEFINED = re.compile(r"\b(?:def|class|function|func|fn|struct|interface|type|enum|trait|impl)\s+([A-Za-z_$])")
_CALL = re.compile(r"\s*\(")
_CONTINUED = (",", "\\", "(", "[", "{", "=", "|", "&", "+", "->")
_HEADER_END = re.compile(r"(?::|\{|;|=>|\bthen|\bdo)\s*(?:#.*|//.*)?$")

_RECEIVERS = {"self", "cls", "this"}
_COMMON = {"self", "cls", "this", "super", "true", "false", "null", "nil", "none", "undefined", "None", "True",
           "False"}
_KEYWORDS = {
    "python": set(keyword.kwlist) | set(getattr(keyword, "softkwlist", ())) | set(dir(builtins)),
    "javascript": {
        "break", "case", "catch", "class", "const", "continue", "debugger", "default", "delete", "do", "else",
        "export", "extends", "finally", "for", "function", "if", "import", "in", "instanceof", "let", "new",
        "return", "switch", "throw", "try", "typeof", "var", "void", "while", "with", "yield", "async", "await",
        "of", "static", "get", "set", "from", "as", "console", "Math", "JSON", "Object", "Array", "String",
        "Number", "Boolean", "Promise", "Error", "Map", "Set", "Date", "RegExp", "Symbol", "window", "document",
        "require", "module", "exports", "type", "interface", "enum", "implements", "private", "public",
        "protected", "readonly", "declare", "namespace", "keyof", "infer", "is", "any", "unknown", "never",
        "string", "number", "boolean", "object", "bigint", "abstract", "constructor",
    },
    "go": {
        "break", "case", "chan", "const", "continue", "default", "defer", "else", "fallthrough", "for", "func",
        "go", "goto", "if", "import", "interface", "map", "package", "range", "return", "select", "struct",
        "switch", "type", "var", "len", "cap", "make", "new", "append", "copy", "delete", "panic", "recover",
        "print", "println", "string", "int", "int64", "int32", "uint", "byte", "rune", "bool", "float64",
        "error", "any", "iota",
    },
}
_KEYWORDS["typescript"] = _KEYWORDS["tsx"] = _KEYWORDS["javascript"]
_GENERIC = {
    "if", "else", "for", "while", "do", "return", "break", "continue", "switch", "case", "default", "class",
    "struct", "enum", "const", "static", "void", "int", "char", "long", "float", "double", "bool", "new",
    "delete", "try", "catch", "throw", "public", "private", "protected", "fn", "let", "mut", "pub", "use", "mod",
    "impl", "match", "import", "package", "function", "local", "end", "then", "not", "and", "or",
}


_SKIP = {language: frozenset(_COMMON | words) for language, words in _KEYWORDS.items()}
_SKIP_GENERIC = frozenset(_COMMON | _GENERIC)


_tokens = functools.lru_cache(maxsize=4096)(snippet_tokens)
"""Memoized: the same definitions are placed again at every keystroke."""


class NearName(msgspec.Struct, frozen=True):
    """A name near the cursor the editor is asked to resolve, at its occurrence nearest the cursor."""

    key: str
    """The name with what it is reached through (`invoice.total`), as the answers are remembered."""
    line: int
    column: int
    """Of the name's first character, in str characters of its line."""


class EditorDefinition(msgspec.Struct, frozen=True):
    """One definition the editor found for a name: where it is and its header lines."""

    path: str
    """Absolute path of the defining file."""
    start_line: int
    end_line: int
    """Lines [start_line, end_line) that `text` shows."""
    text: str


def names_near(lines: Sequence[str], first_line: int, cursor_line: int, language: str,
               defined_here: Iterable[str] = ()) -> list[NearName]:
    """The names to ask about, best first: `lines` are the document's lines from `first_line` on.

    Only lines LINES_BEFORE above to LINES_AFTER below the cursor's line count, the cursor's line
    excluded. A call (`name(`), an attribute (`x.name`) or a capitalised name (a type) ranks before
    a plain name (often a local variable); within each, the nearer to the cursor the better.
    """
    skip = _SKIP.get(language, _SKIP_GENERIC)
    if defined_here:
        skip = skip | set(defined_here)
    best: dict[str, tuple[tuple[int, int], NearName]] = {}
    for index, text in enumerate(lines):
        line = first_line + index
        if line == cursor_line or not cursor_line - LINES_BEFORE <= line <= cursor_line + LINES_AFTER:
            continue
        text = _without_strings_and_comments(text, language)
        distance = cursor_line - line if line < cursor_line else line - cursor_line + 1
        defined = {match.start(1) for match in _DEFINED.finditer(text)}
        for chain in _CHAIN.finditer(text):
            if chain.start() in defined:
                continue  # `def name(`, `class Name`: defined right here, the window shows it
            parts = list(_NAME.finditer(chain.group()))
            called = _CALL.match(text, chain.end()) is not None
            prefix = ""
            for position, part in enumerate(parts):
                name = part.group()
                key = prefix + name
                prefix = key + "."
                if position == 0 and name in skip and name not in _RECEIVERS:
                    break  # `len(x).y`, `super().f`: what a builtin or keyword reaches needs no editor
                if len(name) < 2 or name in _RECEIVERS:
                    continue  # `self.`, `m.`: the receiver alone says nothing, what it reaches does
                last = position == len(parts) - 1
                strong = position > 0 or (last and called) or name[0].isupper()
                rank = (0 if strong else 1, distance)
                found = best.get(key)
                if found is None or rank < found[0]:
                    best[key] = (rank, NearName(key, line, chain.start() + part.start()))
    ordered = sorted(best.values(), key=lambda item: (item[0], item[1].line, item[1].column))
    return [name for _rank, name in ordered[:MAX_NAMES]]


def _without_strings_and_comments(text: str, language: str) -> str:
    """The line with string literals and a trailing comment blanked (same length, so columns hold)."""
    def blank(match: re.Match) -> str:
        return " " * len(match.group())

    text = re.sub(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|`(?:[^`\\]|\\.)*`", blank, text)
    mark = "#" if language in ("python", "ruby", "bash") else "--" if language == "lua" else "//"
    at = text.find(mark)
    return text if at < 0 else text[:at] + " " * (len(text) - at)


def header_of(text: str) -> str:
    """The definition's signature or header from the lines the editor sent (a body is never shown):
    lines up to the first that ends a header (`:`, `{`, `;`, `=>`), at most DEFINITION_LINES."""
    kept: list[str] = []
    for line in text.split("\n")[:DEFINITION_LINES]:
        line = line.rstrip()[:MAX_LINE_CHARS]
        if not kept and not line.strip():
            continue  # the editor pointed at a blank line: nothing of the definition there
        kept.append(line)
        so_far = "\n".join(kept)
        balanced = all(so_far.count(a) <= so_far.count(b) for a, b in ("()", "[]"))
        if _HEADER_END.search(line) or (balanced and not line.endswith(_CONTINUED)):
            break
    while kept and not kept[-1].strip():
        kept.pop()
    return "\n".join(kept)


def choose(found: Sequence[tuple[str, tuple[EditorDefinition, ...]]], chosen: tuple[CrossFileSnippet, ...],
           budget: int, current_path: str, relative: Callable[[str], str]) -> tuple[CrossFileSnippet, ...]:
    """Snippets of the editor's definitions that fit what `chosen` left of `budget`.

    `found`: (name, its definitions) best name first. None in `current_path` (the window shows the
    file), none overlapping a snippet of `chosen` or another definition picked here; a file's
    heading is counted once."""
    shown: dict[str, list[tuple[int, int]]] = {}
    left = budget
    for snippet in chosen:
        if snippet.path not in shown:
            left -= heading_tokens(snippet.heading)
        shown.setdefault(snippet.path, []).append((snippet.start_line, snippet.end_line))
        left -= snippet.tokens
    current = os.path.abspath(current_path) if current_path else ""
    current_shown = relative(current) if current else ""
    picked: list[CrossFileSnippet] = []
    for rank, (_name, definitions) in enumerate(found):
        for definition in definitions:
            path = relative(definition.path)
            if definition.path == current or path == current_shown or not definition.text.strip() or any(
                    definition.start_line < end and start < definition.end_line for start, end in shown.get(path, ())):
                continue
            tokens = _tokens(definition.text)
            heading = shown_path(path, current_shown)
            cost = tokens + (0 if path in shown else heading_tokens(heading))
            if cost > left:
                continue
            left -= cost
            shown.setdefault(path, []).append((definition.start_line, definition.end_line))
            picked.append(CrossFileSnippet(path=path, start_line=definition.start_line, end_line=definition.end_line,
                                           source="editor", score=round(1.0 / (1 + rank), 3), tokens=tokens,
                                           text=definition.text, shown_path=heading))
    return tuple(picked)
