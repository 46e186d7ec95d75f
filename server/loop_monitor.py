"""How long the event loop was blocked, and how much prompt the engine encoded: figures for `bench latency`.

A monitor task asks to wake every millisecond and records how late it woke: the
longest lateness since the last reading is the longest time anything held the event
loop (a handler, a callback, the GIL held by another thread). It runs only once a
client asked for it (the `dgemma.serverStats` command), so a normal session pays
nothing. Run as `python -m dgemma_lsp.server.loop_monitor`, it is a bare event loop with
only the monitor, answering each `take` line on stdin with a reading: the machine's floor
that `bench latency --loop-floor` reads beside the server. Knows asyncio; nothing of LSP,
documents or models.
"""

from __future__ import annotations

import asyncio
import sys


class LoopMonitor:
    """The longest event-loop stall since the previous `take`."""

    def __init__(self, interval_s: float = 0.001) -> None:
        self.interval_s = interval_s
        self._task: asyncio.Task | None = None
        self._longest_s = 0.0

    @property
    def running(self) -> bool:
        return self._task is not None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.ensure_future(self._watch())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    def take(self) -> float:
        """The longest stall in ms since the previous call (or since `start`), and start over."""
        longest, self._longest_s = self._longest_s, 0.0
        return round(longest * 1000.0, 3)

    async def _watch(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + self.interval_s
            await asyncio.sleep(self.interval_s)
            self._longest_s = max(self._longest_s, loop.time() - due)


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
