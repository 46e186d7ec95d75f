"""`dgemma-lsp bench latency`: what an editor waits for, keystroke by keystroke.

A real LSP client starts `dgemma-lsp --stdio` as a subprocess, opens a
real source file (the standard library's textwrap.py unless --file says
otherwise), and types 200 keystrokes into a function body: each is an
incremental didChange followed by an Automatic inlineCompletion request, and
then the same request again, which a working cache answers without the model.
Per keystroke it times, from the didChange being sent:
  finalMs          until the answer arrives;
  firstDraftMs     until the first `dgemma/draft` notification (drafts opted in);
  cacheHitMs       the repeated request, answered from the cache;
  serverOverheadMs finalMs minus the engine's own time for that request (the
                   `lastLatencyMs` of the `dgemma/status` notification the server
                   sends when the engine finishes, right after the answer): parse,
                   plan, context, post-process, thread hand-off and JSON-RPC
                   both ways. Tokenizing the prompt is counted as engine time;
  loopStallMs      the longest time the server's event loop was blocked during the
                   keystroke: what a callback handed to it from another thread waited, or
                   its longest pass (its loop monitor, read with the `dgemma.serverStats`
                   command after the keystroke's two requests), {p50, p99, max}. With
                   --loop-probe the monitor also probes the loop every millisecond, as it
                   once did; the probe slows the server it measures
                   (server/loop_monitor.py), so it is off by default;
  loopBusyMs       the longest single pass of the server's event loop through its ready
                   callbacks during the keystroke (the same monitor), {p50, p99, max}: the
                   part of a stall that is our own code holding the loop, without the
                   loop's thread waking up (the OS, the GIL at wake-up);
  loopStallFloorMs with --loop-floor only: the 1 ms probe in a bare event loop beside the
                   server (compare it with a --loop-probe run), read in the same windows
                   (bench/loop_floor.py): what this machine's scheduler does to any process while the engine computes,
                   {p50, p99, max}. Off by default: a process waking every millisecond
                   on two cores adds ~0.5 ms to the overhead's p50 and ~1 ms to its p99;
  encodedTokens    prompt tokens the engine encoded for the request after its prompt
                   cache (the same command);
  answersFromDrafts keystrokes whose answer was ready when the engine's result came
                   (finished on the server's worker from the last draft; the same command).
Each as {p50, p99} unless said otherwise. `--lines N` types into a generated Python
file of N lines instead (the 10,000-line variant: `--lines 10000`). Keystrokes are sent one at a time (the next after the
answer), with the coalescing window set to 0: this measures the work, not a
debounce. The client is bench/jsonrpc.py, which decodes with msgspec and converts
nothing: the window holds the server's work and the pipe, not a Python client's (pygls' client
converts every answer, status and draft inside the window, on the same cores). Knows LSP and our
custom notifications; imports no torch.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import msgspec

from .cpu_anatomy import Anatomy, CpuWatch, verdict
from .jsonrpc import JsonRpcClient
from .loop_floor import LoopFloor
from .report import say

KEYSTROKES = 200
SLOWEST = 5
"""Keystrokes --anatomy reports."""
TARGET_OVERHEAD_P99_MS = 4.0
TARGET_CACHE_HIT_P99_MS = 1.5
TARGET_LOOP_STALL_P99_MS = 2.0
STATS_COMMAND = "dgemma.serverStats"
TYPED_LINE = "result = [part.strip() for part in text.split(sep) if part]"
"""What the benchmark types, again and again on fresh lines: a plausible Python statement."""
START_TIMEOUT_S = 300.0
"""Model load on a busy machine; after that each request gets REQUEST_TIMEOUT_S."""
REQUEST_TIMEOUT_S = 120.0
INDEX_TIMEOUT_S = 900.0
"""With --workspace: how long the server's cross-file index may take to build before typing starts."""
INDEX_POLL_S = 2.0
"""With --workspace: how often the index's state is asked for while it builds (every message from the
client pauses the build for the server's QUIET_S, 0.25 s: asking much more often would stop it)."""
AUTOMATIC_TRIGGER = 2
"""InlineCompletionTriggerKind.Automatic."""


