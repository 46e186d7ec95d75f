"""Builds the prompt's text window around the cursor under a token budget.

The window is cut at syntactic boundaries: the prefix starts at the start of a line
where a statement (a child of a block that encloses the cursor) starts, the suffix
ends at the end of a line where one ends; never mid-line, but for a line after the
cursor's that alone is over the suffix's share (a data file's one-line list of 7,000
characters): then the suffix holds its head, what fits the share, so that the model
and the post-processing still see how the code goes on. What falls outside goes, in
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
Its cost does not grow with the file: only the children of the enclosing blocks that lie
within reach of the window are looked at for its boundaries, and sibling signatures are
taken nearest first, walking outwards from the window until the preamble's share is spent
(a module of a thousand definitions cost 2.4 ms per new line when every child was listed).
Knows nothing of tokenizers, tensors or LSP; offsets are str indices.
"""

from __future__ import annotations

import bisect
import functools
import heapq
import re
from collections.abc import Callable, Iterator

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

# Calibrated on DiffusionGemma's tokenizer family (Gemma's 262,144-entry SentencePiece vocabulary):
# a word piece with the space before it (`▁Header`), split where camelCase starts a new word
# (`is|Protocol|Switch|Header`) and every 10 lowercase letters, capitals in runs of up to 3
# (`TLS_ECDHE_RSA` is many pieces), each digit, runs of 2-16 spaces (a lone space joins the word
# after it), tabs up to 4, each newline, each non-ASCII character and each other character. On
# 40-line chunks of real Python, Go, TS, JS and C it counts 11-15% more than that tokenizer (5th
# percentile 0.99x, C headers): still an over-estimate, where the old 4-letter rule counted
# 1.5-1.9x (docs/decisions.md). No match spans a newline, so the count of a text cut at line ends
# is the sum of the counts of its lines, and the count of any split text is at least the count of
# the whole.
_TOKEN = re.compile(r"[ ]?\.\.\.|[ ]?[A-Z]?[a-z]{1,10}|[ ]?[A-Z]{1,3}(?![a-z])|[0-9]| {2,16}|\t{1,4}|\n|[^\x00-\x7f]|[^\sA-Za-z0-9]")


def approx_token_count(text: str) -> int:
    """A tokenizer-free estimate of the model's tokens in `text`, a little over the true count."""
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
    before = _lines_before(doc, line_start, int(budget * PREFIX_SHARE))
    after = _lines_after(text, line_end, int(budget * SUFFIX_SHARE))
    starts, ends = _boundaries(doc, chains, line_start, line_end, before.earliest, after.furthest)
    window_start = _choose_window_start(before, starts, int(budget * PREFIX_SHARE))
    window_end = _choose_window_end(after, ends)
    suffix_lines_tokens = after.cost_at[window_end]
    if after.furthest == line_end < len(text):  # the next line alone is over the share
        window_end, suffix_lines_tokens = _head_of_next_line(text, line_end, int(budget * SUFFIX_SHARE))
    preamble, preamble_tokens = _build_preamble(doc, chains, window_start, window_end, int(budget * PREAMBLE_SHARE))
    # The walks counted the windows line by line: no token spans a newline, so the sums are exact.
    return _StablePart(
        revision=doc.revision, line_start=line_start, tail_after_line=len(text) - line_end,
        tail_after_window=len(text) - window_end, window_start=window_start, preamble=preamble,
        budget=budget, preamble_tokens=preamble_tokens,
        prefix_lines_tokens=before.cost_at[window_start], suffix_lines_tokens=suffix_lines_tokens,
    )


