"""How long the event loop was blocked, and how much prompt the engine encoded: figures for `bench latency`.

A monitor thread wakes every millisecond and posts a callback to the loop
(`call_soon_threadsafe`, which writes to the loop's self-pipe, as a message from the
editor would arrive); the callback records how long it waited. The longest wait since
the last reading is the longest time the loop could not react to an event: a handler or
callback running, the GIL held by another thread, or the loop's thread waiting for a core.
One callback is in flight at a time, so a loop blocked for 5 ms shows as one 5 ms wait.

Why not a timer on the loop (`asyncio.sleep(0.001)` and its lateness), as before
2026-11-24: asyncio's epoll selector rounds every timeout up to a whole millisecond, so a
loop woken by I/O in the middle of an interval sleeps on to the next millisecond, and the
timer counted that as a stall of up to 1 ms although nothing blocked the loop (bench
latency: p50 1.0 ms with the timer, 0.3 ms measured this way; bench/RESULTS.md).

A wait has two parts, told apart by `TimedEventLoop`, the loop the server runs on: the
loop's thread waking up (the OS scheduling it, and the GIL when it wakes; on the 2-core
development machine that alone reaches ~3-4 ms at p99, see bench/RESULTS.md), and the loop
busy running callbacks. `take_busy` is the longest single pass of the loop through its ready
callbacks, from the selector's return to its next call: how long our own code held the loop
(a wait for the GIL inside that pass included). A loop created elsewhere (pygls' TCP
server) has no busy figure.

It runs only once a client asked for it (the `dgemma.serverStats` command), so a normal
session pays nothing. Run as `python -m dgemma_lsp.server.loop_monitor`, it is a bare
event loop with only the monitor, answering each `take` line on stdin with a reading:
the machine's floor that `bench latency --loop-floor` reads beside the server. Knows
asyncio and threads; nothing of LSP, documents or models.
"""

from __future__ import annotations

import asyncio
import selectors
import sys
import threading
import time


class _TimedSelector(selectors.DefaultSelector):  # type: ignore[misc,valid-type]
    """The platform's selector, timing the loop's passes between two `select` calls while watched."""

    def __init__(self) -> None:
        super().__init__()
        self.watched = False
        self.longest_pass_s = 0.0
        self._returned: float | None = None

    def select(self, timeout=None):
        if self._returned is not None:  # a pass through the ready callbacks ends here
            self.longest_pass_s = max(self.longest_pass_s, time.perf_counter() - self._returned)
        events = super().select(timeout)
        self._returned = time.perf_counter() if self.watched else None
        return events


class TimedEventLoop(asyncio.SelectorEventLoop):
    """asyncio's selector loop, whose passes through its ready callbacks a `LoopMonitor` can time
    (two clock reads per pass, only while one watches)."""

    def __init__(self) -> None:
        self.timed_selector = _TimedSelector()
        super().__init__(self.timed_selector)


class LoopMonitor:
    """The longest wait of a callback posted to the event loop, and the longest pass of the loop
    through its callbacks, since the previous `take`."""

    def __init__(self, interval_s: float = 0.001) -> None:
        self.interval_s = interval_s
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
                self._selector.watched, self._selector.longest_pass_s = True, 0.0
            threading.Thread(
                target=self._post, args=(asyncio.get_running_loop(), self._stop),
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
        """The longest wait in ms since the previous call (or since `start`), and start over."""
        longest, self._longest_s = self._longest_s, 0.0
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
                loop.call_soon_threadsafe(self._arrived, time.perf_counter())
            except RuntimeError:  # the loop is closed
                return

    def _arrived(self, posted: float) -> None:
        """On the loop."""
        self._longest_s = max(self._longest_s, time.perf_counter() - posted)
        self._in_flight = False


async def _serve_readings() -> None:
    """A bare loop: one reading per `take` line on stdin, until stdin closes."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    monitor = LoopMonitor()
    monitor.start()
    while await reader.readline():
        sys.stdout.write(f"{monitor.take()}\n")
        sys.stdout.flush()
    monitor.stop()


if __name__ == "__main__":
    asyncio.run(_serve_readings())
