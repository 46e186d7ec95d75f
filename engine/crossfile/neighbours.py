"""Open documents and recent ranges: context from what the user has in front of them.

Owns two small sources. `SimilarWindows`: for each other open document, the window of
WINDOW_LINES lines most like the code before the cursor, by Jaccard similarity of their
identifier sets (Copilot's neighbouring tabs, with shorter windows: our cross-file budget
is a quarter of a 2K-token context); windows are computed once per document revision.
`RecentRanges`: a small ring of the lines recently edited or viewed, per file, deduplicated
(a new entry near an old one of the same file replaces it), like llama.vim's chunk ring.
Knows nothing of tree-sitter, tokens or LSP; lines are 0-based.
"""

from __future__ import annotations

import re
from collections import OrderedDict

import msgspec

WINDOW_LINES = 20
"""Lines per window of an open document."""
WINDOW_STEP = 5
"""Windows start every this many lines."""
MIN_JACCARD = 0.08
"""A window less similar than this is noise."""
MAX_OPEN_FILES = 20
"""Open documents looked at, most recently changed first (Copilot's limit)."""

_IDENTIFIER = re.compile(r"[A-Za-z_$][A-Za-z0-9_$]*")


class OpenFile(msgspec.Struct, frozen=True):
    """An open document as the sources see it."""

    path: str
    language: str
    text: str
    revision: int


def identifiers(text: str) -> frozenset[str]:
    return frozenset(name for name in _IDENTIFIER.findall(text) if len(name) > 1)


class SimilarWindows:
    """The best window per open document, against the identifiers before the cursor."""

    def __init__(self) -> None:
        self._windows: OrderedDict[str, tuple[int, list[tuple[int, int, frozenset[str]]]]] = OrderedDict()

    def _of(self, file: OpenFile) -> list[tuple[int, int, frozenset[str]]]:
        cached = self._windows.get(file.path)
        if cached is not None and cached[0] == file.revision:
            return cached[1]
        lines = file.text.split("\n")
        windows = []
        for start in range(0, max(1, len(lines) - WINDOW_LINES + WINDOW_STEP), WINDOW_STEP):
            end = min(len(lines), start + WINDOW_LINES)
            windows.append((start, end, identifiers("\n".join(lines[start:end]))))
        self._windows[file.path] = (file.revision, windows)
        self._windows.move_to_end(file.path)
        while len(self._windows) > MAX_OPEN_FILES * 2:
            self._windows.popitem(last=False)
        return windows

    def best(self, files: list[OpenFile], query: frozenset[str]) -> list[tuple[OpenFile, int, int, float]]:
        """(file, start line, end line, Jaccard) of each file's best window, best first."""
        found = []
        if not query:
            return found
        for file in files[:MAX_OPEN_FILES]:
            best = None
            for start, end, names in self._of(file):
                union = len(query | names)
                score = len(query & names) / union if union else 0.0
                if score >= MIN_JACCARD and (best is None or score > best[3]):
                    best = (file, start, end, score)
            if best is not None:
                found.append(best)
        found.sort(key=lambda item: -item[3])
        return found


class RecentRanges:
    """Lines recently edited or viewed, newest first, at most `capacity`, deduplicated per file."""

    def __init__(self, capacity: int = 16, merge_lines: int = 8) -> None:
        self.capacity, self.merge_lines = capacity, merge_lines
        self._entries: list[tuple[str, int, str]] = []
        """(path, line, "edited" | "viewed"), newest first."""

    def note(self, path: str, line: int, kind: str = "edited") -> None:
        entries = self._entries
        if entries and entries[0][0] == path and abs(entries[0][1] - line) <= self.merge_lines:
            if entries[0][1] == line and entries[0][2] == kind:
                return
            kind = "edited" if "edited" in (kind, entries[0][2]) else kind
            entries[0] = (path, line, kind)
            return
        self._entries = [(path, line, kind)] + [
            e for e in entries if not (e[0] == path and abs(e[1] - line) <= self.merge_lines)
        ][: self.capacity - 1]

    def forget(self, path: str) -> None:
        self._entries = [e for e in self._entries if e[0] != path]

    def others(self, path: str) -> tuple[tuple[str, int, str], ...]:
        """Entries of every file but `path`, newest first (what a prompt for `path` may show)."""
        return tuple(e for e in self._entries if e[0] != path)
