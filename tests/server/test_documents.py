"""The event loop only routes: changes reach the text at once and the syntax tree on the worker.

Real SyntaxDocuments and a real worker thread; the worker is held with a job that
waits on an event where a test needs to see the state between the two.
"""

from __future__ import annotations

import asyncio
import threading

from dgemma_lsp.bench.syntax_bench import generate_source
from dgemma_lsp.engine.syntax.document import SyntaxDocument
from dgemma_lsp.server.documents import QUIET_S, DocumentStore

URI = "file:///big.rs"


def hold(store: DocumentStore) -> threading.Event:
    """Keep the worker busy until the returned event is set."""
    release = threading.Event()
    store.worker.post(lambda: release.wait(30))
    return release


async def test_a_change_reaches_the_text_at_once_and_the_tree_on_the_worker():
    store = DocumentStore()
    release = hold(store)
    document = store.open(URI, "rust", 1, "fn main() {\n}\n")
    for i, char in enumerate("let x = 1;"):
        store.change(URI, 2 + i, [((0, 11 + i, 0, 11 + i), char)], "utf-16")
    assert document.text == "fn main() {let x = 1;\n}\n"
    assert document.position(len(document.text), "utf-16") == (2, 0)
    assert len(document._pending) == 1 + len("let x = 1;")  # nothing parsed yet: the worker is busy
    release.set()
    syntax_text, tree = await document.in_worker(lambda syntax: (syntax.text, str(syntax.tree.root_node)))
    assert syntax_text == document.text
    assert tree == str(SyntaxDocument(document.text, "rust").tree.root_node)
    store.worker.close()


async def test_a_job_sees_the_changes_before_it_and_none_after():
    store = DocumentStore()
    document = store.open(URI, "python", 1, "x = 1\n")
    release = hold(store)
    store.change(URI, 2, [((0, 5, 0, 5), "2")], "utf-16")
    seen = document.in_worker(lambda syntax: syntax.text)
    store.change(URI, 3, [((0, 6, 0, 6), "3")], "utf-16")
    release.set()
    assert await seen == "x = 12\n"
    assert await document.in_worker(lambda syntax: syntax.text) == "x = 123\n"
    store.worker.close()


async def test_a_job_run_after_this_step_waits_for_the_step_to_end():
    """What the request relies on when it queues its checker's parse and then writes to the engine."""
    store = DocumentStore()
    store.open(URI, "python", 1, "x = 1\n")
    started = threading.Event()
    job = store.worker.run_after_this_step(lambda: started.set() or "parsed")
    # Still the caller's step (here it would write to the engine): the worker has not been handed
    # the job, though it is free and this thread lets the GIL go while it waits.
    assert not started.wait(0.2)
    assert await job == "parsed"
    store.worker.close()


async def _ticks_while(awaitable) -> tuple[int, float, float]:
    """(loop ticks, longest gap between ticks, total time) while `awaitable` runs."""
    loop = asyncio.get_running_loop()
    gaps: list[float] = []
    done = False

    async def tick() -> None:
        last = loop.time()
        while not done:
            await asyncio.sleep(0.001)
            now = loop.time()
            gaps.append(now - last)
            last = now

    ticker = asyncio.ensure_future(tick())
    started = loop.time()
    await awaitable
    total = loop.time() - started
    done = True
    await ticker
    return len(gaps), max(gaps, default=total), total


async def test_the_event_loop_runs_while_a_big_rust_file_is_parsed():
    source = generate_source("rust", 10_000)
    store = DocumentStore()
    document = store.open(URI, "rust", 1, source)
    ticks, longest, total = await _ticks_while(document.in_worker(lambda syntax: syntax.revision))
    assert ticks >= 3 and longest < total / 2, (ticks, longest, total)
    # A half-typed statement: tree-sitter's error recovery, bounded on the keystroke path,
    # then caught up on the worker, which lets the loop run all along.
    line = source[: source.find("total", len(source) // 2)].count("\n")
    for i, char in enumerate("result = compute(total"):
        store.change(URI, 2 + i, [((line, i, line, i), char)], "utf-16")
    ticks, longest, total = await _ticks_while(document.in_worker(lambda syntax: syntax.catch_up()))
    assert longest < max(total / 2, 0.02), (ticks, longest, total)
    assert await document.in_worker(lambda syntax: (syntax.stale, syntax.text)) == (False, document.text)
    store.worker.close()


async def test_a_stale_document_catches_up_only_once_the_client_is_quiet():
    loop = asyncio.get_running_loop()
    source = generate_source("rust", 10_000)
    store = DocumentStore()
    document = store.open(URI, "rust", 1, source)
    line = source[: source.find("total", len(source) // 2)].count("\n")
    # No whole-file parse on the keystroke path, however fast this machine is: a keystroke
    # then always parses its region only and leaves the document stale.
    await document.in_worker(lambda syntax: setattr(syntax, "parse_budget_s", 0))
    store.worker.client_spoke()  # what every LSP message does
    for i, char in enumerate("result = compute(total"):
        store.change(URI, 2 + i, [((line, i, line, i), char)], "utf-16")
    assert await document.in_worker(lambda syntax: syntax.stale)
    for _ in range(int(3 * QUIET_S / 0.05)):  # the client keeps talking: the whole-file parse waits
        store.worker.client_spoke()
        await asyncio.sleep(0.05)
    assert await document.in_worker(lambda syntax: syntax.stale)
    deadline = loop.time() + 60
    while await document.in_worker(lambda syntax: syntax.stale):  # quiet now: it catches up
        assert loop.time() < deadline, "the catch-up never ran"
        await asyncio.sleep(2 * QUIET_S)
    assert await document.in_worker(lambda syntax: syntax.text) == document.text
    store.worker.close()


async def test_closing_the_worker_while_a_catch_up_waits_for_quiet_ends_it_at_once():
    source = generate_source("rust", 2_000)
    store = DocumentStore()
    document = store.open(URI, "rust", 1, source)
    await document.in_worker(lambda syntax: setattr(syntax, "parse_budget_s", 0))
    store.worker.client_spoke()
    store.change(URI, 2, [((0, 0, 0, 0), "fn half(")], "utf-16")
    worker_thread = await document.in_worker(lambda syntax: threading.current_thread())
    await asyncio.sleep(0.05)  # the catch-up is now waiting for the client to be quiet
    store.worker.close()
    worker_thread.join(timeout=QUIET_S / 2)
    assert not worker_thread.is_alive()
    assert not any(t.name == "dgemma-syntax" and t.is_alive() for t in threading.enumerate())


async def test_the_change_history_tells_what_typing_left_untouched():
    store = DocumentStore()
    document = store.open("file:///a.py", "python", 1, "a = 1\nb = 2\n")
    before = document.revision
    store.change("file:///a.py", 2, [((0, 5, 0, 5), "0"), ((0, 6, 0, 6), "0")], "utf-16")
    assert document.text == "a = 100\nb = 2\n"
    assert document.unchanged_since(before) == (5, len("\nb = 2\n"))
    assert document.unchanged_since(document.revision) == (len(document.text), len(document.text))
    store.change("file:///a.py", 3, [(None, "c = 3\n")], "utf-16")  # a full sync forgets the past
    assert document.unchanged_since(before) is None
    store.worker.close()
