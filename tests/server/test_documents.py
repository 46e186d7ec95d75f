"""The event loop only routes: changes reach the text at once and the syntax tree on the worker.

Real SyntaxDocuments and a real worker thread; the worker is held with a job that
waits on an event where a test needs to see the state between the two. No verdict rests
on the machine's speed: "quiet" is measured on a clock the test moves, "the worker had its
chance" is the worker's `settled` event, and "mid-parse" is a stop check that waits.
"""

from __future__ import annotations

import asyncio
import gc
import threading
import weakref

from manual_clock import ManualClock

from dgemma_lsp.bench.syntax_bench import generate_source
from dgemma_lsp.engine.syntax.document import SyntaxDocument
from dgemma_lsp.server.documents import QUIET_S, DocumentStore, SyntaxWorker

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
    order: list[str] = []
    later = store.worker.run_after_this_step(lambda: order.append("queued for after this step") or "parsed")
    # Still the caller's step (here it would write to the engine): the worker has not been handed
    # that job yet, so a job handed to it now runs first (the worker runs jobs in order).
    now = store.worker.run(lambda: order.append("run now"))
    assert await later == "parsed"
    await now
    assert order == ["run now", "queued for after this step"]
    store.worker.close()


NEVER_QUIET_S = 1e9
"""A quiet window no test waits out: background work waits until something wakes it. Until the
client first speaks, the worker counts quiet from its clock's zero (monotonic: the machine's boot),
so this must be longer than any uptime: a day was not (CI failed on a machine up for 24 hours)."""


async def settled(store: DocumentStore) -> None:
    """Wait until the worker had its chance to act: nothing queued, nothing running but a
    catch-up that waits for quiet. (The timeout only guards against a hang.)"""
    assert await asyncio.to_thread(store.worker.settled.wait, 60), "the syntax worker never settled"


