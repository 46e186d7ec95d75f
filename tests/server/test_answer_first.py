"""An inline completion's answer goes out before the status change its engine run caused.

A real `dgemma-lsp --stdio --model tiny-random` (the in-process engine, and the resident daemon),
driven by the benchmark's lean JSON-RPC client, whose every decoded message is noted in the
order it came off the pipe. The engine reports "ready" as it hands over the result the answer
is made from; the server holds that `dgemma/status` until the answer is written, then sends
it (server/lsp_server.py, `answer_first`). The stats line of the answer is written after it too.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from lsp_session import FAST, FIB, TIMEOUT

from dgemma_lsp.bench.jsonrpc import JsonRpcClient
from dgemma_lsp.server.stats import STATS_FILE_ENV


async def _session(tmp_path: Path, monkeypatch, *extra: str) -> tuple[list[tuple[str, Any]], list[dict]]:
    """One inline completion through a fresh server; every message in wire order, and the stats file's lines."""
    stats = tmp_path / "stats.jsonl"
    wire: list[tuple[str, Any]] = []
    client = JsonRpcClient()
    dispatch = client._dispatch

    def noting(message: dict) -> None:
        wire.append((message.get("method") or "response", message))
        dispatch(message)

    client._dispatch = noting
    monkeypatch.setenv(STATS_FILE_ENV, str(stats))  # the server's own stats file
    command = [sys.executable, "-m", "dgemma_lsp.server.cli", "--stdio", "--model", "tiny-random", *extra]
    ready = asyncio.Event()
    client.on("dgemma/status", lambda params: params["state"] == "ready" and ready.set())
    await client.start(*command)
    try:
        await asyncio.wait_for(client.request("initialize", {
            "processId": os.getpid(), "capabilities": {}, "rootUri": tmp_path.as_uri(),
            "initializationOptions": {**FAST, "status": True, "debounceMs": 0}}), TIMEOUT)
        client.notify("initialized", {})
        await asyncio.wait_for(ready.wait(), TIMEOUT)
        uri = (tmp_path / "fib.py").as_uri()
        text = FIB.read_text().replace("return \n", "return fib(n - 1) + \n")
        line = text[: text.index("+ \n")].count("\n")
        client.notify("textDocument/didOpen", {
            "textDocument": {"uri": uri, "languageId": "python", "version": 1, "text": text}})
        wire.clear()
        ready.clear()
        answer = await asyncio.wait_for(client.request("textDocument/inlineCompletion", {
            "textDocument": {"uri": uri}, "position": {"line": line, "character": len("    return fib(n - 1) + ")},
            "context": {"triggerKind": 1}}), TIMEOUT)
        await asyncio.wait_for(ready.wait(), TIMEOUT)  # the held status still comes
        await asyncio.wait_for(client.request("shutdown"), TIMEOUT)
        client.notify("exit")
    finally:
        await client.stop()
    assert answer["items"], "the tiny model always fills something in"
    return wire, [json.loads(line) for line in stats.read_text().splitlines()]


@pytest.mark.parametrize("engine", ["inprocess", "daemon"])
async def test_the_answer_goes_out_before_the_ready_status(tmp_path, monkeypatch, engine):
    extra = ("--engine", "inprocess") if engine == "inprocess" else ()
    wire, stats = await _session(tmp_path, monkeypatch, *extra)
    order = [name if name != "dgemma/status" else message["params"]["state"] for name, message in wire]
    assert "busy" in order, order  # the engine ran for this request
    assert order.index("response") < order.index("ready", order.index("busy")), order
    ready = next(m["params"] for name, m in wire if name == "dgemma/status" and m["params"]["state"] == "ready")
    assert ready["lastLatencyMs"] > 0  # the held status is the engine's, not a stale one
    assert [event["event"] for event in stats] == ["answered"]  # written after the answer, not lost
