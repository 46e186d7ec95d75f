"""Builds the prompt's text window around the cursor under a token budget.

The window is cut at syntactic boundaries: the prefix starts at the start of a line
where a statement (a child of a block that encloses the cursor) starts, the suffix
ends at the end of a line where one ends; never mid-line. What falls outside goes, in
short form, into the `preamble`: imports, the headers of the scopes that enclose the
cursor (`class A:` / `fn f() {`), and the signatures of sibling definitions.

Shares of the budget are fixed (prefix before the cursor's line, suffix after it,
preamble, and a reserve for the cursor's line), so what is chosen for the lines
around the cursor's line never depends on how long that line is. While the user types
on one line, the preamble and the prefix up to that line are also reused verbatim
from the previous call (validated with the document's change history): the prompt's
stable part stays byte-identical for the prompt cache even when a half-typed line
briefly confuses the parser. The prefix start is fitted against a line anchor rounded
down to a multiple of ANCHOR_ROWS, so pressing Enter moves it in steps, not per line.

Token counts are a conservative, tokenizer-free estimate (`approx_token_count`); the stable
part keeps the counts of its lines, so a keystroke counts only the cursor's line again.
Knows nothing of tokenizers, tensors or LSP; offsets are str indices.
"""

from __future__ import annotations

import functools
import re

import msgspec
import tree_sitter

from ..api import HolePlan, InfillContext
from .document import SyntaxDocument
from .languages import BLOCK_TYPES, DEFINITION_TYPES, IMPORT_TYPES, uses_braces

PREFIX_SHARE = 0.60
SUFFIX_SHARE = 0.25
PREAMBLE_SHARE = 0.10
"""Budget shares; the rest (at least 5%) is kept for the cursor's own line."""

ANCHOR_ROWS = 16
"""The prefix start is fitted against the line start rounded down to this many rows."""

MAX_SIGNATURE_LINES = 4
"""A signature longer than this many lines is cut (it is context, not code to reuse)."""

# Letters in chunks of up to 4 (long identifiers are several BPE tokens), each digit
# (Gemma splits numbers into digits), runs of spaces up to 8, each newline, each
# non-ASCII character and each punctuation character. No match spans a newline, so the
# count of a text cut at line ends is the sum of the counts of its lines, and the count
# of any split text is at least the count of the whole.
_TOKEN = re.compile(r"[A-Za-z_]{1,4}|[0-9]| {1,8}|\t{1,4}|\n|[^\x00-\x7f]|\S")


def approx_token_count(text: str) -> int:
    """A conservative tokenizer-free estimate of the tokens in `text`."""
    return len(_TOKEN.findall(text))


_line_tokens = functools.lru_cache(maxsize=65536)(approx_token_count)
"""Per-line counts, memoized: windows are re-measured line by line on every keystroke."""


class _StablePart(msgspec.Struct, frozen=True):
    """The part of a context that is reused while the user types on one line."""

    revision: int
    """Document revision it was computed at."""
    line_start: int
    """Start of the cursor's line."""
    tail_after_line: int
    """Chars from the end of the cursor's line (its newline) to the end of the document."""
    tail_after_window: int
    """Chars from the end of the suffix window to the end of the document."""
    window_start: int
    """Start of the prefix window."""
    preamble: str
    """The preamble as built."""
    budget: int
    """Budget it was built for."""
    preamble_tokens: int
    prefix_lines_tokens: int
    """Tokens of the window's whole lines before the cursor's line."""
    suffix_lines_tokens: int
    """Tokens of the window's lines after the cursor's line (from its newline on)."""


def build_context(doc: SyntaxDocument, offset: int, plan: HolePlan, budget_tokens: int) -> InfillContext:
    """Prefix/suffix windows around `offset` and a preamble, at most `budget_tokens` in all."""
    text = doc.text
    assert 0 <= offset <= len(text), f"offset {offset} outside document of {len(text)} chars"
    assert budget_tokens >= 0, f"negative budget {budget_tokens}"
    line_start = text.rfind("\n", 0, offset) + 1
    line_end = text.find("\n", offset)
    line_end = len(text) if line_end < 0 else line_end

    stable = _reuse_stable_part(doc, offset, line_start, budget_tokens)
    if stable is None:
        stable = _compute_stable_part(doc, offset, line_start, line_end, budget_tokens)
        doc.memo["context"] = stable
    # Only the cursor's line is counted again: no token spans a newline, so the window's other
    # lines count as they did when the stable part was built (see approx_token_count).
    prefix_tokens = stable.prefix_lines_tokens + approx_token_count(text[line_start:offset])
    suffix_tokens = approx_token_count(text[offset:line_end]) + stable.suffix_lines_tokens
    return _fit(doc.language, text, stable.window_start, offset, line_start, line_end,
                len(text) - stable.tail_after_window, stable.preamble, budget_tokens,
                (stable.preamble_tokens, prefix_tokens, suffix_tokens))


