"""Plans the hole at the cursor with tree-sitter: what kind of infill, how far it may reach.

Kinds (HolePlan.kind) and their stop rules:
- block (`end-of-block`): the cursor is on an empty line of a body with no statements yet
  (or at the end of a block opener line such as `def f():` / `if (x) {` whose body is
  empty); the infill may write the whole body.
- expression (`before-closer`): the cursor is inside a bracket or string whose closer is
  right of it on the same line; the infill stops before that closer. When other text
  (not a closer) follows the cursor on its line, the kind is also expression, with stop
  `before-rest-of-line` and no closer: the infill fills the gap in the line.
- line (`end-of-line`): text before the cursor, only whitespace after it, and the line is
  not a block opener (or the cursor is in its trailing comment); the infill finishes the line
  (more lines only for open brackets).
- statement (`before-next-statement`): a blank line among existing statements; one or more
  statements at the cursor's indentation, stopping before the suffix's next statement.
- text (`max-lines`): plaintext or no grammar.
Comment-only lines count as blank when looking for the lines around the cursor.

Knows nothing of tokens, tensors or LSP; offsets are str indices.
"""

from __future__ import annotations

import re

import tree_sitter

from ..api import HolePlan, Region
from .brackets import CLOSERS, QUOTES, first_unmatched_closer
from .document import SyntaxDocument
from .languages import BLOCK_TYPES, BRACE_BODY_TYPES, DATA_LANGUAGES, PLAINTEXT, uses_braces

MAX_LINES = {"line": 8, "expression": 4, "statement": 16, "block": 32, "text": 8}
"""Line caps per kind: a line hole grows past one line only while brackets stay open."""

_LINE_COMMENTS = {"python": ("#",), "lua": ("--",), "ruby": ("#",), "bash": ("#",), "yaml": ("#",),
                  "toml": ("#",), "php": ("//", "#", "/*", "*", "*/"), "html": ("<!--", "-->"),
                  "css": ("/*", "*/")}
_C_COMMENTS = ("//", "/*", "*", "*/")
_PY_NOT_BLOCK_COLON = frozenset({"dictionary", "pair", "slice", "lambda", "subscript", "type",
                                 "typed_parameter", "typed_default_parameter", "keyword_argument",
                                 "format_specifier", "interpolation", "dictionary_comprehension"})
_STRING_SUFFIXES = ("string", "string_literal", "char_literal", "character_literal", "rune_literal",
                    "quote_scalar", "quoted_attribute_value", "string_value")
_LUA_OPENERS = frozenset({"then", "do", "else", "repeat"})
_CLOSER_WORDS = {"": ("end", "else", "elseif", "until"),
                 "ruby": ("end", "else", "elsif", "when", "rescue", "ensure", "in"),
                 "bash": ("fi", "done", "esac", "else", "elif", ";;")}
"""First words of a line that closes (or continues) the block above it, where `}` does not."""
_BRACE_BLOCK_PARENTS_NOT = frozenset({"object", "dictionary", "initializer_list", "object_pattern",
                                      "array", "composite_literal", "literal_value", "struct_expression",
                                      "field_initializer_list", "template_substitution", "table_constructor",
                                      "jsx_expression", "object_type"})


def plan_hole(doc: SyntaxDocument, offset: int) -> HolePlan:
    """The hole at `offset` (a str index into doc.text)."""
    text = doc.text
    assert 0 <= offset <= len(text), f"offset {offset} outside document of {len(text)} chars"
    line_start = text.rfind("\n", 0, offset) + 1
    line_end = text.find("\n", offset)
    line_end = len(text) if line_end < 0 else line_end
    before = text[line_start:offset]
    after = text[offset:line_end]
    indent = _leading_ws(before if before.strip() else text[line_start:line_end])

    if doc.tree is None or doc.language == PLAINTEXT:
        return HolePlan(kind="text", region=Region(offset, offset), stop="max-lines",
                        indent=indent, max_lines=MAX_LINES["text"])

    lines = _Lines(doc, line_start, line_end)
    if after.strip():
        return _plan_inside_line(doc, offset, line_start, line_end, before, after, lines)
    if before.strip():
        return _plan_end_of_line(doc, offset, line_start, line_end, before, lines)
    return _plan_blank_line(doc, offset, line_start, line_end, before, lines)


# --- the three cursor situations ------------------------------------------------------


