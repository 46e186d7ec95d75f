"""`dgemma-lsp bench soak`: does the language server's memory level off over a long day of editing?

One `dgemma-lsp --stdio` (the tiny model in process by default, so the engine's prompt cache
is in the measured process too) gets N documents one after another; each is opened (a
generated Python file of 5 to 400 functions, sizes cycling), edited and completed three
times (a keystroke, then an invoked inline completion), and closed. The server's resident
set size (VmRSS of its process, read from /proc) is sampled after the first document and
every `--sample-every` documents. The report gives every sample and the change from
document `--from` (default 200, after caches have filled) to the last: flat means within
±5%. `dgemma.serverStats` is asked at the end for what the server retains
(`retained`: open documents, cache entries, scheduler jobs, ...), which must not grow with N.

RSS is a count of pages, not a timing: machine load slows the run but does not move the
figure. Linux only (/proc). Knows JSON-RPC over stdio (bench/jsonrpc.py); nothing of the
server's internals.
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec

from .jsonrpc import JsonRpcClient

SIZES = (5, 40, 120, 400, 20, 200)
"""Functions per document, cycled: small and large files alternate as in a day of editing."""
FUNCTION = "def function_{i}(values):\n    total = 0\n    for value in values:\n        total += value * {i}\n    return total\n\n\n"
EDITS = 3


class Sample(msgspec.Struct, frozen=True, rename="camel"):
    documents: int
    rss_mb: float


class SoakReport(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    documents: int
    completions: int
    samples: list[Sample]
    flat_from: int
    change_percent: float
    """(RSS at the last sample - RSS at `flat_from`) / RSS at `flat_from`, in percent."""
    spread_percent: float
    """(max - min) / min of the samples from `flat_from` on, in percent."""
    flat: bool
    """|change| and spread within 5%."""
    retained: dict[str, Any] | None
    load_average: tuple[float, float]
    seconds: float


def document_text(number: int) -> str:
    functions = SIZES[number % len(SIZES)]
    return "import math\n\n\n" + "".join(FUNCTION.format(i=i) for i in range(functions))


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


async def soak(command: list[str], documents: int, sample_every: int, flat_from: int, progress=None) -> SoakReport:
    client = JsonRpcClient()
    # The completions of a soak are no user's: they stay out of `dgemma-lsp stats`.
    os.environ["DGEMMA_LSP_STATS_FILE"] = ""
    await client.start(*command)
    load_start, started = os.getloadavg()[0], time.monotonic()
    samples: list[Sample] = []
    completions = 0
    try:
        await client.request("initialize", {
            "processId": os.getpid(), "rootUri": None, "capabilities": {},
            "initializationOptions": {"steps": 1, "maxTokens": 8, "seed": 0, "debounceMs": 0, "earlyStop": False},
        })
        client.notify("initialized", {})
        pid = client._process.pid
        for number in range(1, documents + 1):
            uri = f"file:///soak/doc_{number}.py"
            text = document_text(number)
            client.notify("textDocument/didOpen", {"textDocument": {
                "uri": uri, "languageId": "python", "version": 1, "text": text}})
            line = text.count("\n") - 2  # inside the last function's blank lines
            for edit in range(EDITS):
                client.notify("textDocument/didChange", {
                    "textDocument": {"uri": uri, "version": edit + 2},
                    "contentChanges": [{"range": {"start": {"line": line, "character": 0},
                                                  "end": {"line": line, "character": 0}}, "text": "x"}],
                })
                await client.request("textDocument/inlineCompletion", {
                    "textDocument": {"uri": uri}, "position": {"line": line, "character": edit + 1},
                    "context": {"triggerKind": 1},
                })
                completions += 1
            client.notify("textDocument/didClose", {"textDocument": {"uri": uri}})
            if number == 1 or number % sample_every == 0 or number == documents:
                await client.request("workspace/executeCommand", {"command": "dgemma.status", "arguments": []})
                samples.append(Sample(number, round(rss_mb(pid), 1)))
                if progress:
                    progress(f"soak: {number} documents, RSS {samples[-1].rss_mb} MB")
        stats = await client.request("workspace/executeCommand", {"command": "dgemma.serverStats", "arguments": [{"retained": True}]})
        await client.request("shutdown")
        client.notify("exit")
    finally:
        await client.stop()
    tail = [s for s in samples if s.documents >= flat_from] or samples[-1:]
    change = (tail[-1].rss_mb - tail[0].rss_mb) / tail[0].rss_mb * 100
    spread = (max(s.rss_mb for s in tail) - min(s.rss_mb for s in tail)) / min(s.rss_mb for s in tail) * 100
    return SoakReport(
        documents=documents, completions=completions, samples=samples, flat_from=tail[0].documents,
        change_percent=round(change, 2), spread_percent=round(spread, 2),
        flat=abs(change) <= 5 and spread <= 5, retained=(stats or {}).get("retained"),
        load_average=(round(load_start, 2), round(os.getloadavg()[0], 2)),
        seconds=round(time.monotonic() - started, 1),
    )


def add_arguments(parser) -> None:
    parser.add_argument("--documents", type=int, default=1000, help="documents opened, edited, completed, closed")
    parser.add_argument("--sample-every", type=int, default=50, help="sample RSS every this many documents")
    parser.add_argument("--from", dest="flat_from", type=int, default=200,
                        help="judge flatness from this document on (caches fill before)")
    parser.add_argument("--engine", default="inprocess", choices=["inprocess", "auto", "daemon"],
                        help="where the model runs (inprocess: its memory counts too)")


def run(args) -> int:
    if args.documents < 1 or args.sample_every < 1:
        sys.stderr.write("dgemma-lsp bench soak: --documents and --sample-every must be at least 1\n")
        return 2
    fd, log_file = tempfile.mkstemp(prefix="dgemma-soak-", suffix=".log")
    os.close(fd)
    command = [sys.executable, "-m", "dgemma_lsp.server.cli", "--stdio", "--model", args.model or "tiny",
               "--engine", args.engine, "--log-file", log_file]
    try:
        report = asyncio.run(soak(command, args.documents, args.sample_every, args.flat_from,
                                  progress=lambda line: sys.stderr.write(line + "\n")))
    finally:
        tail = Path(log_file).read_text(errors="replace")[-2000:]
        os.unlink(log_file)
    if tail.strip():
        sys.stderr.write(f"server log (tail):\n{tail}\n")
    if getattr(args, "json", False):
        print(msgspec.json.encode(report).decode())
    else:
        for sample in report.samples:
            print(f"{sample.documents:6d} documents  RSS {sample.rss_mb:8.1f} MB")
        print(f"from document {report.flat_from}: change {report.change_percent:+.2f}%, spread "
              f"{report.spread_percent:.2f}% -> {'flat' if report.flat else 'NOT flat'} (±5%); "
              f"{report.completions} completions in {report.seconds:.0f} s, load {report.load_average}")
        print(f"retained at the end: {report.retained}")
    return 0 if report.flat else 1