def half_type_a_statement(store: DocumentStore, source: str) -> None:
    """Type a half statement in the middle of a big Rust file: tree-sitter's error recovery."""
    line = source[: source.find("total", len(source) // 2)].count("\n")
    for i, char in enumerate("result = compute(total"):
        store.change(URI, 2 + i, [((line, i, line, i), char)], "utf-16")


async def test_the_event_loop_runs_while_a_big_rust_file_is_parsed():
    """The whole-file parse (a stale document's catch-up) runs on the worker: stopped mid-parse
    until the event loop has run a callback, it then goes on and finishes. (How long the loop
    waits at most is a figure: `bench latency --lines 10000`, loopStallMs.)"""
    source = generate_source("rust", 10_000)
    store = DocumentStore(SyntaxWorker(quiet_s=NEVER_QUIET_S))  # this test runs the catch-up itself
    document = store.open(URI, "rust", 1, source)
    # No whole-file parse on the keystroke path: the keystrokes leave the document stale.
    await document.in_worker(lambda syntax: setattr(syntax, "parse_budget_s", 0))
    half_type_a_statement(store, source)
    assert await document.in_worker(lambda syntax: syntax.stale)
    loop = asyncio.get_running_loop()
    mid_parse, loop_ran = threading.Event(), threading.Event()

    def wait_for_the_loop() -> bool:
        """`catch_up`'s stop check: tree-sitter calls it every few hundred bytes of the parse."""
        if not mid_parse.is_set():
            mid_parse.set()
            loop.call_soon_threadsafe(loop_ran.set)
            assert loop_ran.wait(60), "the event loop did not run while the worker parsed"
        return False  # never stop: parse to the end

    caught_up = document.in_worker(lambda syntax: syntax.catch_up(wait_for_the_loop))
    assert await caught_up is True
    assert mid_parse.is_set() and loop_ran.is_set()
    assert await document.in_worker(lambda syntax: (syntax.stale, syntax.text)) == (False, document.text)
    tree = await document.in_worker(lambda syntax: str(syntax.tree.root_node))
    assert tree == str(SyntaxDocument(document.text, "rust").tree.root_node)
    store.worker.close()


async def test_a_stale_document_catches_up_only_once_the_client_is_quiet():
    clock = ManualClock()
    store = DocumentStore(SyntaxWorker(clock))
    source = generate_source("rust", 10_000)
    document = store.open(URI, "rust", 1, source)
    # No whole-file parse on the keystroke path, however fast this machine is: a keystroke
    # then always parses its region only and leaves the document stale.
    await document.in_worker(lambda syntax: setattr(syntax, "parse_budget_s", 0))
    store.worker.client_spoke()  # what every LSP message does
    half_type_a_statement(store, source)
    assert await document.in_worker(lambda syntax: syntax.stale)
    await settled(store)  # the catch-up looked: the client spoke 0 s ago
    assert await document.in_worker(lambda syntax: syntax.stale)
    # The client keeps talking: more than QUIET_S since it first spoke, never QUIET_S since it last did.
    for _ in range(3):
        clock.advance(0.8 * QUIET_S)
        store.worker.client_spoke()
        clock.advance(0.8 * QUIET_S)
        assert await document.in_worker(lambda syntax: syntax.stale)  # (wakes the waiting catch-up)
        await settled(store)  # it looked again, and waits
        assert await document.in_worker(lambda syntax: syntax.stale)
    clock.advance(QUIET_S)  # quiet now
    await document.in_worker(lambda syntax: None)  # wakes the catch-up, which finds the client quiet
    await settled(store)
    assert await document.in_worker(lambda syntax: (syntax.stale, syntax.text)) == (False, document.text)
    store.worker.close()


async def test_closing_the_worker_while_a_catch_up_waits_for_quiet_ends_it_at_once():
    source = generate_source("rust", 2_000)
    store = DocumentStore(SyntaxWorker(quiet_s=NEVER_QUIET_S))
    document = store.open(URI, "rust", 1, source)
    await document.in_worker(lambda syntax: setattr(syntax, "parse_budget_s", 0))
    store.worker.client_spoke()
    store.change(URI, 2, [((0, 0, 0, 0), "fn half(")], "utf-16")
    worker_thread, stale = await document.in_worker(lambda syntax: (threading.current_thread(), syntax.stale))
    assert stale
    await settled(store)  # the catch-up now waits for a quiet a day away
    store.worker.close()
    worker_thread.join(timeout=60)  # a guard against a hang: only a wake-up ends the wait before then
    assert not worker_thread.is_alive()
    assert not any(t.name == "dgemma-syntax" and t.is_alive() for t in threading.enumerate())


async def test_a_closed_stale_document_is_let_go_while_the_client_keeps_talking():
    """A stale document's catch-up waits for a quiet client and goes behind every job that
    interrupts it. Once the document is closed it must stop: re-posted, it kept the document,
    its text and its trees alive for as long as the client never paused (`bench soak` held
    every closed big document, tens of MB an hour)."""
    source = generate_source("rust", 2_000)
    store = DocumentStore(SyntaxWorker(quiet_s=NEVER_QUIET_S))  # the client never pauses
    document = store.open(URI, "rust", 1, source)
    await document.in_worker(lambda syntax: setattr(syntax, "parse_budget_s", 0))
    store.worker.client_spoke()
    store.change(URI, 2, [((0, 0, 0, 0), "fn half(")], "utf-16")
    assert await document.in_worker(lambda syntax: syntax.stale)
    await settled(store)  # its catch-up waits for a quiet a day away
    closed_document = weakref.ref(document)
    closed_syntax = weakref.ref(document._syntax)
    store.close(URI)
    del document
    for number in range(3):  # the client goes on with other documents: each job wakes the catch-up
        uri = f"file:///other_{number}.rs"
        await store.open(uri, "rust", 1, "fn main() {}\n").in_worker(lambda syntax: syntax.text)
        store.close(uri)
    await settled(store)
    gc.collect()
    assert closed_document() is None and closed_syntax() is None
    store.worker.close()


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


async def test_background_jobs_waiting_for_quiet_give_way_to_requests_not_to_each_other():
    """Two background jobs (a catch-up, the workspace index's build) used to see each other queued,
    each re-posting itself behind the other: the worker spun while the client typed and the
    settled event was never set. Now they wait for quiet together and yield only to real work."""
    worker = SyntaxWorker(quiet_s=NEVER_QUIET_S)  # the client never pauses
    runs: list[str] = []

    def background(name: str):
        def run() -> None:
            runs.append(name)
            if not worker.wait_for_quiet():
                worker.post(run, background=True)  # behind the job that interrupted it
        return run

    worker.post(background("index"), background=True)
    worker.post(background("catch-up"), background=True)
    assert await asyncio.to_thread(worker.settled.wait, 60), "the background jobs kept re-posting each other"
    assert runs == ["index"]  # waiting for quiet, with the other queued behind it
    assert await worker.run(lambda: "answer") == "answer"  # a request's job goes first
    assert await asyncio.to_thread(worker.settled.wait, 60)
    assert runs == ["index", "catch-up", "index"]  # each gave way to the request once, then waits again
    worker.close()


def post_background_job(worker: SyntaxWorker) -> threading.Event:
    """Post a background job as the workspace index's build is one: it waits for quiet, re-posts itself
    behind whatever interrupts it, and sets the returned event once it ran."""
    ran = threading.Event()

    def background() -> None:
        if worker.wait_for_quiet():
            ran.set()
        else:
            worker.post(background, background=True)

    worker.post(background, background=True)
    return ran


async def test_background_work_waits_while_a_request_waits_for_the_engine():
    """The client is quiet while it waits for an answer: background work (the workspace index's build)
    begun in that wait held the worker when the answer's own jobs came (`bench latency`'s slowest
    keystrokes). It starts only once no request waits and the client has been quiet since the answer."""
    clock = ManualClock()
    worker = SyntaxWorker(clock)
    worker.client_spoke()
    with worker.answering("ready"):  # a keystroke's request, waiting for a loaded engine
        ran = post_background_job(worker)
        clock.advance(10 * QUIET_S)  # the client says nothing meanwhile
        worker.post(lambda: None, background=True)  # a wake-up: the background job looks again
        assert await asyncio.to_thread(worker.settled.wait, 60), "the syntax worker never settled"
        assert not ran.is_set() and worker.busy
    worker.post(lambda: None, background=True)  # the answer came: the background job looks again
    assert await asyncio.to_thread(worker.settled.wait, 60), "the syntax worker never settled"
    assert not ran.is_set()  # quiet is counted from the answer, not from the keystroke
    clock.advance(QUIET_S)
    worker.post(lambda: None, background=True)
    assert await asyncio.to_thread(ran.wait, 60), "background work never ran after the answer"
    worker.close()


async def test_a_request_waiting_for_the_models_load_does_not_hold_background_work_back():
    clock = ManualClock()
    worker = SyntaxWorker(clock)
    worker.client_spoke()
    with worker.answering("loading"):  # the first keystroke's request waits for the model (minutes)
        ran = post_background_job(worker)
        clock.advance(QUIET_S)
        worker.post(lambda: None, background=True)
        assert await asyncio.to_thread(ran.wait, 60), "the index waited for the model's load"
    worker.close()