class Percentiles(msgspec.Struct, frozen=True):
    p50: float | None
    p99: float | None


class StallPercentiles(msgspec.Struct, frozen=True):
    p50: float | None
    p99: float | None
    max: float | None


class LoadAverage(msgspec.Struct, frozen=True):
    """The machine's 1-minute load average when a run started and when it ended: on two cores
    a figure taken at a load above ~1 is noise (another process had a core)."""
    start: float
    end: float


class LatencyReport(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    model: str
    file: str
    keystrokes: int
    steps: int | None
    """Denoising steps per canvas the server was configured with."""
    max_tokens: int
    prompt_layout: str | None = None
    """The server's promptLayout setting (None: its default)."""
    cross_file: bool = True
    """The server's crossFile setting (--no-cross-file: off, the prompt holds the file alone)."""
    first_draft_ms: Percentiles
    final_ms: Percentiles
    cache_hit_ms: Percentiles
    server_overhead_ms: Percentiles
    engine_ms: Percentiles
    """The engine's own time per request (prompt encoding + denoising), for reference."""
    cache_hits: int
    """Repeated requests answered without the engine (of `keystrokes`)."""
    loop_stall_ms: StallPercentiles
    """Per keystroke, the longest time the server's event loop was blocked."""
    loop_busy_ms: StallPercentiles
    """Per keystroke, the longest pass of the server's event loop through its ready callbacks."""
    loop_probe: bool = False
    """Whether the server's loop monitor also probed the loop every millisecond (`--loop-probe`)."""
    loop_stall_floor_ms: StallPercentiles | None
    """Per keystroke, the longest stall of a bare event loop beside the server (the machine's
    floor); None unless asked for (`--loop-floor`)."""
    encoded_tokens: Percentiles
    """Prompt tokens encoded per request after the engine's prompt cache."""
    answers_from_drafts: int = 0
    """Keystrokes (of `keystrokes`) whose answer was finished from the last draft before the result came."""
    targets: dict[str, float]
    """serverOverheadP99, cacheHitP99 and loopStallP99 targets in ms (on the 2-core development machine)."""
    targets_met: dict[str, bool]
    load_average: LoadAverage | None = None
    workspace: str | None = None
    """With --workspace: the folder the server indexed before typing started."""
    index_files: int | None = None
    """With --workspace: files in the server's cross-file index when typing started."""
    index_wall_s: float | None = None
    """With --workspace: seconds (wall) from `initialized` until the index was complete (the model loads
    in the same time)."""
    slowest: list[SlowKeystroke] | None = None
    """With --anatomy: the keystrokes of the largest server overhead, and who had the cores meanwhile."""


class SlowKeystroke(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """One keystroke of a large server overhead, with the cores' use in its window (bench/cpu_anatomy.py)."""

    index: int
    """Its place among the measured keystrokes."""
    overhead_ms: float
    final_ms: float
    engine_ms: float
    loop_stall_ms: float | None
    anatomy: Anatomy
    verdict: str


class PooledFigures(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """The three latency targets' figures over every keystroke of every run together."""
    keystrokes: int
    server_overhead_ms: Percentiles
    cache_hit_ms: Percentiles
    loop_stall_ms: StallPercentiles


class LatencySeries(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """`--runs N`: N typing sessions in a row, each a fresh server (the engine daemon stays
    resident between them, as it does between an editor's sessions). The targets are judged per
    run ("in one run"); how many runs met all three says how often this machine's noise lets
    them be met, and the pooled percentiles estimate p99 from N times as many keystrokes."""
    runs: list[LatencyReport]
    runs_meeting_all_targets: int
    pooled: PooledFigures


def percentiles(values: list[float]) -> Percentiles:
    if not values:
        return Percentiles(None, None)
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, int(round(0.99 * (len(ordered) - 1))))]
    return Percentiles(round(statistics.median(ordered), 3), round(p99, 3))


# -- the typing session -------------------------------------------------------------------------


def default_file() -> Path:
    return Path(textwrap.__file__)


def typing_point(text: str) -> tuple[int, str]:
    """(line index, indentation) of a statement line in the middle of the first long function body."""
    lines = text.split("\n")
    middle = len(lines) // 2
    for index in list(range(middle, len(lines))) + list(range(0, middle)):
        line = lines[index]
        stripped = line.strip()
        if line.startswith("        ") and stripped and not stripped.startswith(("#", '"', "'", ")", "]", "}")):
            if not stripped.endswith((",", "(", "[", "{", "\\")):
                return index, line[: len(line) - len(line.lstrip())]
    raise ValueError("no indented statement line to type after")


class _Recorder:
    """The server's notifications, attributed to the request whose window is open.

    The engine publishes "busy" before it starts (so always before the answer)
    and "ready" with its `lastLatencyMs` when it finishes, which the server sends
    just after the answer: a window that saw "busy" waits for "ready" before it
    closes. A window without "busy" was answered without the engine.
    """

    def __init__(self) -> None:
        self.window_open = False
        self.first_draft: float | None = None
        self.busy_seen = False
        self.engine_ms: float | None = None
        self.state: str | None = None
        self.engine_done = asyncio.Event()

    def open(self) -> None:
        self.window_open, self.first_draft, self.busy_seen, self.engine_ms = True, None, False, None
        self.engine_done.clear()

    async def close(self) -> None:
        if self.busy_seen and self.engine_ms is None:
            await asyncio.wait_for(self.engine_done.wait(), REQUEST_TIMEOUT_S)
        self.window_open = False

    def draft(self, _params: Any) -> None:
        if self.window_open and self.first_draft is None:
            self.first_draft = time.perf_counter()

    def status(self, params: dict[str, Any]) -> None:
        self.state = params.get("state")
        if not self.window_open:
            return
        if self.state == "busy":
            self.busy_seen = True
        elif self.state == "ready" and self.busy_seen and params.get("lastLatencyMs") is not None:
            self.engine_ms = float(params["lastLatencyMs"])
            self.engine_done.set()


async def measure(
    command: list[str],
    file: Path,
    *,
    keystrokes: int = KEYSTROKES,
    settings: dict[str, Any],
    warmup: int = 3,
    loop_floor: bool = False,
    loop_probe: bool = False,
    workspace: Path | None = None,
    anatomy: bool = False,
    progress=None,
) -> dict[str, list[float] | int]:
    """Drive one server through the session; returns the raw samples.

    `workspace`: the folder the server opens as its workspace (its cross-file index is built
    over it, and typing starts once it is complete); default: the file's folder, typing at once."""
    recorder = _Recorder()
    ready = asyncio.Event()
    client = JsonRpcClient()
    client.on("dgemma/draft", recorder.draft)

    def on_status(params: dict[str, Any]) -> None:
        recorder.status(params)
        if recorder.state in ("ready", "error"):
            ready.set()

    client.on("dgemma/status", on_status)
    if progress:
        client.on("window/showMessage", lambda params: progress(f"server: {params['message']}"))

    await client.start(*command)
    samples: dict[str, Any] = {"final": [], "first_draft": [], "cache_hit": [], "overhead": [], "engine": [],
                               "cache_hits": 0, "loop_stall": [], "loop_busy": [], "loop_floor": [], "encoded": [],
                               "from_drafts": 0}
    floor = LoopFloor() if loop_floor else None
    try:
        await asyncio.wait_for(client.request("initialize", {
            "processId": os.getpid(),
            "capabilities": {"general": {"positionEncodings": ["utf-16"]}},
            "initializationOptions": settings,
            "rootUri": (workspace or file.parent).resolve().as_uri(),
        }), START_TIMEOUT_S)
        client.notify("initialized", {})
        initialized = time.perf_counter()
        await asyncio.wait_for(ready.wait(), START_TIMEOUT_S)
        if recorder.state == "error":
            raise RuntimeError("the server's model failed to load")

        text = file.read_text(encoding="utf-8")
        uri = file.resolve().as_uri()
        client.notify("textDocument/didOpen", {
            "textDocument": {"uri": uri, "languageId": "python", "version": 1, "text": text}})
        line, indent = typing_point(text)

        async def server_stats(*arguments: Any) -> dict[str, Any]:
            result = await asyncio.wait_for(client.request("workspace/executeCommand", {
                "command": STATS_COMMAND, "arguments": list(arguments)}), REQUEST_TIMEOUT_S)
            return result or {}

        stats = await server_stats({"probe": loop_probe})  # starts the server's loop monitor
        if workspace is not None:  # the index built first: this measures typing beside a full index
            while not (stats.get("crossFileIndex") or {}).get("complete"):
                if time.perf_counter() - initialized > INDEX_TIMEOUT_S:
                    raise RuntimeError(f"the cross-file index of {workspace} took over {INDEX_TIMEOUT_S:.0f} s")
                await asyncio.sleep(INDEX_POLL_S)
                stats = await server_stats()
            samples["index_files"] = int(stats["crossFileIndex"]["files"])
            samples["index_wall_s"] = round(time.perf_counter() - initialized, 2)
            if progress:
                progress(f"latency: index of {workspace}: {samples['index_files']} files, "
                         f"{samples['index_wall_s']} s after initialized (wall, while the model loaded too)")
        if floor is not None:
            await floor.start()
        watch = CpuWatch(client.pid, _daemon_pid(command)) if anatomy else None
        samples["anatomy"] = []
        lines = text.split("\n")
        row, column, version = line, len(lines[line]), 1
        script = _keystroke_script(indent, warmup + keystrokes)
        drafts_before = 0

        async def complete() -> None:
            await asyncio.wait_for(client.request("textDocument/inlineCompletion", {
                "textDocument": {"uri": uri},
                "position": {"line": row, "character": column},
                "context": {"triggerKind": AUTOMATIC_TRIGGER},
            }), REQUEST_TIMEOUT_S)

        for index, typed in enumerate(script):
            version += 1
            at = {"line": row, "character": column}
            recorder.open()
            before = watch.read() if watch is not None else None
            started = time.perf_counter()
            client.notify("textDocument/didChange", {
                "textDocument": {"uri": uri, "version": version},
                "contentChanges": [{"range": {"start": at, "end": at}, "text": typed}],
            })
            if typed.startswith("\n"):
                row, column = row + 1, len(typed) - 1
            else:
                column += len(typed)  # ASCII only: UTF-16 units == characters
            await complete()
            final = time.perf_counter()
            window = watch.anatomy(before, watch.read(), final - started) if watch is not None else None
            await recorder.close()
            first_draft, engine_ms = recorder.first_draft, recorder.engine_ms

            recorder.open()  # the same request again: the cache's turn
            again = time.perf_counter()
            await complete()
            hit_ms = (time.perf_counter() - again) * 1000
            await recorder.close()
            hit = not recorder.busy_seen
            stats = await server_stats()
            floor_ms = None if floor is None else await floor.take()
            if index < warmup:
                drafts_before = int(stats.get("answersFromDrafts") or 0)
                continue
            samples["from_drafts"] = int(stats.get("answersFromDrafts") or 0) - drafts_before
            if floor_ms is not None:
                samples["loop_floor"].append(floor_ms)
            if stats.get("loopStallMs") is not None:
                samples["loop_stall"].append(float(stats["loopStallMs"]))
            if stats.get("loopBusyMs") is not None:
                samples["loop_busy"].append(float(stats["loopBusyMs"]))
            samples["encoded"].extend(int(n) for n in stats.get("encodedTokens") or ())
            final_ms = (final - started) * 1000
            samples["final"].append(final_ms)
            if first_draft is not None:
                samples["first_draft"].append((first_draft - started) * 1000)
            if engine_ms is not None:
                samples["engine"].append(engine_ms)
                samples["overhead"].append(max(0.0, final_ms - engine_ms))
                if window is not None:
                    samples["anatomy"].append((index - warmup, final_ms, engine_ms, stats.get("loopStallMs"), window))
            if hit:
                samples["cache_hits"] += 1
                samples["cache_hit"].append(hit_ms)
            if progress and (index - warmup + 1) % 50 == 0:
                progress(f"latency: {index - warmup + 1}/{keystrokes} keystrokes")
        await asyncio.wait_for(client.request("shutdown"), REQUEST_TIMEOUT_S)
        client.notify("exit")
    finally:
        if floor is not None:
            await floor.stop()
        await client.stop()
    return samples


def _keystroke_script(indent: str, count: int) -> list[str]:
    """One change per keystroke: characters of TYPED_LINE, and Enter with the editor's auto-indent."""
    script: list[str] = []
    while len(script) < count:
        script.append("\n" + indent)
        script.extend(TYPED_LINE)
    return script[:count]


def server_command(model: str, device: str | None, dtype: str | None, log_file: str) -> list[str]:
    command = [sys.executable, "-m", "dgemma_lsp.server.cli", "--stdio", "--model", model, "--log-file", log_file]
    if device:
        command += ["--device", device]
    if dtype:
        command += ["--dtype", dtype]
    return command


def _daemon_pid(command: list[str]) -> int | None:
    """The engine daemon serving the server's model (None for an engine in the server's process)."""
    if "inprocess" in command:
        return None
    model = command[command.index("--model") + 1]
    done = subprocess.run([sys.executable, "-m", "dgemma_lsp.server.cli", "engine", "status", "--json",
                           "--model", model], capture_output=True, text=True, timeout=60)
    running = [d for d in json.loads(done.stdout or "[]") if d.get("running") and d.get("pid")]
    return int(running[0]["pid"]) if running else None


def _slowest(found: list, count: int = SLOWEST) -> list[SlowKeystroke]:
    ranked = sorted(found, key=lambda item: item[1] - item[2], reverse=True)[:count]
    return [SlowKeystroke(index=index, overhead_ms=round(final - engine, 3), final_ms=round(final, 3),
                          engine_ms=round(engine, 3), loop_stall_ms=stall, anatomy=window, verdict=verdict(window))
            for index, final, engine, stall, window in ranked]


def run_benchmark(model: str = "tiny", **options) -> LatencyReport:
    """One typing session (see the module docstring); `options` are `_run_once`'s."""
    return _run_once(model, **options)[0]


def run_series(model: str = "tiny", *, runs: int, progress=None, **options) -> LatencySeries:
    """`runs` typing sessions one after another; each judged on its own, and all pooled."""
    if runs < 1:
        raise ValueError(f"--runs must be at least 1, got {runs}")
    reports: list[LatencyReport] = []
    samples_of_runs: list[dict[str, Any]] = []
    for number in range(1, runs + 1):
        report, samples = _run_once(model, progress=progress, **options)
        reports.append(report)
        samples_of_runs.append(samples)
        if progress:
            progress(f"latency: run {number}/{runs}: {_run_summary(report)}")
    return LatencySeries(
        runs=reports,
        runs_meeting_all_targets=sum(all(report.targets_met.values()) for report in reports),
        pooled=pooled_figures(samples_of_runs, keystrokes=sum(report.keystrokes for report in reports)),
    )


def pooled_figures(samples_of_runs: list[dict[str, Any]], *, keystrokes: int) -> PooledFigures:
    """The targets' figures over the raw samples of every run together (never from the runs'
    percentiles: a median of medians is not the median of the keystrokes)."""

    def every(name: str) -> list[float]:
        return [value for samples in samples_of_runs for value in samples[name]]

    return PooledFigures(
        keystrokes=keystrokes,
        server_overhead_ms=percentiles(every("overhead")),
        cache_hit_ms=percentiles(every("cache_hit")),
        loop_stall_ms=_stall_percentiles(every("loop_stall")),
    )


def _run_once(
    model: str,
    *,
    file: Path | None = None,
    lines: int | None = None,
    keystrokes: int = KEYSTROKES,
    steps: int | None = 8,
    max_tokens: int = 32,
    device: str | None = None,
    dtype: str | None = None,
    layout: str | None = None,
    loop_floor: bool = False,
    loop_probe: bool = False,
    workspace: Path | None = None,
    cross_file: bool = True,
    anatomy: bool = False,
    progress=None,
) -> tuple[LatencyReport, dict[str, Any]]:
    """One typing session: its report, and the raw samples (`measure`) a series pools."""
    generated = None
    if lines is not None:  # a generated Python file of that size (the big-file variant)
        from .syntax_bench import generate_source

        generated = tempfile.TemporaryDirectory(prefix="dgemma-bench-")
        file = Path(generated.name) / f"generated_{lines}.py"
        file.write_text(generate_source("python", lines), encoding="utf-8")
    file = file or default_file()
    if workspace is not None:
        workspace = workspace.resolve()
        if workspace not in file.resolve().parents:
            raise ValueError(f"--file {file} is not inside --workspace {workspace} (the index covers the workspace)")
    settings = {"drafts": True, "status": True, "debounceMs": 0, "maxTokens": max_tokens, "seed": 0}
    if steps is not None:
        settings["steps"] = steps
    if layout is not None:
        settings["promptLayout"] = layout
    if not cross_file:
        settings["crossFile"] = False
    fd, log_file = tempfile.mkstemp(prefix="dgemma-bench-", suffix=".log")
    os.close(fd)
    load_at_start = os.getloadavg()[0]
    try:
        samples = asyncio.run(measure(server_command(model, device, dtype, log_file), file,
                                      keystrokes=keystrokes, settings=settings, loop_floor=loop_floor,
                                      loop_probe=loop_probe, workspace=workspace, anatomy=anatomy,
                                      progress=progress))
    except Exception:
        tail = Path(log_file).read_text(errors="replace")[-2000:]
        if tail and progress:
            progress(f"server log (tail):\n{tail}")
        raise
    finally:
        os.unlink(log_file)
        if generated is not None:
            generated.cleanup()
    overhead, hit = percentiles(samples["overhead"]), percentiles(samples["cache_hit"])
    stall = _stall_percentiles(samples["loop_stall"])
    report = LatencyReport(
        model=model,
        file=str(file),
        keystrokes=keystrokes,
        steps=steps,
        max_tokens=max_tokens,
        prompt_layout=layout,
        cross_file=cross_file,
        first_draft_ms=percentiles(samples["first_draft"]),
        final_ms=percentiles(samples["final"]),
        cache_hit_ms=hit,
        server_overhead_ms=overhead,
        engine_ms=percentiles(samples["engine"]),
        cache_hits=samples["cache_hits"],
        loop_stall_ms=stall,
        loop_busy_ms=_stall_percentiles(samples["loop_busy"]),
        loop_probe=loop_probe,
        loop_stall_floor_ms=_stall_percentiles(samples["loop_floor"]) if loop_floor else None,
        encoded_tokens=percentiles(samples["encoded"]),
        answers_from_drafts=samples["from_drafts"],
        targets={"serverOverheadP99": TARGET_OVERHEAD_P99_MS, "cacheHitP99": TARGET_CACHE_HIT_P99_MS,
                 "loopStallP99": TARGET_LOOP_STALL_P99_MS},
        targets_met={
            "serverOverheadP99": overhead.p99 is not None and overhead.p99 <= TARGET_OVERHEAD_P99_MS,
            "cacheHitP99": hit.p99 is not None and hit.p99 <= TARGET_CACHE_HIT_P99_MS,
            "loopStallP99": stall.p99 is not None and stall.p99 <= TARGET_LOOP_STALL_P99_MS,
        },
        load_average=LoadAverage(round(load_at_start, 2), round(os.getloadavg()[0], 2)),
        workspace=str(workspace) if workspace is not None else None,
        index_files=samples.get("index_files"),
        index_wall_s=samples.get("index_wall_s"),
        slowest=_slowest(samples["anatomy"]) if anatomy else None,
    )
    return report, samples


def _stall_percentiles(values: list[float]) -> StallPercentiles:
    p = percentiles(values)
    return StallPercentiles(p.p50, p.p99, round(max(values), 3) if values else None)


def table_rows(report: LatencyReport) -> list[tuple[str, str, str]]:
    """(benchmark, figure, value) rows for `bench all` and the plain output."""
    name = f"latency {report.model} x{report.keystrokes}"

    def cell(p: Percentiles, target: float | None = None) -> str:
        if p.p50 is None:
            return "no samples"
        text = f"p50 {p.p50:.2f}  p99 {p.p99:.2f}"
        if target is not None:
            text += f"  (target p99 <= {target:g}: {'met' if p.p99 <= target else 'MISSED'})"
        return text

    return [
        (name, "firstDraftMs", cell(report.first_draft_ms)),
        (name, "finalMs", cell(report.final_ms)),
        (name, "engineMs", cell(report.engine_ms)),
        (name, "serverOverheadMs", cell(report.server_overhead_ms, TARGET_OVERHEAD_P99_MS)),
        (name, "cacheHitMs", cell(report.cache_hit_ms, TARGET_CACHE_HIT_P99_MS)),
        (name, "cache hits", f"{report.cache_hits}/{report.keystrokes}"),
        (name, "loopStallMs", cell(Percentiles(report.loop_stall_ms.p50, report.loop_stall_ms.p99),
                                   TARGET_LOOP_STALL_P99_MS)
         + ("" if report.loop_stall_ms.max is None else f"  max {report.loop_stall_ms.max:.2f}")
         + ("  (with the 1 ms probe)" if report.loop_probe else "")),
        (name, "loopBusyMs", cell(Percentiles(report.loop_busy_ms.p50, report.loop_busy_ms.p99))
         + ("" if report.loop_busy_ms.max is None else f"  max {report.loop_busy_ms.max:.2f}")
         + "  (our code holding the loop)"),
        *([] if report.loop_stall_floor_ms is None else [
            (name, "loopStallFloorMs",
             cell(Percentiles(report.loop_stall_floor_ms.p50, report.loop_stall_floor_ms.p99))
             + f"  max {report.loop_stall_floor_ms.max:.2f}  (a bare loop beside the server)")]),
        (name, "encodedTokens", "no samples" if report.encoded_tokens.p50 is None
         else f"p50 {report.encoded_tokens.p50:g}  p99 {report.encoded_tokens.p99:g}"),
        (name, "answersFromDrafts", f"{report.answers_from_drafts}/{report.keystrokes}"),
        *([] if report.load_average is None else [
            (name, "loadAverage", f"{report.load_average.start:.2f} -> {report.load_average.end:.2f}  (1 minute)")]),
        *([] if report.workspace is None else [
            (name, "workspace", f"{report.workspace}: {report.index_files} files indexed, complete "
                                f"{report.index_wall_s} s after initialized (wall)")]),
        *[(name, f"slow #{k.index}", _slow_cell(k)) for k in report.slowest or ()],
    ]


def _slow_cell(k: SlowKeystroke) -> str:
    a = k.anatomy
    return (f"overhead {k.overhead_ms:.1f} ms (final {k.final_ms:.1f}, stall {k.loop_stall_ms}): loop on a core "
            f"{a.loop_cpu_ms}, waiting {a.loop_wait_ms}; server's other threads {a.server_other_cpu_ms}, daemon "
            f"{a.daemon_cpu_ms}, bench {a.client_cpu_ms}, everything else {a.others_cpu_ms}, steal {a.steal_ms} "
            f"-> {k.verdict}")


def _run_summary(report: LatencyReport) -> str:
    """One run on one line: the three targets' p99s, and whether it met all three."""
    met = all(report.targets_met.values())
    load = "" if report.load_average is None else \
        f"load {report.load_average.start:.2f} -> {report.load_average.end:.2f}, "
    return (f"{load}overhead p50 {report.server_overhead_ms.p50} p99 {report.server_overhead_ms.p99}, "
            f"cache hit p99 {report.cache_hit_ms.p99}, loop stall p99 {report.loop_stall_ms.p99}: "
            + ("all three targets met" if met else "missed " + ", ".join(
                name for name, ok in report.targets_met.items() if not ok)))


def series_rows(series: LatencySeries) -> list[tuple[str, str]]:
    """(figure, value) rows of a `--runs N` report: a line per run, then the pooled figures."""
    first = series.runs[0]
    pooled = series.pooled
    stall = pooled.loop_stall_ms
    return [
        *[(f"run {number}", _run_summary(report)) for number, report in enumerate(series.runs, 1)],
        ("runs meeting all three", f"{series.runs_meeting_all_targets}/{len(series.runs)}  "
                                   f"({first.model}, {first.keystrokes} keystrokes each, {first.file})"),
        (f"pooled x{pooled.keystrokes}", f"serverOverheadMs p50 {pooled.server_overhead_ms.p50} "
                                         f"p99 {pooled.server_overhead_ms.p99}"),
        (f"pooled x{pooled.keystrokes}", f"cacheHitMs p50 {pooled.cache_hit_ms.p50} p99 {pooled.cache_hit_ms.p99}"),
        (f"pooled x{pooled.keystrokes}", f"loopStallMs p50 {stall.p50} p99 {stall.p99} max {stall.max}"),
    ]


# -- command line -------------------------------------------------------------------------------


def add_arguments(parser) -> None:
    parser.add_argument("--file", type=Path, default=None, help="source file to type into (default: stdlib textwrap.py)")
    parser.add_argument("--lines", type=int, default=None,
                        help="type into a generated Python file of this many lines instead of --file")
    parser.add_argument("--keystrokes", type=int, default=KEYSTROKES)
    parser.add_argument("--steps", type=int, default=8,
                        help="denoising steps the server uses (small: this measures the server, not the model)")
    parser.add_argument("--max-tokens", type=int, default=32, help="answer length cap (one tiny-model canvas)")
    parser.add_argument("--layout", choices=("natural", "suffix-first"), default=None,
                        help="the server's promptLayout (default: its own)")
    parser.add_argument("--loop-floor", action="store_true",
                        help="also measure a bare event loop beside the server (loopStallFloorMs); "
                             "it perturbs the other figures a little")
    parser.add_argument("--runs", type=int, default=1,
                        help="typing sessions in a row: each judged against the targets on its own, "
                             "then every keystroke pooled (JSON: a LatencySeries instead of one report)")
    parser.add_argument("--workspace", type=Path, default=None,
                        help="folder the server opens as its workspace: its cross-file index is built over it "
                             "before typing starts (--file must lie inside it; e.g. the standard library's "
                             "folder, which holds textwrap.py)")
    parser.add_argument("--no-cross-file", dest="cross_file", action="store_false",
                        help="the server's crossFile setting off: the same session without snippets from other "
                             "files (with --workspace: the baseline of the cross-file context's cost)")
    parser.add_argument("--loop-probe", action="store_true",
                        help="the server's loop monitor also probes its loop every millisecond (as it once "
                             "did); it slows the server it measures")
    parser.add_argument("--anatomy", action="store_true",
                        help=f"for the {SLOWEST} keystrokes of the largest server overhead: who had the cores "
                             "meanwhile (the server's loop and other threads, the daemon, this process, everything "
                             "else; Linux's scheduler statistics, read from outside)")


def _options(args) -> dict[str, Any]:
    return dict(file=args.file, lines=getattr(args, "lines", None), keystrokes=args.keystrokes, steps=args.steps,
                max_tokens=args.max_tokens, device=args.device, dtype=args.dtype,
                layout=getattr(args, "layout", None), loop_floor=getattr(args, "loop_floor", False),
                loop_probe=getattr(args, "loop_probe", False), workspace=getattr(args, "workspace", None),
                cross_file=getattr(args, "cross_file", True), anatomy=getattr(args, "anatomy", False),
                progress=say)


def run_from_args(args) -> LatencyReport:
    """One session (`bench all` takes this one whatever --runs says)."""
    return run_benchmark(args.model or "tiny", **_options(args))


def run(args) -> int:
    runs = getattr(args, "runs", 1)
    if runs < 1:
        say(f"dgemma-lsp bench latency: --runs must be at least 1, got {runs}")
        return 2
    if runs == 1:
        report = run_from_args(args)
        rows = [(figure, value) for _, figure, value in table_rows(report)]
    else:
        report = run_series(args.model or "tiny", runs=runs, **_options(args))
        rows = series_rows(report)
    if args.json:
        sys.stdout.write(msgspec.json.encode(report).decode() + "\n")
    else:
        width = max(len(figure) for figure, _ in rows)
        sys.stdout.write("\n".join(f"{figure:<{width}}  {value}" for figure, value in rows) + "\n")
    return 0

