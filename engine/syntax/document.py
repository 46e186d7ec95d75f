"""One open document: its text and its tree-sitter tree, kept in step edit by edit.

Owns the incremental parse: every change edits the tree in place (`Tree.edit`) and
reparses with the old tree, so a keystroke costs a small reparse, never a fresh
parse. Offsets given to and returned by this module are Python str indices; the
tree speaks UTF-8 bytes and (row, byte-column) points, converted here and only here.
In a text with any non-ASCII character a conversion reads at most one OFFSET_CHUNK of
the text, from a table of checkpoints made once per revision (a conversion from the
start of the file made a context over a 10,000-line file with one `é` take 50 ms).
Also remembers which part of the text each recent change left untouched, so callers
can reuse work (the context window) while the user types on one line.

Bounded reparse: with `parse_budget_s` set, a reparse that runs past the budget is
abandoned (tree-sitter's progress callback; it fires every few hundred bytes) and
only the enclosing top-level region of the edits is parsed instead, as a tree of its
own in the document's coordinates (`Parser.included_ranges`; in a big class or
namespace, the member around the edits plus the container's opening and closing
lines: `enclosing_ranges`). Once a whole parse ran over budget, the next keystrokes
go to the region directly until a `catch_up` finishes within the budget again. `tree` is then that
region's tree and `stale` is True; the whole-document tree is kept edited in step and
brought up to date by `catch_up`, which a caller runs when it has time (the server's
syntax worker, between keystrokes) and which stops as soon as a newer change waits.
Tree-sitter's error recovery on a half-typed statement can take 50-100 ms in a big
Rust file; this keeps every keystroke's own parse short whatever the grammar does.
While stale, `tree` covers only the region (planning looks at the cursor's surroundings,
which it holds, parsed as they are now), and `whole_tree` is the last whole-document
tree edited in step: positions right, structure as before the changes (what the
context needs from the rest of the file: enclosing scopes and sibling signatures).
Knows nothing of cursors, holes, tokens or LSP.
"""

from __future__ import annotations

import bisect
import ctypes
import sys
import time
from collections.abc import Callable
from typing import Any

import tree_sitter

from .history import ChangeHistory
from .languages import normalize_language, parser_for

KEYSTROKE_PARSE_BUDGET_S = 0.002
"""The language server's budget for one reparse (the per-keystroke target is 5 ms in all)."""
REGION_BYTES = 8192
"""About 250 lines: a region this size parses in well under a millisecond."""
_SMALL = 512
"""A container's opening or closing part this small is taken whole (`class A(B):`, `};`)."""
OFFSET_CHUNK = 4096
"""Chars between two checkpoints of the str <-> byte offset table of a non-ASCII text."""
_READ_CHUNK = 1 << 14
"""Bytes handed to tree-sitter per read callback. A bytes copy, not a memoryview slice:
`Node.text` of a tree read from memoryviews crashes py-tree-sitter 0.26 (issue #435)."""


_Py_DecRef = ctypes.pythonapi.Py_DecRef
_Py_DecRef.argtypes, _Py_DecRef.restype = [ctypes.py_object], None


