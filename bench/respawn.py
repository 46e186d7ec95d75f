"""`dgemma-lsp bench respawn`: kill -9 of the engine daemon -> the next completion served.

A language server on the resident daemon (`--stdio --engine daemon`) must survive its daemon's
death: the front end notices, spawns a new daemon, and the request the user made meanwhile is
answered by it. This measures that path as a user meets it: one server on a private runtime dir,
one warm completion, then for each run the daemon is killed with SIGKILL and a completion is asked
for at once; the figure is the wall time until its answer (with the drafts the model streamed for
it, so an answer that never reached the model does not pass for a fast one). The daemon's own log
splits each respawn in three: until the new daemon listens, until its model is loaded, and the
first request itself. Where the daemon keeps a warm standby (engine/daemon/standby.py) the new
daemon is that standby, its imports long done; elsewhere a fresh process pays for them. The target is 5 s on the development
machine with the trained tiny model. Knows JSON-RPC over stdio and the daemon's log format.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec

from .jsonrpc import JsonRpcClient
from .report import say, write_report

TEXT = "def area(radius):\n    return \n\n\nprint(area(2.0))\n"
"""Each run opens it under a name of its own (area1, area2, ...)."""
CURSOR = {"line": 1, "character": 11}
SETTINGS = {"steps": 4, "maxTokens": 32, "seed": 7, "earlyStop": False, "debounceMs": 0, "status": True,
            "drafts": True}
TIMEOUT_S = 120.0
LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")


class Respawn(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """One kill -9 and the completion asked for right after it."""

    answered_s: float
    """From the SIGKILL to the completion's answer (wall seconds)."""
    items: int
    """Items in that answer (the model may give none)."""
    drafts: int
    """Drafts streamed for that request: none means the new daemon never ran it."""
    listening_s: float | None
    """From the SIGKILL to the new daemon's "serving" log line (start-up, command line, socket)."""
    loaded_s: float | None
    """From the SIGKILL to the new daemon's "loaded" log line (torch, transformers, the weights)."""
    load_ms: float | None
    """The load itself, as the daemon reports it."""