def _head_of_next_line(text: str, line_end: int, share: int) -> tuple[int, int]:
    """The end of the longest head of the line after `line_end` (with its newline) that fits
    `share` tokens, and its count (the line itself is over the share: no whole line fits)."""
    next_end = text.find("\n", line_end + 1)
    next_end = len(text) if next_end < 0 else next_end
    size = min(next_end - line_end, 4 * share)  # a token is at most 4 characters
    while size > 0 and (count := approx_token_count(text[line_end:line_end + size])) > share:
        size = min(size - 1, size * share // count)
    return line_end + size, approx_token_count(text[line_end:line_end + size]) if size > 0 else 0


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
                line_end: int, earliest: int, furthest: int) -> tuple[list[int], list[int]]:
    """Line starts before the cursor's line where statements start, and line ends after it where they end.

    Only those in [earliest, furthest], where a window can start or end: the children of a
    container that lie wholly outside are never looked at (a module has one per definition)."""
    text = doc.text
    starts: set[int] = set()
    ends: set[int] = set()
    lo, hi = doc.byte_offset(earliest), doc.byte_offset(furthest)
    for container in chains:
        children = container.children
        first = bisect.bisect_left(children, lo, key=_end_byte)  # the ones before end before `earliest`
        last = bisect.bisect_right(children, hi, key=_start_byte)  # the ones after start past `furthest`
        for child in children[first:last]:
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


class _LineCosts(msgspec.Struct):
    """Lines walked from the cursor's line until a share of the budget is spent."""

    cost_at: dict[int, int]
    """Tokens from each line boundary reached to the cursor's line."""
    earliest: int
    """Before the cursor: the earliest line start within the share."""
    furthest: int
    """After the cursor: the furthest line end within the share."""
    anchor: int
    """Before the cursor: the line start ANCHOR_ROWS-rounded rows back (see `_choose_window_start`)."""


def _lines_before(doc: SyntaxDocument, line_start: int, share: int) -> _LineCosts:
    """Walk back line by line from the cursor's line, remembering the cumulative cost at each line start."""
    text = doc.text
    cost_at: dict[int, int] = {line_start: 0}
    anchor_rows = doc.row_of(line_start) % ANCHOR_ROWS
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
    return _LineCosts(cost_at, earliest=earliest, furthest=line_start, anchor=anchor)


def _lines_after(text: str, line_end: int, share: int) -> _LineCosts:
    """Walk forward line by line from the end of the cursor's line, remembering the cumulative cost."""
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
    return _LineCosts(cost_at, earliest=line_end, furthest=furthest, anchor=line_end)


def _choose_window_start(before: _LineCosts, starts: list[int], share: int) -> int:
    """Earliest statement start whose lines up to the cursor's line fit `share` tokens.

    Fitted against an anchor (the line start rounded down to ANCHOR_ROWS rows) with a
    margin, then checked against the real line start, so consecutive lines pick the same start.
    """
    cost_at = before.cost_at
    anchor_cost = cost_at.get(before.anchor, 0)
    target = int(share * 0.85)
    fitting = [s for s in starts if s in cost_at and cost_at[s] - anchor_cost <= target]
    if fitting:
        return fitting[0]
    # No statement start fits (one huge statement): cut at a plain line boundary.
    return before.earliest


def _choose_window_end(after: _LineCosts, ends: list[int]) -> int:
    """Furthest statement end after the cursor's line whose lines fit the suffix share."""
    fitting = [e for e in ends if e in after.cost_at]
    if fitting:
        return fitting[-1]
    return after.furthest


def _start_byte(node: tree_sitter.Node) -> int:
    return node.start_byte


def _end_byte(node: tree_sitter.Node) -> int:
    return node.end_byte


# --- preamble --------------------------------------------------------------------------