def parse_in_chunks(
    parser: tree_sitter.Parser,
    source: bytes,
    old_tree: tree_sitter.Tree | None = None,
    progress: Callable[[int, bool], bool] | None = None,
) -> tree_sitter.Tree:
    """`parser.parse` reading `source` through a callback, as tree-sitter needs for `progress`
    (called every few hundred bytes; True stops the parse: ValueError), without the leak.

    py-tree-sitter 0.26.1 keeps one reference too many to every bytes object a read callback
    returns: each parse left its whole source behind, chunk by chunk (`bench soak`: +40 KB per
    document, for good; bench/RESULTS.md). Each chunk is therefore a fresh copy that only this
    function holds, and once the binding is done with it (at the next read, or when the parse
    returns) a reference beyond ours is the leaked one and is given back. A binding without
    the leak leaves none, and then nothing is touched. (Chunks of 0 or 1 byte are the
    interpreter's shared singletons: never counted, never released.)"""
    view = memoryview(source)
    handed: list[bytes] = []
    parsing = True

    def read(byte: int, _point) -> bytes:
        _release_leaked(handed)  # the binding let go of the previous chunk before this call
        chunk = view[byte:byte + _READ_CHUNK].tobytes()  # a bytes copy: see _READ_CHUNK
        if parsing and len(chunk) > 1:
            handed.append(chunk)
        return chunk

    try:
        options: dict[str, Any] = {} if progress is None else {"progress_callback": progress}
        if old_tree is None:  # py-tree-sitter refuses an explicit None here
            return parser.parse(read, **options)
        return parser.parse(read, old_tree, **options)
    finally:
        parsing = False  # `Node.text` reads through `read` later: nothing of that is counted
        _release_leaked(handed)


def _release_leaked(handed: list[bytes]) -> None:
    while handed:
        chunk = handed.pop()
        if sys.getrefcount(chunk) > 2:  # `chunk` and getrefcount's argument; a third is the leak
            _Py_DecRef(chunk)
        del chunk


class ParseAborted(Exception):
    """A parse was stopped by its deadline or because a newer change is waiting."""


