"""Open documents: text, version and syntax tree per URI; syntax work on one worker thread.

The event loop only routes: a change is turned into str offsets and applied to the
document's `LineIndex` (which holds the text and is updated incrementally, never
rebuilt), then queued for the syntax worker. The worker owns every `SyntaxDocument`
(text + tree-sitter tree): it applies the queued changes in one go (a burst of
keystrokes costs one reparse: `SyntaxDocument.edit` per change, one `reparse`), and
runs the jobs the completions ask for (plan, context, finishing) after the changes
their request saw, never later ones. When a bounded reparse left a document `stale`,
the worker catches up in its free time: once the client has sent nothing for QUIET_S and no
request waits for the engine, and it stops as soon as a job waits or the client speaks again. (Tree-sitter holds
the GIL while it parses and hands it over only between progress callbacks, after the
switch interval: a catch-up running while the loop handles a keystroke would make the
loop wait for the GIL at every step of that keystroke.)

One thread for all documents: tree-sitter holds the GIL while it parses, so more
threads would not parse in parallel, and one owner per tree needs no locks on it.
(concurrent.futures' executor cannot tell a job that something else is waiting,
which `catch_up` needs: hence the small queue of our own.)
Changes arrive as LSP ranges in the negotiated encoding; this module turns them into
str offsets (through positions.py). Knows no pygls types, and no model.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from dgemma_lsp.engine.nextedit.edits import EditLog
from dgemma_lsp.engine.syntax.document import KEYSTROKE_PARSE_BUDGET_S, SyntaxDocument
from dgemma_lsp.engine.syntax.history import ChangeHistory

from .positions import Encoding, LineIndex, PositionError

log = logging.getLogger(__name__)

T = TypeVar("T")
GIL_SWITCH_S = 0.001
"""The interpreter's switch interval once the worker runs (default 5 ms): how long the event
loop may wait for the GIL while the worker parses (tree-sitter's progress callback is where
the worker gives it up). A process-wide setting, set here because this thread is why."""
QUIET_S = 0.25
"""Background work (a stale document's catch-up) starts once the client has been quiet this long:
a pause in typing (keys come every 100-200 ms), not the gap while the engine answers one key
(50 ms let it start mid-request in `bench latency`, and the loop then waited for the GIL)."""


class UnknownDocumentError(KeyError):
    """A request named a URI that is not open."""

    def __str__(self) -> str:
        return f"document {self.args[0]} is not open (send textDocument/didOpen first)"


class SyntaxWorker:
    """One thread that runs every syntax job, in the order they were submitted."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, quiet_s: float = QUIET_S) -> None:
        self.clock = clock
        """What "quiet" is measured with (and "typing", server/workspace.py); a test passes a clock it
        moves itself."""
        self.quiet_s = quiet_s
        """QUIET_S; a test may ask for a quiet that never comes within the test."""
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._foreground = 0
        """Jobs queued that are not background work (a request's, a sync's, shutdown's): what
        background work gives way to. Background jobs waiting for quiet do not count, or two of
        them would each give way to the other, re-posting themselves in turn while the client
        types (a worker spinning a core and taking the GIL from the event loop at every keystroke)."""
        self._answering = 0
        """Requests waiting for the engine (`answering`): background work waits for them too."""
        self._thread: threading.Thread | None = None
        self._client_spoke_at = 0.0
        self._job_arrived = threading.Event()
        self._closed = False
        self._settle_lock = threading.Lock()
        self.settled = threading.Event()
        """Set while the worker can do nothing before something changes: no job queued, and
        none running but one waiting for the client to be quiet. Every job put clears it, and so does
        the end of a wait for quiet (the worker acts again).
        Lets a test know the worker had its chance to act, without waiting a set time."""

    def client_spoke(self) -> None:
        """The event loop got a message from the client: background work yields until it is quiet."""
        self._client_spoke_at = self.clock()

    @contextlib.contextmanager
    def answering(self, engine_state: str):
        """Around a request's wait for the engine (event loop side): no background work starts meanwhile,
        and quiet is counted from its end. The client is quiet then because it waits for us; a workspace
        index step begun in that wait held the worker (and the GIL, in tree-sitter's parse) when the
        answer's own jobs arrived: `bench latency` typing in the standard library's folder, the slowest
        keystrokes were those whose answer came while the stdlib's index was being built.
        Only while the engine is loaded (`engine_state` ready or busy): a request waiting for a model's
        load (minutes) must not hold the index back meanwhile."""
        if engine_state not in ("ready", "busy"):
            yield
            return
        with self._settle_lock:
            self._answering += 1
        try:
            yield
        finally:
            with self._settle_lock:
                self._answering -= 1
                self._client_spoke_at = max(self._client_spoke_at, self.clock())
            self._job_arrived.set()

    @property
    def busy(self) -> bool:
        """Whether background work should stop: a job waits, a request waits for the engine, or the client
        spoke within QUIET_S."""
        return (self._foreground > 0 or self._answering > 0
                or self.clock() - self._client_spoke_at < self.quiet_s)

    def wait_for_quiet(self, quiet_s: float | None = None) -> bool:
        """On the worker: wait (GIL released) until the client has been quiet for QUIET_S (or `quiet_s`);
        False when a job that is not background work arrived first (background work goes behind it)."""
        while True:
            with self._settle_lock:
                if self._foreground > 0:
                    return False
                left = (self.quiet_s if quiet_s is None else quiet_s) - (self.clock() - self._client_spoke_at)
                if left <= 0 and self._answering == 0:
                    self.settled.clear()  # quiet came while it waited: the worker acts again
                    return True
                self.settled.set()
            self._job_arrived.wait(None if self._answering else left)  # an answer's end wakes it
            self._job_arrived.clear()  # a job put meanwhile is still seen by the empty() check

    def run(self, job: Callable[[], T]) -> asyncio.Future[T]:
        """Run `job` on the worker; the future resolves on the calling event loop."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._put((job, future, loop))
        return future

    def run_after_this_step(self, job: Callable[[], T]) -> asyncio.Future[T]:
        """`run`, but handed to the worker only once the calling task's step is over (on the
        loop's next pass). For a job queued just before the task writes to the engine: woken at
        once, the worker would take the GIL as soon as the loop's thread lets it go and keep it
        for a whole tree-sitter parse (which does not give it up), and the write would wait."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        loop.call_soon(self._put, (job, future, loop))
        return future

    def post(self, job: Callable[[], None], *, background: bool = False) -> None:
        """Run `job` on the worker, nobody waiting for it (its errors are logged); after `close`,
        nothing (a catch-up waiting for quiet must not start a thread again at shutdown).
        `background`: a job that waits for quiet (`wait_for_quiet`) and yields to every other job."""
        if not self._closed:
            self._put((job, None, None), background=background)

    def close(self) -> None:
        self._closed = True
        if self._thread is not None:
            self._put(None)  # a catch-up waiting for quiet gives way at once
            self._thread = None

    def _put(self, item, *, background: bool = False) -> None:
        if self._thread is None:
            sys.setswitchinterval(min(sys.getswitchinterval(), GIL_SWITCH_S))
            self._thread = threading.Thread(target=self._serve, name="dgemma-syntax", daemon=True)
            self._thread.start()
        with self._settle_lock:
            self.settled.clear()
            self._foreground += not background
            self._jobs.put((item, background))
        self._job_arrived.set()

    def _serve(self) -> None:
        while True:
            with self._settle_lock:
                if self._jobs.empty():
                    self.settled.set()
            item, background = self._jobs.get()
            if not background:
                with self._settle_lock:
                    self._foreground -= 1
            if item is None:
                return
            job, future, loop = item
            try:
                result = job()
            except BaseException as error:  # handed to the waiting request, or logged
                if future is None:
                    log.exception("syntax job failed")
                else:
                    loop.call_soon_threadsafe(_settle, future, None, error)
            else:
                if future is not None:
                    loop.call_soon_threadsafe(_settle, future, result, None)


def _settle(future: asyncio.Future, result, error: BaseException | None) -> None:
    if future.done():
        return  # the request was cancelled meanwhile
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


@dataclass
class OpenDocument:
    """One open document: its latest text on the event loop, its syntax on the worker."""

    uri: str
    language_id: str
    version: int
    lines: LineIndex
    """The text as of the latest change, and its line starts (event loop side). Replaced, not
    mutated, by a change: a request may keep the one it started with."""
    worker: SyntaxWorker
    revision: int = 0
    """Bumped by every change on the event loop."""
    _syntax: SyntaxDocument | None = None
    _applied: int = 0
    """The revision `_syntax` is at (worker side)."""
    _pending: deque = field(default_factory=deque)
    """(revision, start, end, new text) not yet applied to `_syntax`; start None: the whole text."""
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _open_sync: list | None = None
    """[target revision, started] of the latest sync job while changes may still join it: until
    it starts, or until a job that must not see later changes is queued behind it."""
    _catch_up_posted: bool = False
    closed: bool = False
    """Set by `DocumentStore.close` (event loop side): the worker does no more background work for
    it. A stale document's catch-up waits for a quiet client and re-posts itself behind every job
    that interrupts it; left running after a close, it kept the closed document, its text and its
    tree-sitter trees alive until the client next paused, so a client that never paused (`bench
    soak`) held every closed big document (+90 MB over 200 documents)."""
    _history: ChangeHistory = field(default_factory=ChangeHistory)
    edits: EditLog = field(default_factory=EditLog)
    """The user's recent edits, merged from keystrokes (for next-edit suggestions)."""

    @property
    def text(self) -> str:
        return self.lines.text

    def offset(self, line: int, character: int, encoding: Encoding) -> int:
        """The str offset of an LSP position; raises PositionError outside the document."""
        return self.lines.offset(line, character, encoding)

    def span(self, start: tuple[int, int], end: tuple[int, int], encoding: Encoding) -> tuple[int, int]:
        """The str offsets of an LSP range; an end inside a character covers it (positions.py)."""
        return self.lines.span(start, end, encoding)

    def position(self, offset: int, encoding: Encoding) -> tuple[int, int]:
        return self.lines.position(offset, encoding)

    # -- event loop side ---------------------------------------------------------------

    def change(self, start: int | None, end: int, new_text: str) -> None:
        """Apply one change to the text now and queue it for the syntax tree."""
        if start is None:
            self.edits.reset()
        else:
            self.edits.record(self.lines.text, start, end, new_text)
        lines = self.lines.copy()
        if start is None:
            lines = LineIndex(new_text)
        else:
            lines.apply_change(start, end, new_text)
        self.lines = lines
        self.revision += 1
        if start is None:
            self._history.reset(self.revision)
        else:
            self._history.record(self.revision, start, len(self.lines.text) - start - len(new_text))
        self._queue(start, end, new_text)

    def _queue(self, start: int | None, end: int, new_text: str) -> None:
        with self._lock:
            self._pending.append((self.revision, start, end, new_text))
            cell = self._open_sync
            if cell is not None and not cell[1]:
                cell[0] = self.revision  # a queued sync takes this change too: one reparse for both
                return
            cell = self._open_sync = [self.revision, False]
        self.worker.post(lambda: self._sync_job(cell))

    def unchanged_since(self, revision: int) -> tuple[int, int] | None:
        """(head, tail): chars at the start and at the end of the text that no change since
        `revision` touched; None when that is further back than the remembered history.
        Cheapest asked newest revision first (see `ChangeHistory`)."""
        return self._history.unchanged_since(revision, len(self.lines.text))

    def in_worker(self, job: Callable[[SyntaxDocument], T]) -> asyncio.Future[T]:
        """Run `job` on the worker, on this document's syntax as of now (not any later change)."""
        revision = self.revision
        with self._lock:
            self._open_sync = None  # later changes queue a sync of their own, behind this job

        def run() -> T:
            syntax = self._sync(revision)
            try:
                return job(syntax)
            finally:
                self._post_catch_up()

        return self.worker.run(run)

    # -- worker side -------------------------------------------------------------------

    def _sync(self, revision: int) -> SyntaxDocument:
        """Apply the queued changes up to `revision` (not later ones); one reparse for all."""
        with self._lock:
            batch = []
            while self._pending and self._pending[0][0] <= revision:
                batch.append(self._pending.popleft())
        assert self._applied <= revision, f"syntax at revision {self._applied}, a job wants {revision}"
        if self._syntax is None:
            self._syntax = SyntaxDocument("", self.language_id, parse_budget_s=KEYSTROKE_PARSE_BUDGET_S)
        syntax = self._syntax
        edited = False
        for rev, start, end, new_text in batch:
            if start is None:
                syntax.set_text(new_text)
                edited = False
            else:
                syntax.edit(start, end, new_text)
                edited = True
            self._applied = rev
        if edited:
            syntax.reparse()
        return syntax

    def _sync_job(self, cell: list) -> None:
        with self._lock:
            cell[1] = True
            revision = cell[0]
        if self.closed:
            return  # nobody will ask; a request still running on it syncs in its own job (`in_worker`)
        self._sync(revision)
        self._post_catch_up()

    def _post_catch_up(self) -> None:
        if not self.closed and self._syntax is not None and self._syntax.stale and not self._catch_up_posted:
            self._catch_up_posted = True
            self.worker.post(self._catch_up, background=True)

    def _catch_up(self) -> None:
        self._catch_up_posted = False
        if self.closed or self._syntax is None or self._pending:
            return  # the sync job posted with those changes will try again
        if not self.worker.wait_for_quiet() or not self._syntax.catch_up(
            lambda: self.worker.busy or bool(self._pending) or self.closed
        ):
            self._post_catch_up()  # behind the job that interrupted it


class DocumentStore:
    """The open documents of one client session, by URI, and their syntax worker."""

    def __init__(self, worker: SyntaxWorker | None = None) -> None:
        self._documents: dict[str, OpenDocument] = {}
        self.worker = worker if worker is not None else SyntaxWorker()

    def open(self, uri: str, language_id: str, version: int, text: str) -> OpenDocument:
        document = OpenDocument(uri, language_id, version, LineIndex(text), self.worker)
        document._queue(None, 0, text)  # the first parse happens on the worker too
        self._documents[uri] = document
        return document

    def close(self, uri: str) -> None:
        """Forget the document; its queued syntax jobs find it closed and let it go."""
        document = self._documents.pop(uri, None)
        if document is not None:
            document.closed = True

    def get(self, uri: str) -> OpenDocument:
        try:
            return self._documents[uri]
        except KeyError:
            raise UnknownDocumentError(uri) from None

    def __contains__(self, uri: str) -> bool:
        return uri in self._documents

    def all(self) -> list[OpenDocument]:
        """The open documents, most recently opened last."""
        return list(self._documents.values())

    def __len__(self) -> int:
        return len(self._documents)

    def change(
        self,
        uri: str,
        version: int,
        changes: list[tuple[tuple[int, int, int, int] | None, str]],
        encoding: Encoding,
    ) -> OpenDocument:
        """Apply changes in order; each is ((start line, start char, end line, end char) | None, text).

        None as the range replaces the whole text (full sync). A change whose
        range is outside the document raises PositionError after the earlier
        changes were applied — the client and server disagree, and the log says so.
        """
        document = self.get(uri)
        for span, new_text in changes:
            if span is None:
                document.change(None, 0, new_text)
            else:
                start_line, start_char, end_line, end_char = span
                start, end = document.span((start_line, start_char), (end_line, end_char), encoding)
                if end < start:
                    raise PositionError(f"range end {end_line}:{end_char} before its start")
                document.change(start, end, new_text)
        document.version = version
        return document
