"""Shared helpers for the daemon tests (imported as `daemon_helpers`): requests, waits, the CLI."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

from dgemma_lsp.engine.api import DenoiseRequest, EngineStatus, GenerationSettings, InfillContext
from dgemma_lsp.engine.daemon.protocol import Hello, daemon_decoder, encode_frame

TIMEOUT = 240.0
"""Seconds any single wait may take: the tiny model on a busy 2-core machine is slow, never stuck."""

CONTEXT = InfillContext(prefix="def area(radius):\n    return ", suffix="\n\nprint(area(2.0))\n", language="python")


def quick(priority: int = 0) -> DenoiseRequest:
    """A request the tiny model answers in two steps."""
    settings = GenerationSettings(steps=2, max_tokens=16, seed=1, early_stop=False)
    return DenoiseRequest(context=CONTEXT, settings=settings, priority=priority)


LONG = DenoiseRequest(
    context=CONTEXT, settings=GenerationSettings(steps=100_000, max_tokens=16, seed=1, early_stop=False)
)
"""A request that runs until it is cancelled."""


async def within(awaitable, seconds: float = TIMEOUT):
    return await asyncio.wait_for(awaitable, seconds)


async def wait_for_status(client, predicate) -> EngineStatus:
    """Wait until the client's status satisfies `predicate` (woken by its status listener)."""
    changed = asyncio.Event()
    client.on_status(lambda status: changed.set())

    async def loop() -> EngineStatus:
        while not predicate(client.status()):
            changed.clear()
            await changed.wait()
        return client.status()

    return await within(loop())


async def raw_hello(paths, hello: Hello):
    """Send one Hello on a fresh connection; the daemon's first answer (None if it just closed)."""
    from dgemma_lsp.engine.daemon.client import open_stream

    reader, writer = await open_stream(paths)
    try:
        writer.write(encode_frame(hello))
        decoder = daemon_decoder()
        while True:
            data = await within(reader.read(65536), 30)
            if not data:
                return None
            messages = decoder.feed(data)
            if messages:
                return messages[0]
    finally:
        writer.close()


def dgemma(*args: str, timeout: float = TIMEOUT, model: str | None = "tiny-random") -> subprocess.CompletedProcess:
    """Run the real CLI with this process's environment (and so its runtime dir); `--model`
    is added unless `args` has one or `model` is None."""
    if model is not None and "--model" not in args:
        args = (*args, "--model", model)
    return subprocess.run(
        [sys.executable, "-m", "dgemma_lsp.server.cli", *args],
        capture_output=True, text=True, timeout=timeout, env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )


def engine_status(*extra: str) -> dict:
    """`engine status --json` narrowed to one daemon (the tiny model's unless `extra` says):
    its entry, or `{"running": False}`."""
    done = dgemma("engine", "status", "--json", *extra)
    assert done.returncode in (0, 3), done.stderr
    engines = json.loads(done.stdout)
    assert isinstance(engines, list) and len(engines) <= 1, engines
    assert (done.returncode == 0) == bool(engines)
    return engines[0] if engines else {"running": False}