class RespawnReport(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    model: str
    runs: list[Respawn]
    median_answered_s: float
    max_answered_s: float
    load_average: list[float]
    """The machine's 1, 5 and 15 minute load averages when the runs ended."""


async def measure(model: str, runs: int, progress=None) -> RespawnReport:
    with tempfile.TemporaryDirectory(prefix="dgemma-respawn-") as folder:
        env = {**os.environ, "DGEMMA_LSP_RUNTIME_DIR": folder, "PYTHONWARNINGS": "ignore"}
        client = JsonRpcClient()
        states: list[str] = []
        changed = asyncio.Event()

        def on_status(params: dict[str, Any]) -> None:
            states.append(params.get("state"))
            changed.set()

        client.on("dgemma/status", on_status)
        drafts = [0]
        client.on("dgemma/draft", lambda params: drafts.__setitem__(0, drafts[0] + 1))
        command = [sys.executable, "-m", "dgemma_lsp.server.cli", "--stdio", "--engine", "daemon", "--model", model,
                   "--log-file", str(Path(folder) / "server.log")]
        await _start(client, command, env)
        try:
            await client.request("initialize", {"processId": os.getpid(), "capabilities": {},
                                                "initializationOptions": SETTINGS, "rootUri": None})
            client.notify("initialized", {})
            await _wait_state(states, changed, "ready")
            await _complete(client, _open(client, 0))  # warm: the first daemon's load is not what is measured
            results = []
            for run in range(runs):
                uri = _open(client, run + 1)  # a document of its own: the server's cache cannot answer
                pid = _daemon_pid(env)
                log = _daemon_log(folder)
                log_offset = log.stat().st_size if log.exists() else 0
                killed_at = time.time()
                started = time.perf_counter()
                os.kill(pid, signal.SIGKILL)
                drafts[0] = 0
                items = await _complete(client, uri)
                answered = time.perf_counter() - started
                listening, loaded, load_ms = _phases(_daemon_log(folder), log_offset, killed_at)
                results.append(Respawn(answered_s=round(answered, 3), items=items, drafts=drafts[0], listening_s=listening,
                                       loaded_s=loaded, load_ms=load_ms))
                if progress:
                    progress(f"respawn {run + 1}/{runs}: answered in {answered:.2f} s with {items} items, {drafts[0]} drafts "
                             f"(listening {listening} s, loaded {loaded} s after the kill)")
            await client.request("shutdown")
            client.notify("exit")
        finally:
            await client.stop()
            subprocess.run([sys.executable, "-m", "dgemma_lsp.server.cli", "engine", "stop"], env=env,
                           capture_output=True, timeout=60)
    answered = [r.answered_s for r in results]
    return RespawnReport(model=model, runs=results, median_answered_s=round(statistics.median(answered), 3),
                         max_answered_s=max(answered), load_average=[round(x, 2) for x in os.getloadavg()])


async def _start(client: JsonRpcClient, command: list[str], env: dict[str, str]) -> None:
    saved = dict(os.environ)
    os.environ.update(env)  # the client starts its subprocess with this process's environment
    try:
        await client.start(*command)
    finally:
        os.environ.clear()
        os.environ.update(saved)


async def _wait_state(states: list[str], changed: asyncio.Event, wanted: str) -> None:
    async def loop() -> None:
        while wanted not in states:
            changed.clear()
            await changed.wait()

    await asyncio.wait_for(loop(), TIMEOUT_S)


def _open(client: JsonRpcClient, number: int) -> str:
    uri = f"file:///tmp/respawn_{number}.py"
    client.notify("textDocument/didOpen", {"textDocument": {
        "uri": uri, "languageId": "python", "version": 1, "text": TEXT.replace("area", f"area{number}")}})
    return uri


async def _complete(client: JsonRpcClient, uri: str) -> int:
    result = await asyncio.wait_for(client.request("textDocument/inlineCompletion", {
        "textDocument": {"uri": uri}, "position": CURSOR, "context": {"triggerKind": 1}}), TIMEOUT_S)
    return len((result or {}).get("items", []))


def _daemon_pid(env: dict[str, str]) -> int:
    done = subprocess.run([sys.executable, "-m", "dgemma_lsp.server.cli", "engine", "status", "--json"], env=env,
                          capture_output=True, text=True, timeout=60)
    running = [d for d in json.loads(done.stdout or "[]") if d.get("running") and d.get("state") != "unknown"]
    if len(running) != 1:
        raise RuntimeError(f"`engine status` found {len(running)} answering daemons (exit {done.returncode}): "
                           f"{done.stdout.strip()} {done.stderr.strip()}")
    return int(running[0]["pid"])


def _daemon_log(folder: str) -> Path:
    logs = sorted(Path(folder).rglob("*.log"), key=lambda p: p.stat().st_mtime)
    logs = [p for p in logs if p.name != "server.log"]
    return logs[-1] if logs else Path(folder) / "missing.log"


def _phases(log: Path, offset: int, killed_at: float) -> tuple[float | None, float | None, float | None]:
    """Seconds from the kill to the new daemon's "serving" and "loaded" lines, and the load's own ms."""
    if not log.exists():
        return None, None, None
    with log.open("rb") as file:
        file.seek(offset)
        lines = file.read().decode("utf-8", "replace").splitlines()
    listening = loaded = load_ms = None
    for line in lines:
        stamp = LOG_TIME.match(line)
        if not stamp:
            continue
        at = datetime.datetime.strptime(stamp.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp() - killed_at
        if listening is None and " serving " in line:
            listening = round(at, 3)
        elif loaded is None and " loaded in " in line:
            loaded = round(at, 3)
            found = re.search(r"loaded in (\d+) ms", line)
            load_ms = float(found.group(1)) if found else None
    return listening, loaded, load_ms


def add_arguments(parser) -> None:
    parser.add_argument("--runs", type=int, default=3, help="kills, one after another (default 3)")


def format_table(report: RespawnReport) -> str:
    lines = [f"kill -9 of the daemon -> next completion, --model {report.model}, {len(report.runs)} runs "
             f"(load average {report.load_average[0]:.2f} {report.load_average[1]:.2f} {report.load_average[2]:.2f}):"]
    for index, item in enumerate(report.runs, 1):
        lines.append(f"  {index}: {item.answered_s:.2f} s, {item.items} items, {item.drafts} drafts; listening at "
                     f"{item.listening_s} s, its model loaded at {item.loaded_s} s (the load: {item.load_ms} ms)")
    lines.append(f"  median {report.median_answered_s:.2f} s, max {report.max_answered_s:.2f} s (target: 5 s)")
    return "\n".join(lines)


def run(args) -> int:
    model = getattr(args, "model", None) or "tiny"
    report = asyncio.run(measure(model, args.runs, progress=say))
    write_report(report, args.json, format_table)
    return 0 if all(item.drafts for item in report.runs) else 1
