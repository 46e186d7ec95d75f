"""Per-document encoder KV snapshots of the stable prompt part.

On each keystroke only the prompt's tail changes, so the encoder cache of the
stable part is kept per document and restored by deep copy; only the tail is
encoded again. Snapshot/restore rather than DynamicCache.crop(): crop fails once
the prompt is longer than the sliding window (shared/REFERENCE.md), and generate
mutates the cache it is handed, so the snapshot itself must never be handed out.
Knows torch caches; knows nothing of prompts' meaning.
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

EncodeFn = Callable[[list[int]], Any]
"""Encodes ids into a fresh cache and returns that cache."""


class PromptCache:
    """An LRU of (stable ids, encoder cache snapshot) keyed by document."""

    def __init__(self, max_documents: int = 8) -> None:
        self.max_documents = max_documents
        self._entries: OrderedDict[str, tuple[tuple[int, ...], Any]] = OrderedDict()

    def checkout(self, key: str | None, stable_ids: list[int], encode: EncodeFn) -> tuple[Any, int]:
        """A private, mutable cache holding `stable_ids` encoded, and how many ids came from the cache.

        A hit deep-copies the snapshot; a miss encodes, stores a snapshot, and hands out a copy.
        """
        if key is None:
            return encode(stable_ids), 0
        wanted = tuple(stable_ids)
        entry = self._entries.get(key)
        if entry is not None and entry[0] == wanted:
            self._entries.move_to_end(key)
            return copy.deepcopy(entry[1]), len(stable_ids)
        snapshot = encode(stable_ids)
        self._entries[key] = (wanted, snapshot)
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_documents:
            self._entries.popitem(last=False)
        return copy.deepcopy(snapshot), 0

    def forget(self, key: str) -> None:
        """Drop a document's snapshot (it was closed)."""
        self._entries.pop(key, None)

    def clear(self) -> None:
        self._entries.clear()