def _reuse_stable_part(doc: SyntaxDocument, offset: int, line_start: int, budget: int) -> _StablePart | None:
    memo = doc.memo.get("context")
    if not isinstance(memo, _StablePart) or memo.line_start != line_start or memo.budget != budget:
        return None
    unchanged = doc.unchanged_since(memo.revision)
    if unchanged is None:
        return None
    head, tail = unchanged
    if head < line_start or tail < memo.tail_after_line:
        return None
    line_end = len(doc.text) - memo.tail_after_line
    if not line_start <= offset <= line_end or "\n" in doc.text[line_start:line_end]:
        return None
    return memo


def _compute_stable_part(doc: SyntaxDocument, offset: int, line_start: int, line_end: int,
                         budget: int) -> _StablePart:
    text = doc.text
    chains = _container_chains(doc, offset, line_start)
    starts, ends = _boundaries(doc, chains, line_start, line_end)
    window_start = _choose_window_start(text, line_start, starts, int(budget * PREFIX_SHARE))
    window_end = _choose_window_end(text, line_end, ends, int(budget * SUFFIX_SHARE))
    preamble = _build_preamble(doc, chains, window_start, window_end, int(budget * PREAMBLE_SHARE))
    return _StablePart(
        revision=doc.revision, line_start=line_start, tail_after_line=len(text) - line_end,
        tail_after_window=len(text) - window_end, window_start=window_start, preamble=preamble,
        budget=budget, preamble_tokens=approx_token_count(preamble),
        prefix_lines_tokens=approx_token_count(text[window_start:line_start]),
        suffix_lines_tokens=approx_token_count(text[line_end:window_end]),
    )


def _fit(language, text, window_start, offset, line_start, line_end, window_end, preamble, budget,
         counts: tuple[int, int, int]) -> InfillContext:
    """Assemble the context; if the cursor's line outgrew its reserve, shrink until it fits the budget.

    `counts`: the (preamble, prefix, suffix) token counts of the window as given."""
    prefix = text[window_start:offset]
    suffix = text[offset:window_end]
    preamble_tokens, prefix_tokens, suffix_tokens = counts
    total = preamble_tokens + prefix_tokens + suffix_tokens
    if total > budget:
        # Rare: a very long cursor line. Give up stability, in this order: suffix lines,
        # preamble, prefix lines, then characters of the cursor's line itself.
        while total > budget and window_end > line_end:
            cut = text.rfind("\n", line_end, window_end - 1)
            window_end = line_end if cut < line_end else cut
            suffix = text[offset:window_end]
            total -= suffix_tokens
            suffix_tokens = approx_token_count(suffix)
            total += suffix_tokens
        if total > budget and preamble:
            total -= preamble_tokens
            preamble, preamble_tokens = "", 0
        while total > budget and window_start < line_start:
            nl = text.find("\n", window_start)
            window_start = line_start if nl < 0 or nl >= line_start else nl + 1
            prefix = text[window_start:offset]
            total -= prefix_tokens
            prefix_tokens = approx_token_count(prefix)
            total += prefix_tokens
        while total > budget and (prefix or suffix):
            # Drop characters far from the cursor first, in halves of the excess.
            excess = total - budget
            if len(suffix) >= len(prefix):
                suffix = suffix[: max(0, len(suffix) - max(1, excess))]
            else:
                prefix = prefix[max(1, excess):]
            prefix_tokens, suffix_tokens = approx_token_count(prefix), approx_token_count(suffix)
            total = preamble_tokens + prefix_tokens + suffix_tokens
    assert total <= budget, f"context of {total} tokens over budget {budget}"
    return InfillContext(prefix=prefix, suffix=suffix, preamble=preamble, language=language, tokens=total)


