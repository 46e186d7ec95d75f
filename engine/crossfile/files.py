"""Which workspace files the index reads: a bounded walk that respects .gitignore.

Owns the walk's rules: `.gitignore` files at any depth (matched with `pathspec`, the
gitignore implementation black, pip-tools and many linters use: negations, directory-only
patterns, `**` and anchoring are easy to get subtly wrong by hand), hidden, vendored and
built directories skipped by name, files over MAX_FILE_BYTES, binary or minified files
skipped, and bounds on the files kept, their bytes and the directory entries looked at
(a 100,000-file tree costs a bounded walk, never a stall or unbounded memory). The walk is
a generator: the caller takes files a few at a time, between keystrokes.
Knows nothing of tree-sitter, documents or LSP.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

import pathspec

from ..syntax.languages import PLAINTEXT, language_for_path

SKIPPED_DIRS = frozenset({
    "node_modules", "bower_components", "jspm_packages", "vendor", "third_party", "third-party",
    "__pycache__", "site-packages", "venv", "env", "build", "dist", "out", "target", "coverage",
})
"""Vendored or built directories (hidden ones, `.git`, `.venv`, ..., are skipped too)."""
MAX_FILE_BYTES = 512 * 1024
"""A bigger source file is generated or vendored: not worth its parse."""
MAX_LINE_AVERAGE = 300
"""Bytes per line above which a file is minified or generated."""


@dataclass(frozen=True)
class Bounds:
    """How much of a workspace the index may take."""

    max_files: int = 5000
    """Files indexed at most."""
    max_bytes: int = 64 * 1024 * 1024
    """Source bytes read at most, over all files."""
    max_entries: int = 200_000
    """Directory entries looked at at most (a huge tree stops the walk here)."""


def _gitignore(directory: str) -> pathspec.PathSpec | None:
    try:
        with open(os.path.join(directory, ".gitignore"), encoding="utf-8", errors="replace") as file:
            lines = file.read().splitlines()
    except OSError:
        return None
    spec = pathspec.GitIgnoreSpec.from_lines(lines)
    return spec if len(spec) else None


def ignored(rules: list[tuple[str, pathspec.PathSpec]], path: str, is_dir: bool) -> bool:
    """Whether the .gitignore files above `path` (outermost first) leave it out; the deepest decides."""
    verdict = False
    for base, spec in rules:
        relative = os.path.relpath(path, base).replace(os.sep, "/") + ("/" if is_dir else "")
        result = spec.check_file(relative).include
        if result is not None:
            verdict = result
    return verdict


def indexable_language(path: str) -> str | None:
    """The file's language when the index reads that kind of file, else None."""
    language = language_for_path(path)
    return None if language == PLAINTEXT else language


def read_source(path: str, size: int | None = None) -> str | None:
    """The file's text, or None when it is too big, binary, not UTF-8 or minified."""
    try:
        if size is None:
            size = os.path.getsize(path)
        if size > MAX_FILE_BYTES:
            return None
        with open(path, "rb") as file:
            data = file.read(MAX_FILE_BYTES + 1)
    except OSError:
        return None
    if len(data) > MAX_FILE_BYTES or b"\0" in data[:8192]:
        return None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if len(data) > 4096 and len(data) / (text.count("\n") + 1) > MAX_LINE_AVERAGE:
        return None
    return text


def walk(root: str, bounds: Bounds | None = None) -> Iterator[tuple[str, int]]:
    """(path, size) of each indexable file under `root`, depth-first in name order, within `bounds`.

    Files beyond `max_bytes` are skipped (a later, smaller one may still fit); the walk ends
    at `max_files` files or `max_entries` directory entries."""
    bounds = bounds or Bounds()
    files = entries = total = 0
    stack: list[tuple[str, list]] = [(root, [])]
    while stack:
        directory, rules = stack.pop()
        own = _gitignore(directory)
        if own is not None:
            rules = [*rules, (directory, own)]
        try:
            with os.scandir(directory) as found:
                listing = sorted(found, key=lambda entry: entry.name)
        except OSError:
            continue
        subdirectories = []
        for entry in listing:
            entries += 1
            if entries > bounds.max_entries:
                return
            name = entry.name
            try:
                is_dir = entry.is_dir(follow_symlinks=False)
                is_file = not is_dir and entry.is_file(follow_symlinks=False)
            except OSError:
                continue
            if is_dir:
                if name.startswith(".") or name in SKIPPED_DIRS or ignored(rules, entry.path, True):
                    continue
                subdirectories.append(entry.path)
            elif is_file and indexable_language(name) is not None and not ignored(rules, entry.path, False):
                try:
                    size = entry.stat(follow_symlinks=False).st_size
                except OSError:
                    continue
                if size > MAX_FILE_BYTES or total + size > bounds.max_bytes:
                    continue
                total += size
                files += 1
                yield entry.path, size
                if files >= bounds.max_files:
                    return
        stack.extend((sub, rules) for sub in reversed(subdirectories))
