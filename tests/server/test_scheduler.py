"""The scheduler's rules with real asyncio tasks, and the completion cache's hits."""

from __future__ import annotations

import asyncio

import pytest

from dgemma_lsp.engine.api import Candidate
from dgemma_lsp.server.scheduler import SUPERSEDED, CompletionCache, LatestWins
from dgemma_lsp.server.settings import ServerSettings, decode_settings


async def test_a_newer_request_supersedes_the_older_one():
    scheduler = LatestWins()
    started, release = asyncio.Event(), asyncio.Event()

    async def slow():
        started.set()
        await release.wait()
        return "old"

    async def fast():
        return "new"

    old = asyncio.create_task(scheduler.run("doc", lambda: None, slow, 0))
    await started.wait()
    new = asyncio.create_task(scheduler.run("doc", lambda: None, fast, 0))
    assert await new == "new"
    assert await old is SUPERSEDED  # answered, not an error
    assert scheduler.in_flight == 0


async def test_other_documents_are_not_superseded():
    scheduler = LatestWins()
    started, release = asyncio.Event(), asyncio.Event()

    async def slow():
        started.set()
        await release.wait()
        return "a"

    a = asyncio.create_task(scheduler.run("a", lambda: None, slow, 0))
    await started.wait()
    assert await scheduler.run("b", lambda: None, lambda: asyncio.sleep(0, "b"), 0) == "b"
    release.set()
    assert await a == "a"


async def test_a_cache_hit_answers_without_work_and_still_supersedes():
    scheduler = LatestWins()
    started = asyncio.Event()

    async def forever():
        started.set()
        await asyncio.Event().wait()

    old = asyncio.create_task(scheduler.run("doc", lambda: None, forever, 0))
    await started.wait()
    assert await scheduler.run("doc", lambda: ["hit"], forever, 10.0) == ["hit"]
    assert await old is SUPERSEDED


async def test_a_client_cancel_propagates():
    scheduler = LatestWins()
    started = asyncio.Event()

    async def forever():
        started.set()
        await asyncio.Event().wait()

    task = asyncio.create_task(scheduler.run("doc", lambda: None, forever, 0))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert scheduler.in_flight == 0


def candidate(text: str, replace_chars: int = 0) -> Candidate:
    return Candidate(text=text, confidence=0.5, replace_chars=replace_chars)


def test_cache_hits_repeats_and_typed_ahead_prefixes():
    cache = CompletionCache()
    text = "x = foo(\n"
    cursor = text.index("(") + 1
    cache.store("doc", text, cursor, 1, [candidate("a, b)", replace_chars=0)])
    assert [c.text for c in cache.lookup("doc", text, cursor, 1)] == ["a, b)"]
    typed = text[:cursor] + "a, " + text[cursor:]
    assert [c.text for c in cache.lookup("doc", typed, cursor + 3, 1)] == ["b)"]
    diverged = text[:cursor] + "z" + text[cursor:]
    assert cache.lookup("doc", diverged, cursor + 1, 1) is None
    assert cache.lookup("other", text, cursor, 1) is None
    assert cache.lookup("doc", text, cursor, 3) is None  # wants more candidates than were asked for


def test_the_same_context_stored_again_replaces_its_entry():
    cache = CompletionCache(capacity=2)
    cursor = len("x = ")
    cache.store("doc", "y = \n", cursor, 1, [candidate("other")])
    cache.store("doc", "x = \n", cursor, 1, [candidate("first")])
    cache.store("doc", "x = \n", cursor, 1, [candidate("second")])  # the same context: one entry, the newest
    assert [c.text for c in cache.lookup("doc", "x = \n", cursor, 1)] == ["second"]
    assert [c.text for c in cache.lookup("doc", "y = \n", cursor, 1)] == ["other"]  # not pushed out by a copy


