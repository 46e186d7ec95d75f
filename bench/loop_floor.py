"""The machine's floor under `loopStallMs`: the loop monitor's 1 ms probe in a bare event loop beside the server.

`bench latency` starts `python -m dgemma_lsp.server.loop_monitor`, a process whose event
loop runs nothing but a probing `LoopMonitor`, and reads it in the same windows as the
server's own (a line `take` on stdin answers the longest stall in ms since the previous
one). Like the server itself, it is driven as a process, never imported. What the bare
loop sees is what this machine's scheduler does to any process while the engine computes
(a woken thread waiting for a core), not the server's code. The server's figure with the
same probe (`--loop-probe`) minus this one is what the server adds; the server's default
figure times its real traffic instead and has no bare-loop twin (nothing is handed to a
bare loop).
"""

from __future__ import annotations

import asyncio
import sys


class LoopFloor:
    """The bench's handle on the bare-loop process."""

    def __init__(self) -> None:
        self._process: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        self._process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "dgemma_lsp.server.loop_monitor",
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        )
        await self.take()  # the monitor runs once this answers

    async def take(self) -> float:
        """The bare loop's longest stall in ms since the previous call."""
        assert self._process is not None and self._process.stdin and self._process.stdout
        self._process.stdin.write(b"take\n")
        await self._process.stdin.drain()
        return float(await self._process.stdout.readline())

    async def stop(self) -> None:
        if self._process is not None and self._process.returncode is None:
            self._process.stdin.close()
            await self._process.wait()
