"""When to run the engine: cache first, then per-document latest-wins with a coalescing window.

Editors send bursts: Neovim re-requests on every cursor move and never sends
`$/cancelRequest`; VS Code cancels, but only after the next request is out.
So for each document only the newest request may do work:
  1. the cache is checked before anything waits (a repeated request, or one
     whose user typed the first characters of a cached answer, is answered at
     once — waiting first would cost the debounce on every hit);
  2. a newer request for the same document supersedes the older one: the
     older one's task is cancelled (which stops its denoising within one step)
     and it answers "nothing" instead of an error;
  3. a miss waits a short coalescing window, so a keystroke arriving right
     behind supersedes this request before any denoising starts.
Knows asyncio and the engine's Candidate type; knows nothing of LSP or models.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import msgspec

from dgemma_lsp.engine.api import Candidate

T = TypeVar("T")


class Superseded:
    """Marker result: a newer request for the same document took over."""

    def __repr__(self) -> str:
        return "SUPERSEDED"


SUPERSEDED = Superseded()


@dataclass
class _Job:
    task: asyncio.Task
    superseded: bool = False


class LatestWins:
    """At most one live request per key (document URI); the newest wins."""

    def __init__(self) -> None:
        self._jobs: dict[str, _Job] = {}

    @property
    def in_flight(self) -> int:
        """Requests still waiting or denoising."""
        return len(self._jobs)

    def live(self, key: str) -> bool:
        """Whether a request for `key` is waiting or running."""
        return key in self._jobs

    def supersede(self, key: str) -> None:
        """Cancel the live request for `key`, if any; it will answer SUPERSEDED."""
        job = self._jobs.pop(key, None)
        if job is not None and not job.task.done():
            job.superseded = True
            job.task.cancel()

    def cancel_all(self) -> None:
        for key in list(self._jobs):
            self.supersede(key)

    async def run(
        self,
        key: str,
        lookup: Callable[[], T | None],
        work: Callable[[], Awaitable[T]],
        window_s: float,
    ) -> T | Superseded:
        """Answer from `lookup` if it has something, else wait `window_s` and run `work`.

        Must be awaited by the request's own task: that task is what a newer
        request cancels, and what `$/cancelRequest` cancels (which propagates
        as CancelledError, unlike supersession).
        """
        self.supersede(key)
        hit = lookup()
        if hit is not None:
            return hit
        task = asyncio.current_task()
        assert task is not None, "LatestWins.run must run inside a task"
        job = _Job(task)
        self._jobs[key] = job
        try:
            if window_s > 0:
                await asyncio.sleep(window_s)  # the coalescing window, cancellable
            return await work()
        except asyncio.CancelledError:
            # Supersession is not an error: answer "nothing". A cancel from the
            # client as well (cancelling() stays > 0) still propagates.
            if job.superseded and task.uncancel() == 0:
                return SUPERSEDED
            raise
        finally:
            if self._jobs.get(key) is job:
                del self._jobs[key]


@dataclass(frozen=True)
class _Entry:
    cursor: int
    """Where the request's cursor was (a str offset)."""
    suffix_len: int
    """Chars from the cursor to the end of the text."""
    prefix_hash: int
    suffix_hash: int
    """hash() of text[:cursor] and text[cursor:]: a lookup compares these, never a stored text."""
    revision: int | None
    """The document's revision at the request, when the text was the document's (not virtual)."""
    requested: int
    candidates: tuple[Candidate, ...]
    longest: int
    """Chars of the longest candidate: a cursor this far past `cursor` or more cannot hit."""
    first_chars: frozenset[str]
    """The candidates' first characters: a cursor past `cursor` hits only if what was typed starts with one."""


UnchangedSince = Callable[[int], "tuple[int, int] | None"]
"""The document's change history: (head, tail) chars untouched since a revision, or None."""


def slice_hashes(text: str, offset: int) -> tuple[int, int]:
    """The hashes a cache entry for the cursor at `offset` in `text` keeps."""
    return hash(text[:offset]), hash(text[offset:])


