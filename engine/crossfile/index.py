"""The workspace index: every workspace file's outline (top-level definitions and imports), bounded.

Owns the outlines by absolute path, the lookup tables built from them (files per
directory, Java classes, file names, how many definitions carry each word), the
files that mention each identifier, the project files import resolution reads (go.mod, tsconfig.json, Cargo.toml roots) and the
generations that tell a caller whether anything it used changed. Built a few files at a
time by `build_step` (the language server runs it on its syntax worker while the client is
quiet, so never on a keystroke's path), and kept current by `update` / `remove`. It never
holds more than `Bounds.max_files` files or `Bounds.max_bytes` bytes of source, however the
files arrive. Not thread-safe: one thread (the syntax worker) owns it.
Knows nothing of documents, cursors, tokens or LSP.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
from collections import Counter
from collections.abc import Callable

from .files import Bounds, indexable_language, read_source, walk
from .outline import Outline, read_outline

_USE = re.compile(r"[A-Za-z_$][A-Za-z0-9_$]{2,}")
"""Identifiers of 3 characters or more: what counts as a file mentioning a name."""
MAX_TRIES = 4
"""Parses of one file a keystroke may cut short; the next one runs to its end (one bounded wait)."""


class WorkspaceIndex:
    """Outlines of a workspace's files."""

    def __init__(self, root: str, bounds: Bounds | None = None) -> None:
        self.root = os.path.abspath(root)
        self.bounds = bounds or Bounds()
        self.files: dict[str, Outline] = {}
        self.sizes: dict[str, int] = {}
        self.by_dir: dict[str, set[str]] = {}
        self.by_name: dict[str, set[str]] = {}
        """File name -> paths (C/C++ includes are found by their tail)."""
        self.word_counts: Counter[str] = Counter()
        """Definitions that carry each word (retrieval weighs rare words up)."""
        self.uses: dict[str, tuple[str, ...]] = {}
        """Per file: the identifiers it mentions (interned, so shared across files)."""
        self.use_counts: Counter[str] = Counter()
        """Files that mention each identifier (a definition many files use is likely used again)."""
        self.generation = 0
        """Bumped by every change to the index."""
        self._generation_of: dict[str, int] = {}
        """Changes to each path (generation minus this: the changes to every other file)."""
        self._bytes = 0
        self._walk = None
        self._interrupted: list[tuple[str, int]] = []
        self._tries: dict[str, int] = {}
        self.complete = False
        """Whether the initial walk has finished (or hit its bounds)."""
        self._project_files: dict[tuple[str, str], object] = {}

    # -- reading -------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.files)

    @property
    def bytes(self) -> int:
        return self._bytes

    def outline(self, path: str) -> Outline | None:
        return self.files.get(path)

    def generation_without(self, path: str) -> int:
        """Changes to every file but `path` (what a prompt for `path` depends on)."""
        return self.generation - self._generation_of.get(path, 0)

    def users(self, name: str) -> int:
        """How many indexed files mention `name` (its own file included)."""
        return self.use_counts.get(name, 0)

    def idf(self, word: str) -> float:
        return math.log(1 + (len(self.files) + 1) / (1 + self.word_counts.get(word, 0)))

    def relative(self, path: str) -> str:
        relative = os.path.relpath(path, self.root)
        return path if relative.startswith("..") else relative.replace(os.sep, "/")

    def contains(self, path: str) -> bool:
        return path == self.root or path.startswith(self.root + os.sep)

    # -- building ------------------------------------------------------------------------------

    def build_step(self, should_stop: Callable[[], bool]) -> bool:
        """Index walked files until `should_stop()` (checked between files); True once the walk is done."""
        if self.complete:
            return True
        if self._walk is None:
            self._walk = walk(self.root, self.bounds)
        while self._interrupted:  # parses cut short by a keystroke, first
            path, size = self._interrupted[-1]
            if not self._index_walked(path, size, should_stop):
                return False
            self._interrupted.pop()
        for path, size in self._walk:
            if not self._index_walked(path, size, should_stop):
                self._interrupted.append((path, size))
                return False
            if should_stop():
                return False
        self.complete = True
        self._walk = None
        return True

    def _index_walked(self, path: str, size: int, should_stop: Callable[[], bool]) -> bool:
        """Index one walked file; False when its parse was stopped (it is tried again, up to MAX_TRIES)."""
        if path in self.files:
            return True
        text = read_source(path, size)
        if text is None:
            return True
        tries = self._tries.get(path, 0) + 1
        self._tries[path] = tries
        stored = self._store(path, text, should_stop if tries < MAX_TRIES else None)
        return stored is not None

    def build(self) -> None:
        """The whole walk at once (one-shot commands, benchmarks)."""
        self.build_step(lambda: False)

    def update(self, path: str, text: str | None = None) -> bool:
        """(Re)index one file, from `text` or from disk; False when it is outside the index's rules."""
        path = os.path.abspath(path)
        if not self.contains(path) or indexable_language(path) is None or _in_skipped_dir(self.root, path):
            return False
        if text is None:
            text = read_source(path)
        if text is None or len(text) > self.bounds.max_bytes:
            self.remove(path)
            return False
        if path not in self.files and len(self.files) >= self.bounds.max_files:
            return False
        self._store(path, text)
        return True

    def remove(self, path: str) -> None:
        path = os.path.abspath(path)
        outline = self.files.pop(path, None)
        if outline is None:
            return
        self._bytes -= self.sizes.pop(path, 0)
        self.by_dir.get(os.path.dirname(path), set()).discard(path)
        self.by_name.get(os.path.basename(path), set()).discard(path)
        self.word_counts.subtract(word for definition in outline.definitions for word in definition.words)
        self.use_counts.subtract(self.uses.pop(path, ()))
        self._changed(path)

    def _store(self, path: str, text: str, should_stop: Callable[[], bool] | None = None) -> bool | None:
        """Index `path` as `text`: True, or False when a bound keeps it out; None when stopped."""
        size = len(text.encode("utf-8")) if not text.isascii() else len(text)
        old = self.sizes.get(path, 0)
        if self._bytes - old + size > self.bounds.max_bytes:
            return False  # the byte bound holds: this file stays out
        outline = read_outline(text, indexable_language(path) or "plaintext", should_stop)
        if outline is None:
            return None
        if path in self.files:
            self.remove(path)
        self.files[path] = outline
        self.sizes[path] = size
        self._bytes += size
        self.by_dir.setdefault(os.path.dirname(path), set()).add(path)
        self.by_name.setdefault(os.path.basename(path), set()).add(path)
        self.word_counts.update(word for definition in outline.definitions for word in definition.words)
        uses = tuple(sys.intern(name) for name in set(_USE.findall(text)))
        self.uses[path] = uses
        self.use_counts.update(uses)
        self._changed(path)
        return True

    def _changed(self, path: str) -> None:
        self.generation += 1
        self._generation_of[path] = self._generation_of.get(path, 0) + 1
        self._project_files.clear()

    # -- project files import resolution reads ---------------------------------------------------

    def nearest(self, start_dir: str, name: str) -> str | None:
        """The nearest `name` (a file) in `start_dir` or above it, within the workspace (or its parent)."""
        key = (start_dir, name)
        if key not in self._project_files:
            found = None
            directory = start_dir
            while True:
                candidate = os.path.join(directory, name)
                if os.path.isfile(candidate):
                    found = candidate
                    break
                parent = os.path.dirname(directory)
                if parent == directory or not (self.contains(directory) or directory == self.root):
                    break
                directory = parent
            self._project_files[key] = found
        return self._project_files[key]  # type: ignore[return-value]

    def go_module(self, directory: str) -> tuple[str, str] | None:
        """(module path, module dir) of the go.mod above `directory`."""
        found = self.nearest(directory, "go.mod")
        if found is None:
            return None
        key = ("go.mod", found)
        if key not in self._project_files:
            module = None
            text = read_source(found) or ""
            match = re.search(r"^module\s+(\S+)", text, re.MULTILINE)
            if match:
                module = (match.group(1).strip('"'), os.path.dirname(found))
            self._project_files[key] = module
        return self._project_files[key]  # type: ignore[return-value]

    def ts_paths(self, directory: str) -> tuple[str, dict[str, list[str]]] | None:
        """(base dir, compilerOptions.paths) of the tsconfig.json (or jsconfig.json) above `directory`."""
        found = self.nearest(directory, "tsconfig.json") or self.nearest(directory, "jsconfig.json")
        if found is None:
            return None
        key = ("tsconfig", found)
        if key not in self._project_files:
            options = _read_jsonc(found).get("compilerOptions", {})
            options = options if isinstance(options, dict) else {}
            base = os.path.join(os.path.dirname(found), options.get("baseUrl", ".") or ".")
            paths = options.get("paths", {})
            self._project_files[key] = (os.path.normpath(base), paths if isinstance(paths, dict) else {})
        return self._project_files[key]  # type: ignore[return-value]


def _in_skipped_dir(root: str, path: str) -> bool:
    from .files import SKIPPED_DIRS

    parts = os.path.relpath(os.path.dirname(path), root).split(os.sep)
    return any(part in SKIPPED_DIRS or (part.startswith(".") and part not in (".", "..")) for part in parts)


def _read_jsonc(path: str) -> dict:
    """tsconfig.json allows comments and trailing commas: strip them (outside strings) and parse."""
    text = read_source(path) or "{}"
    text = re.sub(r'("(?:\\.|[^"\\])*")|//[^\n]*|/\*.*?\*/', lambda m: m.group(1) or "", text, flags=re.S)
    text = re.sub(r",(\s*[}\]])", r"\1", text)
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
