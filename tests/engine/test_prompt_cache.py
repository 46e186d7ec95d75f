"""The prompt cache is bounded by the bytes of its snapshots (real encoder caches of the tiny model)."""

from __future__ import annotations

import pytest
import torch

from dgemma_lsp.engine.runtime.prompt_cache import PromptCache, cache_bytes


@pytest.fixture(autouse=True)
def _no_grad():
    with torch.no_grad():  # as in DenoisingRuntime.run: snapshots are deep-copied, which needs leaf tensors
        yield


def _ids(length: int, start: int = 10) -> list[int]:
    return [start + i % 500 for i in range(length)]


def test_snapshots_are_evicted_least_recently_used_first_when_their_bytes_exceed_the_budget(runtime):
    encode = runtime._encode_fresh
    one = cache_bytes(encode(_ids(40)))
    assert one > 0
    cache = PromptCache(max_bytes=int(2.5 * one))
    for document in ("a", "b"):
        cache.checkout(document, _ids(40), encode)
    assert cache.bytes == 2 * one
    assert cache.checkout("a", _ids(40), encode)[1] == 40  # hit: "a" is now the most recent
    cache.checkout("c", _ids(40), encode)
    assert len(cache) == 2 and cache.bytes == 2 * one
    assert cache.checkout("b", _ids(40), encode)[1] == 0  # "b" was the least recently used: gone
    assert cache.bytes <= cache.max_bytes


def test_forget_frees_a_document_and_a_snapshot_over_budget_is_used_but_not_kept(runtime):
    encode = runtime._encode_fresh
    cache = PromptCache(max_bytes=10**9)
    cache.checkout("doc", _ids(30), encode)
    assert cache.bytes > 0
    cache.forget("doc")
    assert cache.bytes == 0 and len(cache) == 0

    cache.resize(1)
    fresh, cached_tokens = cache.checkout("big", _ids(30), encode)
    assert cached_tokens == 0 and cache_bytes(fresh) > 0
    assert cache.bytes == 0 and len(cache) == 0


def test_a_changed_stable_part_replaces_the_documents_snapshot(runtime):
    encode = runtime._encode_fresh
    cache = PromptCache(max_bytes=10**9)
    cache.checkout("doc", _ids(30), encode)
    cache.checkout("doc", _ids(60, start=20), encode)
    assert len(cache) == 1 and cache.bytes == cache_bytes(encode(_ids(60, start=20)))