# --- syntactic boundaries --------------------------------------------------------------


def _container_chains(doc: SyntaxDocument, offset: int, line_start: int) -> list[tree_sitter.Node]:
    """Blocks enclosing the cursor (and the end of the previous line), innermost first, deduplicated."""
    tree = doc.whole_tree  # the whole file even while a bounded reparse left only a region fresh
    if tree is None:
        return []
    block_types = BLOCK_TYPES.get(doc.language, frozenset())
    root = tree.root_node
    found: list[tree_sitter.Node] = []
    seen: set[tuple[int, int]] = set()
    probes = [doc.byte_offset(offset)]
    if line_start > 0:
        probes.append(doc.byte_offset(line_start - 1))
    for probe in probes:
        node = root.descendant_for_byte_range(probe, probe)
        while node is not None:
            key = (node.start_byte, node.end_byte)
            if (node.type in block_types or node.parent is None) and key not in seen:
                seen.add(key)
                found.append(node)
            node = node.parent
    found.sort(key=lambda n: n.end_byte - n.start_byte)
    return found


def _boundaries(doc: SyntaxDocument, chains: list[tree_sitter.Node], line_start: int,
                line_end: int) -> tuple[list[int], list[int]]:
    """Line starts before the cursor's line where statements start, and line ends after it where they end."""
    text = doc.text
    starts: set[int] = set()
    ends: set[int] = set()
    for container in chains:
        for child in container.children:
            if not child.is_named:
                continue
            child_start, child_end = doc.node_span(child)
            if child_start < line_start:
                row_start = text.rfind("\n", 0, child_start) + 1
                if not text[row_start:child_start].strip():
                    starts.add(row_start)
            if child_end > line_end:
                nl = text.find("\n", child_end)
                ends.add(len(text) if nl < 0 else nl)
        container_end = doc.node_span(container)[1]
        if container_end > line_end:
            nl = text.find("\n", container_end)
            ends.add(len(text) if nl < 0 else nl)
    return sorted(starts), sorted(ends)


def _choose_window_start(text: str, line_start: int, starts: list[int], share: int) -> int:
    """Earliest statement start whose lines up to the cursor's line fit `share` tokens.

    Fitted against an anchor (the line start rounded down to ANCHOR_ROWS rows) with a
    margin, then checked against the real line start, so consecutive lines pick the same start.
    """
    # Walk back line by line and remember the cumulative cost at each line start.
    cost_at: dict[int, int] = {line_start: 0}
    row = text.count("\n", 0, line_start)
    anchor_rows = row % ANCHOR_ROWS
    anchor = line_start
    pos, cost, earliest = line_start, 0, line_start
    rows_back = 0
    while pos > 0:
        prev = text.rfind("\n", 0, pos - 1) + 1
        cost += _line_tokens(text[prev:pos])
        if cost > share:
            break
        pos = prev
        rows_back += 1
        cost_at[pos] = cost
        earliest = pos
        if rows_back == anchor_rows:
            anchor = pos
    anchor_cost = cost_at.get(anchor, 0)
    target = int(share * 0.85)
    fitting = [s for s in starts if s in cost_at and cost_at[s] - anchor_cost <= target]
    if fitting:
        return fitting[0]
    # No statement start fits (one huge statement): cut at a plain line boundary.
    return earliest


def _choose_window_end(text: str, line_end: int, ends: list[int], share: int) -> int:
    """Furthest statement end after the cursor's line whose lines fit `share` tokens."""
    pos, cost, furthest = line_end, 0, line_end
    cost_at: dict[int, int] = {line_end: 0}
    while pos < len(text):
        nxt = text.find("\n", pos + 1)
        nxt = len(text) if nxt < 0 else nxt
        cost += _line_tokens(text[pos:nxt])
        if cost > share:
            break
        pos = nxt
        cost_at[pos] = cost
        furthest = pos
    fitting = [e for e in ends if e in cost_at]
    if fitting:
        return fitting[-1]
    return furthest


# --- preamble --------------------------------------------------------------------------