class CompletionCache:
    """Finished completions by (key, cursor context), least recently used dropped first.

    A lookup also hits when the text between a cached cursor and the new one
    was typed by the user and is the start of a cached candidate ("typed
    ahead"): the answer is the rest of that candidate.

    Entries hold offsets and hashes, not texts. With the document's change history,
    a lookup proves the text before the cached cursor and after the new one unchanged
    without reading them; otherwise (history too short, or an edit undone) it compares
    hashes of the two slices, computed once per lookup and cursor. Python's str hash is
    64 bits: a false match is out of practical reach.
    """

    def __init__(self, capacity: int = 128) -> None:
        self.capacity = capacity
        self._entries: OrderedDict[tuple[str, int, int, int, int], _Entry] = OrderedDict()
        """Keyed by (key, cursor, suffix_len, prefix_hash, suffix_hash): one entry per cursor context,
        found without a scan when the same context is stored again."""

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self, key: str | None = None) -> None:
        if key is None:
            self._entries.clear()
        else:
            for k in [k for k in self._entries if k[0] == key]:
                del self._entries[k]

    def store(
        self,
        key: str,
        text: str,
        offset: int,
        requested: int,
        candidates: list[Candidate],
        *,
        revision: int | None = None,
        hashes: tuple[int, int] | None = None,
    ) -> None:
        """`hashes`: `slice_hashes(text, offset)`, when computed beforehand (off the event loop:
        in a 10,000-line file they take ~0.06 ms)."""
        if self.capacity <= 0:
            return
        prefix_hash, suffix_hash = hashes if hashes is not None else slice_hashes(text, offset)
        suffix_len = len(text) - offset
        context = (key, offset, suffix_len, prefix_hash, suffix_hash)
        self._entries.pop(context, None)  # a newer answer for the same context replaces it, as the newest
        self._entries[context] = _Entry(
            offset, suffix_len, prefix_hash, suffix_hash, revision, requested, tuple(candidates),
            max((len(c.text) for c in candidates), default=0), frozenset(c.text[:1] for c in candidates),
        )
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)

    def lookup(
        self,
        key: str,
        text: str,
        offset: int,
        wanted: int,
        *,
        unchanged_since: UnchangedSince | None = None,
    ) -> list[Candidate] | None:
        """Candidates for the cursor at `offset` in `text`, or None on a miss.

        `unchanged_since`, when given, is the history of the document `text` is the
        current text of (see `OpenDocument.unchanged_since`).
        """
        suffix_len = len(text) - offset
        suffix_hash: int | None = None
        prefix_hashes: dict[int, int] = {}
        for k in reversed(self._entries):  # newest first
            if k[0] != key:
                continue
            entry = self._entries[k]
            cursor = entry.cursor
            if entry.requested < wanted or entry.suffix_len != suffix_len or cursor > offset:
                continue
            if cursor < offset and (offset - cursor >= entry.longest or text[cursor] not in entry.first_chars):
                continue  # typed past the end of every candidate, or a first character none starts with
            # What the user typed since must start a candidate (the first-character test above
            # drops most entries before this slice), before the history or a hash is consulted.
            typed = text[cursor:offset]
            rest = [
                msgspec.structs.replace(c, text=c.text[len(typed):])
                for c in entry.candidates
                if c.text.startswith(typed) and len(c.text) > len(typed)
            ]
            if not rest and (typed or entry.candidates):
                continue
            intact = None
            if unchanged_since is not None and entry.revision is not None:
                untouched = unchanged_since(entry.revision)
                if untouched is not None and untouched[0] >= cursor and untouched[1] >= suffix_len:
                    intact = True  # no change since the entry reached before its cursor or after ours
            if intact is None:
                if suffix_hash is None:
                    suffix_hash = hash(text[offset:])
                if cursor not in prefix_hashes:
                    prefix_hashes[cursor] = hash(text[:cursor])
                intact = entry.suffix_hash == suffix_hash and entry.prefix_hash == prefix_hashes[cursor]
            if not intact:
                continue
            if not rest:
                return []  # a repeat of a request that had nothing to offer
            self._entries.move_to_end(k)
            return rest[:wanted]
        return None
