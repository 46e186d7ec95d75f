"""Completion stats (`dgemma-lsp stats`) and request priority, below the LSP layer.

Priority: the real in-process engine on the tiny model, seen through a thin wrapper
that notes each request's priority on its way in (nothing of ours is replaced).
"""

from __future__ import annotations

import json
import subprocess
import sys

from dgemma_lsp.engine.client import InProcessEngineClient
from dgemma_lsp.engine.runtime.service import InfillService
from dgemma_lsp.server.completions import PRIORITY_TYPING, PRIORITY_WAITING, Completer
from dgemma_lsp.server.documents import DocumentStore
from dgemma_lsp.server.scheduler import CompletionCache, LatestWins
from dgemma_lsp.server.settings import ServerSettings
from dgemma_lsp.server.stats import StatsRecorder, summarize


def test_summary_counts_accepted_share_and_latency_percentiles(tmp_path):
    path = tmp_path / "stats.jsonl"
    recorder = StatsRecorder(path)
    for ms in range(1, 101):  # 1..100 ms
        recorder.answered(float(ms), items=1)
    for _ in range(4):
        recorder.shown(10)
    recorder.accepted(10, 10)
    recorder.accepted(5, 10)
    with path.open("a") as file:
        file.write('{"event": "shown", "len')  # a line cut by a crash is skipped
    summary = summarize(path)
    assert (summary.answered, summary.shown, summary.accepted) == (100, 4, 2)
    assert summary.accepted_share == 0.5 and summary.accepted_chars_share == 0.75
    assert summary.latency_ms == {"p50": 50.0, "p90": 90.0, "p99": 99.0}
    done = subprocess.run([sys.executable, "-m", "dgemma_lsp.server.cli", "stats", "--json", "--file", str(path)],
                          capture_output=True, text=True, check=True, timeout=60)
    assert json.loads(done.stdout)["acceptedShare"] == 0.5


def test_an_unwritable_stats_file_never_breaks_the_server(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    recorder = StatsRecorder(blocker / "stats.jsonl")  # a folder that is a file
    recorder.shown(3)
    recorder.accepted(1, 3)
    assert not (blocker / "stats.jsonl").exists()


class PriorityNotingEngine:
    """The real in-process engine; notes each request's priority, then hands it on."""

    def __init__(self) -> None:
        self.engine = InProcessEngineClient(InfillService("tiny-random"))
        self.priorities: list[int] = []

    async def denoise(self, request, on_draft=None):
        self.priorities.append(request.priority)
        return await self.engine.denoise(request, on_draft)

    def __getattr__(self, name):
        return getattr(self.engine, name)


async def test_requests_the_user_waits_on_outrank_automatic_ones():
    engine = PriorityNotingEngine()
    completer = Completer(engine, LatestWins(), CompletionCache(8))
    settings = ServerSettings(steps=1, max_tokens=16, seed=3, debounce_ms=0)
    document = DocumentStore().open("file:///tmp/p.py", "python", 1, "def f(x):\n    return \n")
    cursor = document.text.index("return ") + 7
    await completer.complete(document, cursor, wanted=1, settings=settings)
    await completer.complete(document, cursor, wanted=2, settings=settings, priority=PRIORITY_WAITING)
    await completer.rewrite(document, 0, len("def f(x):"), settings)
    assert engine.priorities == [PRIORITY_TYPING, PRIORITY_WAITING, PRIORITY_WAITING]
    assert PRIORITY_WAITING > PRIORITY_TYPING > 0
    await engine.close()