def _plan_inside_line(doc, offset, line_start, line_end, before, after, lines) -> HolePlan:
    """Text follows the cursor on its line: an expression hole up to a closer, or up to that text."""
    indent = _leading_ws(doc.text[line_start:line_end])
    quote = _string_closer(doc, offset)
    if quote is not None:
        closer_at, closer = quote
        return HolePlan(kind="expression", region=Region(offset, closer_at), stop="before-closer",
                        indent=indent, max_lines=1, closer=closer)
    closer_at = first_unmatched_closer(after)
    if closer_at is not None:
        closer = after[closer_at]
        at = offset + closer_at
        if closer == "}" and before.rstrip().endswith("{") and not after[:closer_at].strip() \
                and _brace_is_block(doc, at):
            # `if (x) {|}`: an auto-closed block; the body goes on its own lines before the `}`.
            return HolePlan(kind="block", region=Region(offset, at), stop="end-of-block",
                            indent=indent + lines.unit, max_lines=MAX_LINES["block"], closer="}")
        return HolePlan(kind="expression", region=Region(offset, at), stop="before-closer",
                        indent=indent, max_lines=MAX_LINES["expression"], closer=closer)
    rest = len(after.rstrip())
    return HolePlan(kind="expression", region=Region(offset, offset + rest), stop="before-rest-of-line",
                    indent=indent, max_lines=1)


def _plan_end_of_line(doc, offset, line_start, line_end, before, lines) -> HolePlan:
    """Code before the cursor, nothing after: finish the line, or open the body of a block opener."""
    indent = _leading_ws(before)
    row = lines.row
    if not _in_comment(doc, offset) and _opens_block(doc, lines, row, brackets=False):
        next_row = lines.next_code_row(row)
        if next_row is not None and len(lines.indent_of(next_row)) > len(indent):
            body_indent = lines.indent_of(next_row)
            return HolePlan(kind="statement", region=Region(offset, offset), stop="before-next-statement",
                            indent=body_indent, max_lines=MAX_LINES["statement"])
        return HolePlan(kind="block", region=Region(offset, offset), stop="end-of-block",
                        indent=indent + lines.unit, max_lines=MAX_LINES["block"])
    return HolePlan(kind="line", region=Region(offset, line_end), stop="end-of-line",
                    indent=indent, max_lines=MAX_LINES["line"])


def _plan_blank_line(doc, offset, line_start, line_end, before, lines) -> HolePlan:
    """Only whitespace on the cursor's line: a new body, or new statements among others."""
    row = lines.row
    prev_row = lines.prev_code_row(row)
    next_row = lines.next_code_row(row)
    region_end = lines.blank_run_end(row)
    region = Region(offset, max(offset, region_end))
    if prev_row is not None and _opens_block(doc, lines, prev_row, brackets=True):
        header_indent = lines.indent_of(_header_row(doc, lines, prev_row))
        if before and (len(before) > len(header_indent) or (doc.language == "yaml" and before == header_indent)):
            body_indent = before  # (YAML: `key:` then `- item` at the key's indentation is a sequence)
        else:
            body_indent = header_indent + lines.unit
        body_has_code = next_row is not None and len(lines.indent_of(next_row)) > len(header_indent)
        if not body_has_code:
            return HolePlan(kind="block", region=region, stop="end-of-block", indent=body_indent,
                            max_lines=MAX_LINES["block"])
        return HolePlan(kind="statement", region=region, stop="before-next-statement",
                        indent=before or lines.indent_of(next_row), max_lines=MAX_LINES["statement"])
    if before:
        indent = before
    elif next_row is not None and not lines.is_closer_line(next_row):
        indent = lines.indent_of(next_row)
    elif prev_row is not None:
        indent = lines.indent_of(prev_row)
    else:
        indent = ""
    return HolePlan(kind="statement", region=region, stop="before-next-statement", indent=indent,
                    max_lines=MAX_LINES["statement"])


# --- lines around the cursor -----------------------------------------------------------


