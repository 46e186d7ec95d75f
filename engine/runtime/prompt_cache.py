"""Per-document encoder KV snapshots of the stable prompt part, bounded in bytes.

On each keystroke only the prompt's tail changes, so the encoder cache of the
stable part is kept per document and restored by deep copy; only the tail is
encoded again. Snapshot/restore rather than DynamicCache.crop(): crop fails once
the prompt is longer than the sliding window (shared/REFERENCE.md), and generate
mutates the cache it is handed, so the snapshot itself must never be handed out.

Snapshots live on the model's device, so the cache is bounded by their bytes
(`max_bytes`), not by their number: a 60k-token prompt costs hundreds of times
what a 200-token one does. Least recently used snapshots go first; a snapshot
bigger than the whole budget is used for its request and not kept. A closed
document's snapshot is dropped at once (`forget`). The budget counts kept
snapshots only: the private copy a running request holds comes on top.
Knows torch caches; knows nothing of prompts' meaning or of devices.
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

EncodeFn = Callable[[list[int]], Any]
"""Encodes ids into a fresh cache and returns that cache."""

DEFAULT_MAX_BYTES = 256 * 1024**2
"""Budget until the runtime sizes it from the memory left after loading."""


class PromptCache:
    """An LRU of (stable ids, encoder cache snapshot) keyed by document, at most `max_bytes` of snapshots."""

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[str, tuple[tuple[int, ...], Any, int]] = OrderedDict()
        self._bytes = 0

    @property
    def bytes(self) -> int:
        """Bytes of the snapshots kept now."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)

    def checkout(self, key: str | None, stable_ids: list[int], encode: EncodeFn) -> tuple[Any, int]:
        """A private, mutable cache holding `stable_ids` encoded, and how many ids came from the cache.

        A hit deep-copies the snapshot; a miss encodes, stores a snapshot (when it fits the
        budget), and hands out a copy.
        """
        if key is None:
            return encode(stable_ids), 0
        wanted = tuple(stable_ids)
        entry = self._entries.get(key)
        if entry is not None and entry[0] == wanted:
            self._entries.move_to_end(key)
            return copy.deepcopy(entry[1]), len(stable_ids)
        self.forget(key)  # the document's old snapshot is stale: free it before encoding the new one
        snapshot = encode(stable_ids)
        size = cache_bytes(snapshot)
        if size <= self.max_bytes:
            self._entries[key] = (wanted, snapshot, size)
            self._bytes += size
            self._evict()
            return copy.deepcopy(snapshot), 0
        return snapshot, 0  # too big to keep: the request may have it, nobody else will

    def resize(self, max_bytes: int) -> None:
        """Change the budget; evicts at once when it shrank."""
        self.max_bytes = max_bytes
        self._evict()

    def forget(self, key: str) -> None:
        """Drop a document's snapshot (it was closed, or it is stale)."""
        entry = self._entries.pop(key, None)
        if entry is not None:
            self._bytes -= entry[2]

    def clear(self) -> None:
        self._entries.clear()
        self._bytes = 0

    def _evict(self) -> None:
        while self._bytes > self.max_bytes and self._entries:
            _, (_, _, size) = self._entries.popitem(last=False)
            self._bytes -= size


def cache_bytes(cache: Any) -> int:
    """Bytes of every tensor a transformers cache holds (keys and values of each layer)."""
    import torch

    seen: set[int] = set()
    total = 0

    def visit(value: Any) -> None:
        nonlocal total
        if isinstance(value, torch.Tensor):
            if value.data_ptr() not in seen:
                seen.add(value.data_ptr())
                total += value.numel() * value.element_size()
        elif isinstance(value, list | tuple):
            for item in value:
                visit(item)

    for layer in getattr(cache, "layers", []):
        visit(getattr(layer, "keys", None))
        visit(getattr(layer, "values", None))
    return total