class SyntaxDocument:
    """Text + tree of one document. `tree` is None for plaintext (no grammar)."""

    def __init__(
        self, text: str, language: str, *, parse_budget_s: float | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.language: str = normalize_language(language)
        self._parser = parser_for(self.language)
        if self._parser is None:
            self.language = "plaintext"
        self.text: str = ""
        self.source: bytes = b""
        self.tree: tree_sitter.Tree | None = None
        self.revision: int = 0
        """Bumped by every change."""
        self.memo: dict[str, Any] = {}
        """Scratch space for derived data other modules cache per document (e.g. the context window);
        they validate it themselves with `revision` / `unchanged_since`."""
        self._history = ChangeHistory()
        self.parse_budget_s = parse_budget_s
        """Time one reparse may take before falling back to the edited region; None: unbounded."""
        self.clock = clock
        """What the budget is measured with (a test passes one that counts the parse's progress)."""
        self.stale = False
        """True while `tree` is the tree of a region only (see the module docstring)."""
        self._over_budget = False
        """The latest whole-document parse took longer than the budget: the next keystroke's
        would too (tree-sitter recovering from the same half-typed line), so it is not tried."""
        self._full: tree_sitter.Tree | None = None
        self._outline: tree_sitter.Tree | None = None
        """The whole-document tree whose top-level nodes delimit regions: the latest one whose
        top-level node where the changes are had no error (error recovery on a half-typed
        statement can swallow the rest of the file into one ERROR node, or into the body of the
        function being typed in: no region to parse on its own)."""
        self._dirty: tuple[int, int] | None = None
        """Bytes [lo, hi) changed since the whole-document tree was last parsed."""
        self._region_parser: tree_sitter.Parser | None = None
        self.region_bytes = REGION_BYTES
        """A region larger than this is narrowed to the members around the change (`enclosing_ranges`)."""
        self._row_mark = (0, 0)
        """(str offset, row) of a point whose row is known in the current text (see `row_of`)."""
        self.set_text(text)

    # --- changes ------------------------------------------------------------------

    def set_text(self, text: str) -> None:
        """Replace the whole text and parse it from scratch (open, or a full-sync change)."""
        self.text = text
        self.source = text.encode("utf-8")
        self._row_mark = (0, 0)
        # Through the progress callback, which lets other threads run: a big file's first parse
        # takes tens of milliseconds, and the server runs it on a worker thread.
        self.tree = self._full = self._outline = self._parse(self._parser, None) if self._parser is not None else None
        self.stale, self._dirty, self._over_budget = False, None, False
        self.revision += 1
        self._history.reset(self.revision)

    def apply_change(self, start: int, end: int, new_text: str) -> None:
        """Replace text[start:end] with new_text; edit the tree in place and reparse incrementally."""
        self.edit(start, end, new_text)
        self.reparse()

    def edit(self, start: int, end: int, new_text: str) -> None:
        """Replace text[start:end] with new_text and edit the tree to match, without reparsing.

        Several edits followed by one `reparse` cost one parse: how a burst of changes is coalesced.
        """
        text = self.text
        assert 0 <= start <= end <= len(text), f"change {start}-{end} outside document of {len(text)} chars"
        start_byte, start_point = self._locate(start)
        old_end_byte, old_end_point = self._locate(end) if end != start else (start_byte, start_point)
        new_bytes = new_text.encode("utf-8")
        new_end_byte = start_byte + len(new_bytes)
        newlines = new_text.count("\n")
        if newlines:
            last_line = new_bytes[new_bytes.rfind(b"\n") + 1:]
            new_end_point = (start_point[0] + newlines, len(last_line))
        else:
            new_end_point = (start_point[0], start_point[1] + len(new_bytes))

        tail_len = len(text) - end
        self.text = text[:start] + new_text + text[end:]
        self.source = self.source[:start_byte] + new_bytes + self.source[old_end_byte:]
        self._row_mark = (start, start_point[0])  # the text before `start` did not change
        self.revision += 1
        self._history.record(self.revision, start, tail_len)
        if self._full is not None:
            for tree in (self._full, self._outline) if self._outline is not self._full else (self._full,):
                tree.edit(
                    start_byte=start_byte,
                    old_end_byte=old_end_byte,
                    new_end_byte=new_end_byte,
                    start_point=start_point,
                    old_end_point=old_end_point,
                    new_end_point=new_end_point,
                )
            self._dirty = _merge_dirty(self._dirty, start_byte, old_end_byte, new_end_byte)

    def reparse(self) -> None:
        """Bring `tree` up to date with the text, within `parse_budget_s` (see the module docstring)."""
        if self._parser is None or self._dirty is None:
            return
        budget = self.parse_budget_s
        # A budget of 0 means never a whole parse on the keystroke path (only `catch_up` does one).
        if not self.stale and not (budget is not None and (self._over_budget or budget <= 0)):
            deadline = None if budget is None else self.clock() + budget
            try:
                self._adopt(self._parse(self._parser, self._full, deadline=deadline))
                return
            except ParseAborted:
                self._over_budget = True
        # Over budget (or already behind): parse the edited top-level region alone. While
        # behind, a whole-document attempt would fail the same way, so only `catch_up` tries.
        self.stale = True
        self.tree = self._parse_region()

    def catch_up(self, should_stop: Callable[[], bool] = lambda: False) -> bool:
        """Reparse the whole document without a deadline; True when `tree` is complete again.

        Stops early (returning False) as soon as `should_stop()` is true, checked every few
        hundred bytes; the document is then as it was, still usable and still `stale`.
        """
        if not self.stale or self._parser is None:
            return True
        started = self.clock()
        try:
            self._adopt(self._parse(self._parser, self._full, should_stop=should_stop))
        except ParseAborted:
            return False
        budget = self.parse_budget_s
        self._over_budget = budget is not None and self.clock() - started > budget
        return True

    def _adopt(self, tree: tree_sitter.Tree) -> None:
        changed = self._dirty or (0, 0)
        at = _top_level_at(tree.root_node, changed[0], before=True)
        if at is None or not at.has_error or self._outline is None:
            self._outline = tree
        self.tree = self._full = tree
        self.stale, self._dirty = False, None

    def _parse(
        self,
        parser: tree_sitter.Parser,
        old_tree: tree_sitter.Tree | None,
        *,
        deadline: float | None = None,
        should_stop: Callable[[], bool] | None = None,
    ) -> tree_sitter.Tree:
        """One parse of `source` through the progress callback; raises ParseAborted when stopped.

        Tree-sitter holds the GIL while it parses; the progress callback runs Python code
        every few hundred bytes, which is where the interpreter hands the GIL to a thread
        that asked for it (after `sys.getswitchinterval()`): a long parse on a worker
        thread does not stall an event loop for longer than that."""
        clock = self.clock

        def progress(_offset: int, _has_error: bool) -> bool:
            if deadline is not None and clock() > deadline:
                return True
            return should_stop is not None and should_stop()

        try:
            return parse_in_chunks(parser, self.source, old_tree, progress)
        except ValueError:  # py-tree-sitter's answer to a cancelled parse: "Parsing failed"
            parser.reset()  # the next parse starts afresh, not from the abandoned state
            raise ParseAborted from None

    def _parse_region(self) -> tree_sitter.Tree:
        """Parse the top-level nodes that the changes since the last whole parse touched."""
        assert self._dirty is not None, "a region needs a change"
        if self._region_parser is None:
            self._region_parser = tree_sitter.Parser(self._parser.language)
        parser = self._region_parser
        parser.included_ranges = byte_ranges(self.source, self.enclosing_ranges(*self._dirty))
        return self._parse(parser, None)

    def enclosing_ranges(self, lo: int, hi: int) -> list[tuple[int, int]]:
        """Byte ranges that parse on their own the way they parse in the file, around bytes [lo, hi).

        The core is the top-level nodes around the change, in whole lines (the grammar sees
        the first line's indentation and the last line break, where an indentation-based
        scanner closes its blocks). A core larger than `region_bytes` that is one node
        (a class, a namespace) is narrowed to that node's members around the change, and
        the container's opening and closing (`class Big {` ... `}`, `class A:`) come along
        as ranges of their own, level by level. Taken from the latest whole-document tree
        without a top-level ERROR node where the document was changed (see `_outline`).
        """
        source, size = self.source, len(self.source)
        if self._outline is None:
            return [(0, size)]
        container = self._outline.root_node
        heads: list[tuple[int, int]] = []
        tails: list[tuple[int, int]] = []
        while True:
            first = _top_level_at(container, lo, before=True)
            last = _top_level_at(container, hi, before=False)
            while first is not None and first.is_extra and first.prev_sibling is not None:
                first = first.prev_sibling  # a comment belongs to the definition it sits in (or before)
            is_root = container.parent is None
            outer_start, outer_end = (0, size) if is_root else (container.start_byte, container.end_byte)
            start = min(first.start_byte if first is not None else outer_start, lo)
            end = max(last.end_byte if last is not None else outer_end, hi)
            if not is_root:
                _add_head(heads, source, container, start)
                _add_tail(tails, source, container, end)
            floor = heads[-1][1] if heads else 0
            ceiling = tails[-1][0] if tails else size
            start = max(source.rfind(b"\n", 0, start) + 1, floor)
            line_end = source.find(b"\n", end)
            end = min(size if line_end < 0 else line_end + 1, ceiling)
            if end - start <= self.region_bytes or first is None or first != last or first.child_count == 0:
                break
            after = first.next_sibling
            if after is not None and not after.is_named and after.end_byte - first.end_byte <= _SMALL:
                tails.append((first.end_byte, after.end_byte))  # the `;` of `class A { ... };`
            container = first
        return _merge([*heads, (start, end), *reversed(tails)])

    def snapshot(self) -> SyntaxDocument:
        """This document as it is now, for work that must see this revision while the document
        moves on (or that edits a private copy): text shared, trees copied (O(1) in tree-sitter)."""
        copy = object.__new__(SyntaxDocument)
        copy.__dict__.update(self.__dict__)
        copy.memo = dict(self.memo)  # derived values, each validated by revision
        copy._history = self._history.copy()
        copy._region_parser = None
        for name in ("tree", "_full", "_outline"):
            tree = getattr(self, name)
            setattr(copy, name, tree.copy() if tree is not None else None)
        if self._outline is self._full:
            copy._outline = copy._full
        if self.tree is self._full:
            copy.tree = copy._full
        return copy

    @property
    def whole_tree(self) -> tree_sitter.Tree | None:
        """The whole document's tree: `tree` itself unless `stale` (see the module docstring)."""
        return self._full

    def unchanged_since(self, revision: int) -> tuple[int, int] | None:
        """(head, tail): how many chars at the start and at the end of the text no change since
        `revision` touched; None when that revision is older than the remembered history."""
        return self._history.unchanged_since(revision, len(self.text))

    # --- offsets ------------------------------------------------------------------

    @property
    def is_ascii(self) -> bool:
        """True when str offsets and byte offsets coincide."""
        return len(self.source) == len(self.text)

    def byte_offset(self, offset: int) -> int:
        """UTF-8 byte offset of a str offset."""
        if self.is_ascii:
            return offset
        chunk = offset // OFFSET_CHUNK
        start = chunk * OFFSET_CHUNK
        return self._checkpoints()[chunk] + len(self.text[start:offset].encode("utf-8"))

    def str_offset(self, byte_offset: int) -> int:
        """Str offset of a UTF-8 byte offset (which must sit on a character boundary)."""
        if self.is_ascii:
            return byte_offset
        checkpoints = self._checkpoints()
        chunk = min(bisect.bisect_right(checkpoints, byte_offset), len(checkpoints) - 1) - 1
        if chunk < 0:  # an empty text
            return 0
        tail = self.source[checkpoints[chunk]:byte_offset].decode("utf-8", errors="replace")
        return chunk * OFFSET_CHUNK + len(tail)

    def _checkpoints(self) -> list[int]:
        """The byte offset of every OFFSET_CHUNK-th char and of the end, for this revision."""
        memo = self.memo.get("offset_checkpoints")
        if memo is not None and memo[0] == self.revision:
            return memo[1]
        text = self.text
        checkpoints, total = [0], 0
        for start in range(0, len(text), OFFSET_CHUNK):
            total += len(text[start:start + OFFSET_CHUNK].encode("utf-8"))
            checkpoints.append(total)
        self.memo["offset_checkpoints"] = (self.revision, checkpoints)
        return checkpoints

    def row_of(self, offset: int) -> int:
        """The row of a str offset, counted from the nearest point whose row is known.

        Typing moves the cursor a little at a time: counting from the previous point (the
        latest edit, or the latest row asked for) instead of from the start of the file
        saves tens of microseconds per call in a 10,000-line file."""
        mark, row = self._row_mark
        if offset >= mark:
            row += self.text.count("\n", mark, offset)
        elif offset > mark // 2:
            row -= self.text.count("\n", offset, mark)
        else:
            row = self.text.count("\n", 0, offset)
        self._row_mark = (offset, row)
        return row

    def _locate(self, offset: int) -> tuple[int, tuple[int, int]]:
        """(byte offset, (row, byte column)) of a str offset."""
        text = self.text
        row = self.row_of(offset)
        line_start = text.rfind("\n", 0, offset) + 1
        if self.is_ascii:
            return offset, (row, offset - line_start)
        column = len(text[line_start:offset].encode("utf-8"))
        return self.byte_offset(offset), (row, column)

    def node_span(self, node: tree_sitter.Node) -> tuple[int, int]:
        """Str offsets [start, end) of a node."""
        if self.is_ascii:
            return node.start_byte, node.end_byte
        return self.str_offset(node.start_byte), self.str_offset(node.end_byte)


def _merge_dirty(dirty: tuple[int, int] | None, start: int, old_end: int, new_end: int) -> tuple[int, int]:
    """The changed byte span after one more edit, in the edited text's coordinates."""
    if dirty is None:
        return start, new_end
    lo, hi = dirty
    delta = new_end - old_end
    hi = hi + delta if hi >= old_end else max(hi, new_end)
    return min(lo, start), max(hi, new_end)


def _top_level_at(root: tree_sitter.Node, byte: int, *, before: bool) -> tree_sitter.Node | None:
    """The root's child that contains `byte`; else its nearest neighbour before (or after) it."""
    # Bisection over `child(i)`: `root.children` would build a Python node for every top-level
    # definition of a 10,000-line file, on every keystroke.
    count = root.child_count
    if not count:
        return None
    lo, hi = 0, count
    while lo < hi:  # the first child ending after `byte`
        mid = (lo + hi) // 2
        if root.child(mid).end_byte <= byte:
            lo = mid + 1
        else:
            hi = mid
    if lo < count and (child := root.child(lo)).start_byte <= byte:
        return child
    if before:
        return root.child(lo - 1) if lo > 0 else None
    return root.child(lo) if lo < count else None


def _add_head(heads: list[tuple[int, int]], source: bytes, container: tree_sitter.Node, start: int) -> None:
    """The container's part before its members at `start`: all of it when small, else its opening token.

    It ends at a line break where it can, so the members' first line keeps its own indentation."""
    opening = container.start_byte
    if start - opening <= _SMALL:
        newline = source.rfind(b"\n", opening, start)
        end = newline + 1 if newline >= 0 else start
    elif container.child_count and not container.children[0].is_named and container.children[0].end_byte <= start:
        token_end = container.children[0].end_byte
        newline = source.find(b"\n", token_end, start)
        end = newline + 1 if newline >= 0 else token_end
    else:
        return
    if end > opening:
        heads.append((opening, end))


def _add_tail(tails: list[tuple[int, int]], source: bytes, container: tree_sitter.Node, end: int) -> None:
    """The container's part after its members ending at `end`: all of it when small, else its closing token.

    It starts after the members' last line break where it can (the members keep it)."""
    closing = container.end_byte
    if closing - end <= _SMALL:
        newline = source.find(b"\n", end, closing)
        start = newline + 1 if newline >= 0 else end
    elif container.child_count and not container.children[-1].is_named and container.children[-1].start_byte >= end:
        start = container.children[-1].start_byte
        line_start = source.rfind(b"\n", end, start) + 1
        start = line_start if line_start > end else start
    else:
        return
    if closing > start:
        tails.append((start, closing))


def _merge(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted, non-empty, non-overlapping ranges (tree-sitter's rule for included ranges)."""
    merged: list[tuple[int, int]] = []
    for start, end in sorted(r for r in ranges if r[1] > r[0]):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def byte_points(source: bytes, offsets: list[int], *, known: tuple[int, int] = (0, 0)) -> list[tuple[int, int]]:
    """(row, byte column) of each of the ascending byte `offsets` of `source`, as tree-sitter counts them.

    `known`: (byte, row) of a point at or before the first offset whose row is known (the
    same in every version of a text that only changed after it). Rows are counted from
    there, once across all offsets: counting from the start of a 10,000-line file for
    every point costs tens of microseconds each, several times per keystroke."""
    byte, row = known
    points = []
    for offset in offsets:
        assert offset >= byte, f"offset {offset} before the previous one ({byte})"
        row += source.count(b"\n", byte, offset)
        points.append((row, offset - (source.rfind(b"\n", 0, offset) + 1)))
        byte = offset
    return points


def byte_ranges(source: bytes, spans: list[tuple[int, int]], *, known: tuple[int, int] = (0, 0)) -> list[tree_sitter.Range]:
    """Tree-sitter Ranges for ascending, non-overlapping byte spans of `source` (see `byte_points`)."""
    points = byte_points(source, [byte for span in spans for byte in span], known=known)
    return [tree_sitter.Range(points[2 * i], points[2 * i + 1], start, end) for i, (start, end) in enumerate(spans)]
