"""How long the event loop was blocked, and how much prompt the engine encoded: figures for `bench latency`.

A stall is how long something handed to the loop waited before the loop ran it. On the
server's own loop (`TimedEventLoop`) it is read from the real traffic, with no thread of
its own: every callback another thread posts (`call_soon_threadsafe`: the syntax worker's
results and drafts, the in-process engine's) records its wait from posting to running, and
the selector times each pass of the loop through its ready callbacks; the reading is the
longest of both. The wait covers the loop busy, the GIL held by another thread and the
loop's thread waiting for a core; the pass covers a block that nothing happened to wait
behind. A loop blocked for 5 ms shows as one 5 ms stall either way. What it cannot see is
the loop's thread waking for a message from a pipe or socket (the editor's, the daemon's):
nothing says when those bytes arrived. That wake-up is the OS's, and the probe below counts it.

Why not a probe (a thread posting a callback every millisecond and timing its wait), as
the server once did: the probe wakes the loop and takes the GIL a
thousand times a second, and on the 2-core development machine that made the server
slower while it watched (bench latency, 14 runs alternating with and without it: overhead
a median +0.4 ms at p50 and +0.8 ms at p99, slower in 13 and 12 of the pairs; see
bench/RESULTS.md, "Editor latency"). A session that is not measured never runs it, so the figures came from a
slower server than the editor talks to. The probe remains where there is no real traffic to
time: a loop that is not a `TimedEventLoop` (pygls' TCP server, tests) and `probe=True`
(`bench latency --loop-probe`, and the bare loop below). An earlier version timed how late a 1 ms `asyncio.sleep` woke; asyncio's
epoll selector rounds timeouts up to whole milliseconds, so it read ~1 ms of stall with
nothing blocking the loop.

`take_busy` is the longest pass alone: how long our own code held the loop (a wait for
the GIL inside that pass included). A loop created elsewhere has no busy figure.

It runs only once a client asked for it (the `dgemma.serverStats` command), so a normal
session pays nothing. Run as `python -m dgemma_lsp.server.loop_monitor`, it is a bare
event loop with only the probe, answering each `take` line on stdin with a reading: the
machine's floor that `bench latency --loop-floor` reads beside the server. Knows asyncio
and threads; nothing of LSP, documents or models.
"""

from __future__ import annotations

import asyncio
import selectors
import sys
import threading
import time
from collections.abc import Callable

Clock = Callable[[], float]


class _TimedSelector(selectors.DefaultSelector):  # type: ignore[misc,valid-type]
    """The platform's selector, timing the loop's passes between two `select` calls while watched."""

    def __init__(self, clock: Clock = time.perf_counter) -> None:
        super().__init__()
        self.clock = clock
        self.watched = False
        self.longest_pass_s = 0.0
        self.longest_stall_s = 0.0
        """The longest stall: a pass (what anything arriving during it waited) or, on a
        `TimedEventLoop`, a callback posted from another thread waiting to run."""
        self._returned: float | None = None

    def select(self, timeout=None):
        if self._returned is not None:  # a pass through the ready callbacks ends here
            busy = self.clock() - self._returned
            self.longest_pass_s = max(self.longest_pass_s, busy)
            self.longest_stall_s = max(self.longest_stall_s, busy)
        events = super().select(timeout)
        self._returned = self.clock() if self.watched else None
        return events


class TimedEventLoop(asyncio.SelectorEventLoop):
    """asyncio's selector loop, whose passes through its ready callbacks and whose callbacks posted
    from other threads a `LoopMonitor` can time (two clock reads each, only while one watches).
    `clock`: what the figures are read from (a test passes a clock it moves itself)."""

    def __init__(self, clock: Clock = time.perf_counter) -> None:
        self.timed_selector = _TimedSelector(clock)
        super().__init__(self.timed_selector)

    def call_soon_threadsafe(self, callback, *args, context=None):
        selector = self.timed_selector
        if not selector.watched:
            return super().call_soon_threadsafe(callback, *args, context=context)
        posted = selector.clock()

        def timed(*arguments):
            selector.longest_stall_s = max(selector.longest_stall_s, selector.clock() - posted)
            callback(*arguments)

        return super().call_soon_threadsafe(timed, *args, context=context)


class LoopMonitor:
    """The longest stall of the event loop, and its longest pass through its callbacks, since the
    previous `take`. `probe`: also post a timed callback every `interval_s` from a thread of its
    own (always so on a loop that is not a `TimedEventLoop`, which has no other figure). `clock`:
    what the probe's waits are read from (a `TimedEventLoop` reads its own figures from its own)."""

    def __init__(self, interval_s: float = 0.001, *, probe: bool = False, clock: Clock = time.perf_counter) -> None:
        self.interval_s = interval_s
        self.probe = probe
        self.clock = clock
        self._stop: threading.Event | None = None
        self._in_flight = False
        self._longest_s = 0.0
        self._selector: _TimedSelector | None = None

    @property
    def running(self) -> bool:
        return self._stop is not None

    def start(self) -> None:
        """Start watching the running event loop (call on that loop)."""
        if self._stop is None:
            self._stop = threading.Event()
            loop = asyncio.get_running_loop()
            if isinstance(loop, TimedEventLoop):
                self._selector = loop.timed_selector
                self._selector.longest_pass_s = self._selector.longest_stall_s = 0.0
                self._selector.watched = True
                if not self.probe:
                    return  # the real traffic is timed: no thread
            threading.Thread(
                target=self._post, args=(loop, self._stop),
                name="dgemma-loop-monitor", daemon=True,
            ).start()

    def stop(self) -> None:
        if self._stop is not None:
            self._stop.set()
            self._stop = None
        if self._selector is not None:
            self._selector.watched = False
            self._selector = None

    def take(self) -> float:
        """The longest stall in ms since the previous call (or since `start`), and start over."""
        longest, self._longest_s = self._longest_s, 0.0
        if self._selector is not None:
            longest, self._selector.longest_stall_s = max(longest, self._selector.longest_stall_s), 0.0
        return round(longest * 1000.0, 3)

    def take_busy(self) -> float | None:
        """The longest pass of the loop through its callbacks in ms since the previous call (or
        since `start`), and start over; None when the loop is not a `TimedEventLoop`."""
        if self._selector is None:
            return None
        longest, self._selector.longest_pass_s = self._selector.longest_pass_s, 0.0
        return round(longest * 1000.0, 3)

    def _post(self, loop: asyncio.AbstractEventLoop, stop: threading.Event) -> None:
        """On the monitor thread: post one timed callback per interval while none is waiting."""
        while not stop.wait(self.interval_s):
            if loop.is_closed():  # also when it closed with our last callback still waiting
                return
            if self._in_flight:
                continue  # the loop has not run the last one yet: it is still being measured
            self._in_flight = True
            try:
                loop.call_soon_threadsafe(self._arrived, self.clock())
            except RuntimeError:  # the loop is closed
                return

    def _arrived(self, posted: float) -> None:
        """On the loop."""
        self._longest_s = max(self._longest_s, self.clock() - posted)
        self._in_flight = False


async def _serve_readings() -> None:
    """A bare loop: one reading per `take` line on stdin, until stdin closes."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    monitor = LoopMonitor(probe=True)  # a bare loop: no traffic of its own to time
    monitor.start()
    while await reader.readline():
        sys.stdout.write(f"{monitor.take()}\n")
        sys.stdout.flush()
    monitor.stop()


if __name__ == "__main__":
    asyncio.run(_serve_readings())
