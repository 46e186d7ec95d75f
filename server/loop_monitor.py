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

It runs only once a client asked for it (the `dgemma.serverStats` command), so a normal
session pays nothing. Run as `python -m dgemma_lsp.server.loop_monitor`, it is a bare
event loop with only the monitor, answering each `take` line on stdin with a reading:
the machine's floor that `bench latency --loop-floor` reads beside the server. Knows
asyncio and threads; nothing of LSP, documents or models.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time


class LoopMonitor:
    """The longest wait of a callback posted to the event loop since the previous `take`."""

    def __init__(self, interval_s: float = 0.001) -> None:
        self.interval_s = interval_s
        self._stop: threading.Event | None = None
        self._in_flight = False
        self._longest_s = 0.0

    @property
    def running(self) -> bool:
        return self._stop is not None

    def start(self) -> None:
        """Start watching the running event loop (call on that loop)."""
        if self._stop is None:
            self._stop = threading.Event()
            threading.Thread(
                target=self._post, args=(asyncio.get_running_loop(), self._stop),
                name="dgemma-loop-monitor", daemon=True,
            ).start()

    def stop(self) -> None:
        if self._stop is not None:
            self._stop.set()
            self._stop = None

    def take(self) -> float:
        """The longest wait in ms since the previous call (or since `start`), and start over."""
        longest, self._longest_s = self._longest_s, 0.0
        return round(longest * 1000.0, 3)

    def _post(self, loop: asyncio.AbstractEventLoop, stop: threading.Event) -> None:
        """On the monitor thread: post one timed callback per interval while none is waiting."""
        while not stop.wait(self.interval_s):
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