class _Lines:
    """Lazy access to the lines around the cursor, without splitting the whole document."""

    def __init__(self, doc: SyntaxDocument, line_start: int, line_end: int) -> None:
        self.doc = doc
        self.text = doc.text
        self.row = doc.row_of(line_start)
        self._starts: dict[int, int] = {self.row: line_start}
        self._comment_marks = _LINE_COMMENTS.get(doc.language, _C_COMMENTS)
        self.unit = _indent_unit(doc)

    def start_of(self, row: int) -> int | None:
        """Str offset where `row` starts, or None past either end."""
        if row < 0:
            return None
        known = self._starts.get(row)
        if known is not None:
            return known
        if row < self.row:
            pos = self.start_of(row + 1)
            if pos is None or pos == 0:
                return None
            start = self.text.rfind("\n", 0, pos - 1) + 1
        else:
            pos = self.start_of(row - 1)
            if pos is None:
                return None
            nl = self.text.find("\n", pos)
            if nl < 0:
                return None
            start = nl + 1
        self._starts[row] = start
        return start

    def line(self, row: int) -> str:
        start = self.start_of(row)
        assert start is not None, f"row {row} outside document"
        end = self.text.find("\n", start)
        return self.text[start:] if end < 0 else self.text[start:end]

    def indent_of(self, row: int) -> str:
        return _leading_ws(self.line(row))

    def is_code(self, row: int) -> bool:
        stripped = self.line(row).strip()
        return bool(stripped) and not stripped.startswith(self._comment_marks)

    def is_closer_line(self, row: int) -> bool:
        stripped = self.line(row).strip()
        return (stripped[:1] in CLOSERS or stripped.startswith("</")
                or stripped.split(" ")[0].rstrip(";") in _CLOSER_WORDS.get(self.doc.language, _CLOSER_WORDS[""]))

    def prev_code_row(self, row: int, limit: int = 200) -> int | None:
        for r in range(row - 1, max(-1, row - 1 - limit), -1):
            if self.start_of(r) is None:
                return None
            if self.is_code(r):
                return r
        return None

    def next_code_row(self, row: int, limit: int = 200) -> int | None:
        for r in range(row + 1, row + 1 + limit):
            if self.start_of(r) is None:
                return None
            if self.is_code(r):
                return r
        return None

    def blank_run_end(self, row: int) -> int:
        """Offset of the end of the last blank line in the run of blank lines from `row` on."""
        r = row
        while True:
            nxt = self.start_of(r + 1)
            if nxt is None or self.line(r + 1).strip():
                break
            r += 1
        start = self.start_of(r)
        end = self.text.find("\n", start)
        return len(self.text) if end < 0 else end


def _leading_ws(line: str) -> str:
    return line[: len(line) - len(line.lstrip(" \t"))]


def _indent_unit(doc: SyntaxDocument) -> str:
    """The document's indentation step, guessed from the first indented lines (cached per document)."""
    cached = doc.memo.get("indent_unit")
    if cached is not None and doc.revision - cached[0] < 1000:
        return cached[1]
    unit = "\t" if doc.language == "go" else "    "
    widths: list[int] = []
    for line in doc.text[:20000].split("\n"):
        ws = _leading_ws(line)
        if not line.strip() or not ws:
            continue
        if ws.startswith("\t"):
            unit = "\t"
            widths = []
            break
        widths.append(len(ws))
        if len(widths) >= 50:
            break
    if widths:
        step = min(widths)
        unit = " " * (step if step in (2, 3, 4, 8) else 4)
    doc.memo["indent_unit"] = (doc.revision, unit)
    return unit


# --- tree questions -------------------------------------------------------------------


def _last_code_leaf(doc: SyntaxDocument, lines_start: int) -> tree_sitter.Node | None:
    """The last leaf on the line starting at `lines_start` that is not a comment, or None."""
    root = doc.tree.root_node
    end = doc.text.find("\n", lines_start)
    end = len(doc.text) if end < 0 else end
    pos = end
    while pos > lines_start:
        while pos > lines_start and doc.text[pos - 1] in " \t\r":
            pos -= 1
        if pos <= lines_start:
            return None
        byte = doc.byte_offset(pos - 1)
        leaf = root.descendant_for_byte_range(byte, byte + 1)
        if leaf is None:
            return None
        if "comment" in leaf.type:
            comment_start, _ = doc.node_span(leaf)
            if comment_start >= pos - 1 or comment_start <= lines_start:
                return None
            pos = comment_start
            continue
        return leaf
    return None


def _in_comment(doc: SyntaxDocument, offset: int) -> bool:
    """Whether the text just before `offset` is a comment's: the user is writing the comment."""
    if offset == 0:
        return False
    byte = doc.byte_offset(offset)
    node = doc.tree.root_node.descendant_for_byte_range(byte - 1, byte)
    return node is not None and "comment" in node.type and node.start_byte < byte


