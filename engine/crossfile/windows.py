"""Similar windows of the linked files: which names code like the cursor's uses.

Owns, per indexed file, its windows (8 lines every 4, made of 2-line chunks) as an inverted list
(identifier -> the windows that use it) and each chunk's identifiers (a window's names are those
of its chunks and of the chunk after it: what followed that code); computed once per outline the
index holds for the file (a re-indexed file gets new windows), from the text it outlined: an open
document's buffer (its unsaved edits), else the file on disk.
`names_near` matches the identifiers of the last QUERY_LINES non-blank lines before the cursor's
line and the first AFTER_LINES after it (never the cursor's line: the result stays put while the
user types on it) against the windows of the files the choice already considers (RepoCoder's and
Copilot's similar windows, used here to rank names rather than to show code): similarity is the
share of the query's rarity (a name's rarity: the log of files over the files that mention it)
that a window also uses, and each name scores the similarity of the most similar window that uses
it (or whose next lines do): a weak best match boosts little.
`names_alongside` asks the same windows another question: over *all* the windows that use each name of
the query (not the few most like it), which names come with them, more than they come anywhere
(item-to-item co-occurrence with a lift, as recommenders rank "used together"): `isUntyped` comes
with `isInteger` and `operand` wherever they are, whatever the code in between.
Knows nothing of tree-sitter, tokens or LSP.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

from .files import read_source
from .neighbours import identifiers

CHUNK_LINES = 2
"""Lines per chunk: a file is read as chunks, and windows and what follows them are made of chunks."""
WINDOW_CHUNKS = 4
"""Chunks per window (8 lines)."""
STEP_CHUNKS = 2
"""Windows start every this many chunks (4 lines)."""
NEXT_CHUNKS = 1
"""Chunks after a window whose names count as its own (the 2 lines that followed that code)."""
QUERY_LINES = 8
"""Non-blank lines before the cursor's line matched against the windows (with AFTER_LINES after it)."""
AFTER_LINES = 2
"""Non-blank lines after the cursor's line that join the query."""
LAST_LINES = 2
LAST_WEIGHT = 3.0
"""The rarity of the names of the query's last LAST_LINES lines counts this many times."""
TOP_WINDOWS = 64
"""Most similar windows whose names score."""
MIN_SIMILARITY = 0.1
"""A window sharing less of the query's rarity than this is noise."""
MAX_FILES = 400
"""Files whose windows are remembered (the least recently used are forgotten)."""
ALONGSIDE_WINDOWS = 100
"""Windows of one query name that `names_alongside` reads at most (evenly spread over them)."""
LIFT = 0.7
"""`names_alongside` divides by a name's own share of the windows to this power: a name that comes with
everything (`err`, `self`) says little, but a rare one is not trusted in full (1 would rank noise up)."""


class _Windows:
    """One file's windows: identifier -> the windows using it (each its first chunk's number), and
    each chunk's identifiers."""

    __slots__ = ("outline", "postings", "chunks", "_names")

    def __init__(self, outline: object, postings: dict[str, list[int]], chunks: list[frozenset[str]]) -> None:
        self.outline, self.postings, self.chunks = outline, postings, chunks
        self._names: dict[int, frozenset[str]] = {}

    def names(self, window: int) -> frozenset[str]:
        """What the window and the lines after it use."""
        found = self._names.get(window)
        if found is None:
            found = self._names[window] = frozenset().union(*self.chunks[window:window + WINDOW_CHUNKS + NEXT_CHUNKS])
        return found

    @property
    def count(self) -> int:
        """How many windows the file has."""
        return len(range(0, max(1, len(self.chunks) - WINDOW_CHUNKS + 1), STEP_CHUNKS))