def _build_preamble(doc: SyntaxDocument, chains: list[tree_sitter.Node], window_start: int,
                    window_end: int, share: int) -> str:
    """Imports, enclosing scope headers and sibling signatures that lie outside the window."""
    if doc.whole_tree is None or share <= 0:
        return ""
    language = doc.language
    imports = IMPORT_TYPES.get(language, frozenset())
    definitions = DEFINITION_TYPES.get(language, frozenset())
    # Items as (priority, order, node, form): headers first, then imports, then the signatures
    # nearest the window. Text is made lazily, best first, until the share is spent (a file
    # may have hundreds of top-level definitions). The preamble lists them in skeleton order:
    # each level's outside siblings, then the header of the scope that leads down to the cursor.
    items: list[tuple[int, int, tree_sitter.Node, tree_sitter.Node | None, str]] = []
    order = 0
    for depth, container in enumerate(reversed(chains)):
        inner = chains[len(chains) - depth - 2] if depth + 1 < len(chains) else None
        scope = _scope_of(inner, container) if inner is not None else None
        for child in container.children:
            kind = child.type
            if kind not in imports and kind not in definitions:
                continue
            start, end = doc.node_span(child)
            if not (end <= window_start or start >= window_end):
                continue
            if scope is not None and child.start_byte <= scope.start_byte < child.end_byte:
                continue
            if kind in imports:
                items.append((1, order, child, None, "import"))
            else:
                distance = min(abs(window_start - end), abs(start - window_end))
                items.append((2 + distance, order, child, None, "signature"))
            order += 1
        if scope is not None and doc.node_span(scope)[0] < window_start:
            items.append((0, order, scope, inner, "header"))
            order += 1
    chosen: list[tuple[int, str]] = []
    used = 0
    misses = 0
    for _priority, position, node, inner, form in sorted(items, key=lambda item: item[:2]):
        if form == "header":
            item = _header(doc, node, inner)
        elif form == "import":
            item = _lines_from(doc, *doc.node_span(node))
        else:
            item = _signature(doc, node)
        cost = approx_token_count(item) + 1
        if used + cost > share:
            misses += 1
            if misses > 8:
                break
            continue
        used += cost
        chosen.append((position, item))
    chosen.sort()
    return "".join(item + "\n" for _, item in chosen)


def _scope_of(inner: tree_sitter.Node, container: tree_sitter.Node) -> tree_sitter.Node:
    """The child of `container` that holds the block `inner` (e.g. the function around a body)."""
    node = inner
    while node.parent is not None and node.parent != container:
        node = node.parent
    return node


def _lines_from(doc: SyntaxDocument, start: int, end: int) -> str:
    """Text of a node from the start of its first line (keeping its indentation)."""
    line_start = doc.text.rfind("\n", 0, start) + 1
    return doc.text[line_start:end].rstrip()


def _body_of(node: tree_sitter.Node) -> tree_sitter.Node | None:
    body = node.child_by_field_name("body")
    if body is None and node.type == "decorated_definition":
        definition = node.child_by_field_name("definition")
        return _body_of(definition) if definition is not None else None
    if body is None and node.type == "template_declaration":
        for child in node.named_children:
            found = _body_of(child)
            if found is not None:
                return found
    return body


def _header(doc: SyntaxDocument, scope: tree_sitter.Node, inner: tree_sitter.Node) -> str:
    """`def f(x):` / `fn f() {`: the scope's text up to and including where its body opens."""
    start = doc.node_span(scope)[0]
    body_start = doc.node_span(inner)[0]
    if doc.text[body_start:body_start + 1] in "{":
        body_start += 1
    return _cap_lines(_lines_from(doc, start, body_start))


def _signature(doc: SyntaxDocument, node: tree_sitter.Node) -> str:
    """A definition's header with its body elided, in the language's own syntax."""
    start, end = doc.node_span(node)
    body = _body_of(node)
    if body is None:
        return _cap_lines(_lines_from(doc, start, end))
    body_start = doc.node_span(body)[0]
    head = _cap_lines(_lines_from(doc, start, body_start))
    if doc.language == "python":
        return head + " ..."
    if doc.language == "lua":
        return head + " ... end"
    if uses_braces(doc.language):
        return head + " { ... }"
    return head


def _cap_lines(text: str) -> str:
    lines = text.split("\n")
    return "\n".join(lines[:MAX_SIGNATURE_LINES]).rstrip()
