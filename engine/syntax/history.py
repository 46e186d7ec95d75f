"""Which part of a text no change has touched since a revision: the recent-change log.

Both sides of an open document keep one. The server's text on the event loop uses it so
the completion cache can prove a cached answer's surroundings unchanged without reading
them; the worker's `SyntaxDocument` uses it so context.py can reuse a memoized context.
Knows nothing of trees, LSP or models.
"""

from __future__ import annotations

from collections import deque

HISTORY = 256
"""How many recent changes `unchanged_since` can look back over."""


class ChangeHistory:
    """The last HISTORY changes of a text as (revision, start, tail length).

    A cache asks about several revisions per lookup, newest first. A query for an
    older revision than the previous one continues that backward walk instead of
    starting again, so the whole series costs one pass over the history, not one
    per entry.
    """

    def __init__(self, capacity: int = HISTORY) -> None:
        self._changes: deque[tuple[int, int, int]] = deque(maxlen=capacity)
        self._floor = 0
        """The text was replaced as a whole at this revision: nothing older is known."""
        self._walk: tuple[int, int, int, int] | None = None
        """(revision asked, index reached, head, tail) of the latest query, until the next change."""

    def record(self, revision: int, start: int, tail_len: int) -> None:
        """A change at `revision` touched the text from `start` to `tail_len` chars before its end."""
        self._changes.append((revision, start, tail_len))
        self._walk = None

    def reset(self, revision: int) -> None:
        """The whole text was replaced at `revision`."""
        self._changes.clear()
        self._floor = revision
        self._walk = None

    def copy(self) -> ChangeHistory:
        copy = ChangeHistory(self._changes.maxlen or HISTORY)
        copy._changes.extend(self._changes)
        copy._floor = self._floor
        return copy

    def unchanged_since(self, revision: int, length: int) -> tuple[int, int] | None:
        """(head, tail): how many chars at the start and at the end of the text (now `length`
        chars long) no change since `revision` touched; None when that revision is older
        than the remembered history."""
        changes = self._changes
        if revision < self._floor or (len(changes) == changes.maxlen and changes[0][0] > revision + 1):
            return None
        walk = self._walk
        if walk is not None and walk[0] >= revision:
            _, index, head, tail = walk
        else:
            index, head, tail = len(changes), length, length
        while index > 0 and changes[index - 1][0] > revision:
            index -= 1
            _, start, tail_len = changes[index]
            head = min(head, start)
            tail = min(tail, tail_len)
        self._walk = (revision, index, head, tail)
        return head, tail