def test_cache_forgets_the_least_recently_used():
    cache = CompletionCache(capacity=2)
    for i in range(3):
        cache.store("doc", f"{i}\n", 1, 1, [candidate("x")])
    assert cache.lookup("doc", "0\n", 1, 1) is None
    assert cache.lookup("doc", "2\n", 1, 1) is not None


def test_settings_decode_flat_or_sectioned_and_name_bad_keys():
    settings, bad = decode_settings({"dgemma": {"steps": 4, "maxCandidates": 0, "debounceMs": "soon", "other": 1}})
    assert settings.steps == 4
    assert settings.max_candidates == ServerSettings().max_candidates
    assert settings.debounce_ms == ServerSettings().debounce_ms
    assert sorted(bad) == ["debounceMs", "maxCandidates"]
    layered, bad = decode_settings({"seed": 3}, settings)
    assert (layered.seed, layered.steps, bad) == (3, 4, [])
    assert decode_settings("nonsense")[1] == ["<settings>"]


def test_a_model_that_names_its_context_cuts_the_budgets_and_leaves_the_rest():
    """lsp_server.request_settings: the user's settings within the loaded model's EngineStatus.context_tokens."""
    user = ServerSettings(context_tokens=4096, cross_file_tokens=1500, steps=4)
    assert user.within_model_context(None) is user and user.within_model_context(8192) is user
    cut = user.within_model_context(160)
    assert (cut.context_tokens, cut.cross_file_budget, cut.steps) == (160, 40, 4)
    assert ServerSettings(cross_file=False).within_model_context(160).cross_file_budget == 0
    assert ServerSettings(cross_file_tokens=10).within_model_context(160).cross_file_budget == 10


def test_cache_keeps_offsets_and_hashes_not_the_text():
    cache = CompletionCache()
    text = "x = 1\n" * 50_000  # 300 KB
    cache.store("doc", text, 6, 1, [candidate("y")], revision=1)
    [entry] = cache._entries.values()
    assert not any(isinstance(value, str) for value in vars(entry).values())
    assert [c.text for c in cache.lookup("doc", text, 6, 1)] == ["y"]


def test_cache_trusts_the_document_history_and_falls_back_to_hashes():
    cache = CompletionCache()
    text = "def f():\n    return \n"
    cursor = text.index("return ") + len("return ")
    cache.store("doc", text, cursor, 1, [candidate("x + 1")], revision=5)
    typed = text[:cursor] + "x " + text[cursor:]

    def history(head: int, tail: int):
        return lambda revision: (head, tail) if revision == 5 else None

    # The history says only the typed span changed: a hit without reading the text.
    untouched_tail = len(text) - cursor
    assert [c.text for c in cache.lookup("doc", typed, cursor + 2, 1,
                                          unchanged_since=history(cursor, untouched_tail))] == ["+ 1"]
    # The history says the start of the line changed (an edit since undone): hashes decide.
    assert [c.text for c in cache.lookup("doc", typed, cursor + 2, 1,
                                          unchanged_since=history(0, untouched_tail))] == ["+ 1"]
    changed = "D" + typed[1:]
    assert cache.lookup("doc", changed, cursor + 2, 1, unchanged_since=history(0, untouched_tail)) is None


def test_cache_skips_an_entry_typed_past_without_asking_the_history():
    cache = CompletionCache()
    text = "total = \n"
    cursor = text.index("= ") + 2
    cache.store("doc", text, cursor, 1, [candidate("ab")], revision=1)
    asked: list[int] = []

    def history(revision: int):
        asked.append(revision)
        return (cursor, len(text) - cursor)

    typed = text[:cursor] + "a" + text[cursor:]
    assert [c.text for c in cache.lookup("doc", typed, cursor + 1, 1, unchanged_since=history)] == ["b"]
    assert asked == [1]
    past = text[:cursor] + "ab" + text[cursor:]  # the whole candidate typed: nothing left to offer
    assert cache.lookup("doc", past, cursor + 2, 1, unchanged_since=history) is None
    assert asked == [1]