class FileWindows:
    """Per file: its windows, kept while the index holds the same outline for it."""

    def __init__(self) -> None:
        self._files: OrderedDict[str, _Windows] = OrderedDict()

    def __contains__(self, path: str) -> bool:
        """Whether the windows of `path` are made (for some outline of it)."""
        return path in self._files

    def of(self, path: str, outline: object, text: str | None = None) -> _Windows:
        """The windows of `path` as indexed (`outline`: the index's entry, which changes when the file does),
        read from `text` (an open document's buffer, which the index outlined) or else from disk."""
        cached = self._files.get(path)
        if cached is not None and cached.outline is outline:
            self._files.move_to_end(path)
            return cached
        lines = (text if text is not None else read_source(path) or "").split("\n")
        chunks = [identifiers("\n".join(lines[start:start + CHUNK_LINES])) for start in range(0, len(lines), CHUNK_LINES)]
        postings: dict[str, list[int]] = {}
        for window in range(0, max(1, len(chunks) - WINDOW_CHUNKS + 1), STEP_CHUNKS):
            for name in frozenset().union(*chunks[window:window + WINDOW_CHUNKS]):
                found = postings.get(name)
                if found is None:
                    postings[name] = [window]
                else:
                    found.append(window)
        entry = self._files[path] = _Windows(outline, postings, chunks)
        self._files.move_to_end(path)
        while len(self._files) > MAX_FILES:
            self._files.popitem(last=False)
        return entry

    def names_near(self, before: str, files: list[tuple[str, object]],
                   rarity: Callable[[str], float], after: str,
                   open_texts: dict[str, str] | None = None) -> dict[str, float]:
        """Name -> similarity (0-1: the share of the query's rarity it shares) of the most similar
        window of `files` ((path, outline) each) that uses it, against the last lines of `before`
        and the first of `after`. `open_texts`: path -> buffer of the open documents (their unsaved
        code, as the index has it)."""
        weights = _query(before, after, rarity)
        total = sum(weights.values())
        if not total:
            return {}
        looked_up = [(name, weight) for name, weight in weights.items() if weight > 0]  # not keywords
        floor = MIN_SIMILARITY * total
        best: list[tuple[float, int, int]] = []
        entries = []
        for number, (path, outline) in enumerate(files):
            windows = self.of(path, outline, open_texts.get(path) if open_texts else None)
            entries.append(windows)
            shared: dict[int, float] = {}
            for name, weight in looked_up:
                for window in windows.postings.get(name, ()):
                    shared[window] = shared.get(window, 0.0) + weight
            best.extend((-value, number, window) for window, value in shared.items() if value >= floor)
        if not best:
            return {}
        best.sort()  # most similar first; ties in file order, then line order (deterministic)
        scores: dict[str, float] = {}
        for value, number, window in best[:TOP_WINDOWS]:
            similarity = -value / total
            for name in entries[number].names(window):
                if name not in scores:
                    scores[name] = similarity
        return scores

    def names_alongside(self, before: str, files: list[tuple[str, object]], rarity: Callable[[str], float],
                        after: str, wanted: frozenset[str], open_texts: dict[str, str] | None = None) -> dict[str, float]:
        """Name (of `wanted`) -> how much more than anywhere it comes in the windows of `files` that use
        the query's names (the query of `names_near`): for each query name, the share of its windows
        that also use the name (weighted by the query name's share of the query's rarity), summed,
        times (all windows / the windows using the name) ** LIFT."""
        weights = _query(before, after, rarity)
        total = sum(weights.values())
        if not total or not wanted:
            return {}
        entries = [self.of(path, outline, open_texts.get(path) if open_texts else None) for path, outline in files]
        found: dict[str, float] = {}
        for name, weight in weights.items():
            if weight <= 0:
                continue
            windows = [(entry, window) for entry in entries for window in entry.postings.get(name, ())]
            if not windows:
                continue
            windows = windows[:: len(windows) // ALONGSIDE_WINDOWS + 1]
            share = weight / total / len(windows)
            for entry, window in windows:
                for other in entry.names(window) & wanted:
                    found[other] = found.get(other, 0.0) + share
        every = sum(entry.count for entry in entries)
        return {name: value * (every / (1 + sum(len(entry.postings.get(name, ())) for entry in entries))) ** LIFT
                for name, value in found.items()}


def _query(before: str, after: str, rarity: Callable[[str], float]) -> dict[str, float]:
    """The names of the last QUERY_LINES non-blank lines before the cursor's line and the first
    AFTER_LINES after it, each weighing its rarity (LAST_WEIGHT times in the last LAST_LINES lines)."""
    query_lines = [line for line in before.split("\n") if line.strip()][-QUERY_LINES:]
    # Sorted: the sums over it add in one order whatever the hash seed (the same choice every run).
    weights = {name: rarity(name) for name in sorted(identifiers("\n".join(query_lines)))}
    # The code after the cursor's line is like what follows the similar code elsewhere.
    after_lines = [line for line in after.split("\n") if line.strip()][:AFTER_LINES]
    for name in sorted(identifiers("\n".join(after_lines))):
        weights.setdefault(name, rarity(name))
    for name in identifiers("\n".join(query_lines[-LAST_LINES:])):  # the code the next line continues
        weights[name] *= LAST_WEIGHT
    return weights