def _opens_block(doc: SyntaxDocument, lines: _Lines, row: int, *, brackets: bool) -> bool:
    """Whether `row` ends with a token that opens a body (and, with `brackets`, an open bracket)."""
    leaf = _last_code_leaf(doc, lines.start_of(row))
    if leaf is None:
        return False
    kind = leaf.type
    parent = leaf.parent
    if brackets and kind in ("(", "["):
        return True
    if doc.language == "python":
        return kind == ":" and (parent is None or parent.type not in _PY_NOT_BLOCK_COLON)
    word_opener = _WORD_OPENERS.get(doc.language)
    if word_opener is not None:
        return word_opener(doc, leaf, lines.line(row), brackets)
    if kind == ":" and parent is not None and parent.type in _COLON_BODIES:
        return True  # `case 1:` (C#, PHP, Swift): the case's statements follow
    if kind == "=" and not brackets and lines.line(row).endswith((" ", "\t")):
        pass  # `val xs = |`: a space typed after `=`, the value goes on the line
    elif parent is not None and parent.type in _ARROW_BODIES.get(doc.language, {}).get(kind, ()):
        return True  # `case x =>`, `{ item ->`, `{ item in`, `def f(x: Int) =`: a body follows
    elif doc.language == "scala" and kind == "=" and _SCALA_DEFINITION_LINE.match(lines.line(row)):
        return True  # the same `def f(x: Int) =` while its body is still missing (an ERROR node)
    if doc.language == "lua":
        if kind in _LUA_OPENERS:
            return True
        if kind == ")" and parent is not None and parent.type == "parameters":
            return True
        return brackets and kind == "{"
    if uses_braces(doc.language) and kind == "{":
        return brackets or parent is None or parent.type not in _BRACE_BLOCK_PARENTS_NOT
    return False


def _header_row(doc: SyntaxDocument, lines: _Lines, row: int) -> int:
    """The row where the statement whose opener ends `row` starts: the header's first line when
    it spans several (`for (...;\n     ...) {`), whose indentation the body's is relative to."""
    leaf = _last_code_leaf(doc, lines.start_of(row))
    node = None if leaf is None else leaf.parent
    if node is not None and node.type in BLOCK_TYPES.get(doc.language, ()) and node.parent is not None:
        node = node.parent  # `{` belongs to the block; the block to the statement
    if node is None or node.parent is None:
        return row
    start_row = node.start_point.row
    if not 0 <= row - start_row <= 20:
        return row
    return start_row


def _brace_is_block(doc: SyntaxDocument, at: int) -> bool:
    """Whether the `}` at str offset `at` closes a block (not an object/initializer literal)."""
    byte = doc.byte_offset(at)
    leaf = doc.tree.root_node.descendant_for_byte_range(byte, byte + 1)
    return leaf is not None and leaf.type == "}" and leaf.parent is not None and doc.language not in DATA_LANGUAGES and (
        leaf.parent.type in BLOCK_TYPES.get(doc.language, ())
        or leaf.parent.type in BRACE_BODY_TYPES.get(doc.language, ()))


def _string_closer(doc: SyntaxDocument, offset: int) -> tuple[int, str] | None:
    """(offset, delimiter) of the closing quote when the cursor is inside a one-line string."""
    byte = doc.byte_offset(offset)
    node = doc.tree.root_node.descendant_for_byte_range(byte, byte)
    while node is not None:
        kind = node.type
        if kind.endswith(_STRING_SUFFIXES):
            if node.start_byte < byte < node.end_byte and node.start_point.row == node.end_point.row:
                last = node.children[-1] if node.children else None
                if last is not None and last.start_byte >= byte:
                    delimiter = last.text.decode("utf-8", errors="replace")
                    if delimiter and all(c in QUOTES for c in delimiter):
                        return doc.str_offset(last.start_byte), delimiter
                elif last is None:
                    tail = node.text.decode("utf-8", errors="replace")[-1:]
                    if tail in QUOTES and node.end_byte - 1 >= byte:
                        return doc.str_offset(node.end_byte - 1), tail
            return None
        if node.type in ("ERROR", "template_substitution", "interpolation", "string_interpolation",
                         "jsx_expression", "interpolated_expression", "expansion", "simple_expansion",
                         "command_substitution"):
            return None
        node = node.parent
    return None