def _build_preamble(doc: SyntaxDocument, chains: list[tree_sitter.Node], window_start: int,
                    window_end: int, share: int) -> tuple[str, int]:
    """Imports, enclosing scope headers and sibling signatures that lie outside the window; and its tokens."""
    if doc.whole_tree is None or share <= 0:
        return "", 0
    # Items as (priority, order, node, inner, form): headers first, then imports, then the
    # signatures nearest the window; order is (depth, child index). Text is made lazily, best
    # first, until the share is spent: a file may have a thousand top-level definitions, so
    # the signatures are walked outwards from the window, never all listed. The preamble
    # lists what was chosen in skeleton order: each level's outside siblings, then the header
    # of the scope that leads down to the cursor.
    firsts: list[tuple[int, tuple[int, int], tree_sitter.Node, tree_sitter.Node | None, str]] = []
    signatures: list[Iterator] = []
    for depth, container in enumerate(reversed(chains)):
        inner = chains[len(chains) - depth - 2] if depth + 1 < len(chains) else None
        scope = _scope_of(inner, container) if inner is not None else None
        level = _Level(doc, container, depth, scope, window_start, window_end)
        firsts.extend(level.imports())
        signatures.append(level.signatures())
        if scope is not None and doc.node_span(scope)[0] < window_start:
            firsts.append((0, (depth, level.count), scope, inner, "header"))
    chosen: list[tuple[tuple[int, int], str]] = []
    used = 0
    misses = 0
    for _priority, position, node, inner, form in heapq.merge(sorted(firsts, key=_item_key), *signatures,
                                                             key=_item_key):
        if form == "header":
            item = _header(doc, node, inner)
        elif form == "import":
            item = _lines_from(doc, *doc.node_span(node))
        else:
            item = _signature(doc, node)
        cost = _line_tokens(item) + 1  # its newline is one more
        if used + cost > share:
            misses += 1
            if misses > 8:
                break
            continue
        used += cost
        chosen.append((position, item))
    chosen.sort()
    return "".join(item + "\n" for _, item in chosen), used


def _item_key(item: tuple) -> tuple[int, tuple[int, int]]:
    return item[0], item[1]


class _Level:
    """One enclosing container's children outside the window: its imports, and its definitions'
    signatures nearest first (priority 2 + distance to the window, in chars)."""

    def __init__(self, doc: SyntaxDocument, container: tree_sitter.Node, depth: int,
                 scope: tree_sitter.Node | None, window_start: int, window_end: int) -> None:
        self.doc, self.depth, self.scope = doc, depth, scope
        self.window_start, self.window_end = window_start, window_end
        self.children = children = container.children
        self.count = len(children)
        # children[:before] end at or before the window; children[after:] start at or after its end.
        self.before = bisect.bisect_right(children, doc.byte_offset(window_start), key=_end_byte)
        self.after = max(self.before, bisect.bisect_left(children, doc.byte_offset(window_end), key=_start_byte))

    def _kept(self, child: tree_sitter.Node) -> bool:
        """Not the child that holds the scope leading down to the cursor (its header stands for it)."""
        scope = self.scope
        return scope is None or not child.start_byte <= scope.start_byte < child.end_byte

    def imports(self) -> list:
        kinds = IMPORT_TYPES.get(self.doc.language, frozenset())
        if not kinds:
            return []
        return [(1, (self.depth, index), child, None, "import")
                for index, child in enumerate(self.children)
                if (index < self.before or index >= self.after) and child.type in kinds and self._kept(child)]

    def signatures(self) -> Iterator:
        """Nearest first; at equal distance the earlier child first (as sorting by (priority, order) would)."""
        kinds = DEFINITION_TYPES.get(self.doc.language, frozenset())
        backward = self._outside(range(self.before - 1, -1, -1), kinds, lambda start, end: self.window_start - end)
        forward = self._outside(range(self.after, self.count), kinds, lambda start, end: start - self.window_end)
        return heapq.merge(backward, forward, key=_item_key)

    def _outside(self, indices: range, kinds: frozenset[str], distance: Callable[[int, int], int]) -> Iterator:
        tied: list[tuple] = []  # equal distances (children ending together) go out earliest child first
        for index in indices:
            child = self.children[index]
            if child.type in kinds and self._kept(child):
                item = (2 + distance(*self.doc.node_span(child)), (self.depth, index), child, None, "signature")
                if tied and tied[0][0] != item[0]:
                    yield from sorted(tied, key=_item_key)
                    tied.clear()
                tied.append(item)
        yield from sorted(tied, key=_item_key)


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
    if doc.language in ("lua", "ruby"):
        return head + " ... end"
    if uses_braces(doc.language):
        return head + " { ... }"
    return head


def _cap_lines(text: str) -> str:
    lines = text.split("\n")
    return "\n".join(lines[:MAX_SIGNATURE_LINES]).rstrip()