# --- block openers that are words, tags or arrows ---------------------------------------

_COLON_BODIES = frozenset({"switch_section", "case_statement", "default_statement", "switch_entry"})
_RUBY_LAST_OPENERS = frozenset({"do", "then", "begin", "else", "ensure"})
_RUBY_FIRST_OPENERS = frozenset({"def", "class", "module", "if", "unless", "while", "until", "for", "case",
                                 "when", "begin", "elsif", "else", "rescue", "ensure"})
_RUBY_ONE_LINER = re.compile(r"\b(then|do)\b\s*\S|;\s*\S|\bend\b")
_HTML_VOID = frozenset({"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source",
                        "track", "wbr"})
_SCALA_DEFINITIONS = frozenset({"function_definition", "val_definition", "var_definition", "class_definition",
                                "object_definition", "trait_definition", "given_definition", "enum_definition"})
_SCALA_DEFINITION_LINE = re.compile(r"\s*(\w+\s+)*(def|val|var|given)\b")
_ARROW_BODIES = {
    "scala": {"=>": frozenset({"case_clause", "lambda_expression"}), "=": _SCALA_DEFINITIONS,
              ":": _SCALA_DEFINITIONS},
    "kotlin": {"->": frozenset({"lambda_literal", "when_entry"})},
    "swift": {"in": frozenset({"lambda_literal"})},
}
"""Tokens that end a line before a body in these grammars, by the parent node they must have."""


def _ruby_opens(doc: SyntaxDocument, leaf: tree_sitter.Node, line: str, blank_after: bool) -> bool:
    """`def f(x)`, `if ready`, `items.each do |item|`, `begin`: a line whose body follows until `end`."""
    kind, parent = leaf.type, leaf.parent
    if kind in _RUBY_LAST_OPENERS:
        return True
    if kind == "|" and parent is not None and parent.type == "block_parameters":
        return True
    if kind == "{":
        return parent is not None and parent.type == "block"  # a brace block, not a hash
    code = line.strip()
    first = code.split(None, 1)[0] if code else ""
    return first in _RUBY_FIRST_OPENERS and _RUBY_ONE_LINER.search(code[len(first):]) is None


def _bash_opens(doc: SyntaxDocument, leaf: tree_sitter.Node, line: str, blank_after: bool) -> bool:
    """`then`, `do`, `else`, `case x in`, and a function's or group's `{`."""
    kind, parent = leaf.type, leaf.parent
    if kind in ("then", "do", "else"):
        return True
    if kind == "in":
        return parent is not None and parent.type == "case_statement"
    return kind == "{" and parent is not None and parent.type == "compound_statement"


def _yaml_opens(doc: SyntaxDocument, leaf: tree_sitter.Node, line: str, blank_after: bool) -> bool:
    """`key:` with nothing after it: a nested mapping or sequence follows, indented. With the cursor
    after `key: ` (a space typed) the value goes on the line instead."""
    if not blank_after and line.endswith((" ", "\t")):
        return False
    return leaf.type == ":" and leaf.parent is not None and leaf.parent.type == "block_mapping_pair"


def _html_opens(doc: SyntaxDocument, leaf: tree_sitter.Node, line: str, blank_after: bool) -> bool:
    """A start tag that ends the line and whose end tag is on a later line: the element's content follows."""
    tag = leaf.parent
    if leaf.type != ">" or tag is None or tag.type != "start_tag":
        return False
    name = next((c for c in tag.named_children if c.type == "tag_name"), None)
    if name is None or name.text.decode("utf-8", errors="replace").lower() in _HTML_VOID:
        return False
    element = tag.parent
    end_tag = element.children[-1] if element is not None and element.children else None
    return end_tag is not None and end_tag.type == "end_tag" and end_tag.start_point.row > leaf.start_point.row


def _toml_opens(doc: SyntaxDocument, leaf: tree_sitter.Node, line: str, blank_after: bool) -> bool:
    """TOML has no bodies: a table's keys follow its header at the same indentation."""
    return False


# Each takes (doc, the line's last code leaf, the line, whether the cursor is on a blank line below it).
_WORD_OPENERS = {"ruby": _ruby_opens, "bash": _bash_opens, "yaml": _yaml_opens, "html": _html_opens,
                 "toml": _toml_opens}
