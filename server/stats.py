"""Completion statistics kept on this machine, and `dgemma-lsp stats` that sums them up.

The language server appends one JSON line per event to a local file: an inline
completion answered (its latency in ms and item count), one
shown (`dgemma/didShowCompletion`), one accepted in part or whole
(`dgemma/didPartiallyAcceptCompletion`: accepted characters of the item's
length). No text, no file names, no paths are written: only counts, lengths and
milliseconds, and the file is never sent anywhere. `DGEMMA_LSP_STATS_FILE` moves
it (or turns it off when set to an empty string). The file is cut to its newest
half once it passes MAX_BYTES.

`dgemma-lsp stats` reads it: completions answered, shown, the share of shown
ones accepted (partly or wholly), the accepted share of characters, and latency
percentiles. JSON lines with the stdlib are enough here; a database would be
more than this needs. Knows no LSP and no engine.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
import time
from pathlib import Path

import msgspec

log = logging.getLogger(__name__)

STATS_FILE_ENV = "DGEMMA_LSP_STATS_FILE"
MAX_BYTES = 4 * 1024 * 1024


def stats_path() -> Path | None:
    """Where the stats live: $DGEMMA_LSP_STATS_FILE, else the user's state dir; None when turned off."""
    chosen = os.environ.get(STATS_FILE_ENV)
    if chosen is not None:
        return Path(chosen).expanduser() if chosen else None
    import platformdirs

    return Path(platformdirs.user_state_dir("dgemma-lsp")) / "completion-stats.jsonl"


class StatsRecorder:
    """Appends events to the stats file; a failure to write is logged once and never raised.

    The file stays open between events: an answered completion costs one write, not an
    open, a mkdir and a close on the way to the editor.
    """

    def __init__(self, path: Path | None = None) -> None:
        self.path = path if path is not None else stats_path()
        self._broken = False
        self._file = None

    def answered(self, latency_ms: float, *, items: int) -> None:
        self._write({"event": "answered", "ms": round(latency_ms, 2), "items": items})

    def shown(self, length: int) -> None:
        self._write({"event": "shown", "length": length})

    def accepted(self, accepted: int, length: int) -> None:
        self._write({"event": "accepted", "accepted": accepted, "length": length})

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def _write(self, event: dict) -> None:
        if self.path is None or self._broken:
            return
        event["t"] = round(time.time(), 3)
        try:
            if self._file is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._file = self.path.open("a", encoding="utf-8", buffering=1)  # a line per write
            self._file.write(json.dumps(event) + "\n")
            if self._file.tell() > MAX_BYTES:
                self.close()
                _keep_newest_half(self.path)
        except OSError as error:
            self._broken = True
            self.close()
            log.warning("completion stats off: cannot write %s: %s", self.path, error)


def _keep_newest_half(path: Path) -> None:
    lines = path.read_text("utf-8").splitlines(keepends=True)
    path.write_text("".join(lines[len(lines) // 2:]), "utf-8")


class StatsSummary(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    file: str
    answered: int
    """Inline completions answered with at least one item."""
    shown: int
    """Completions the editor said it showed."""
    accepted: int
    """Shown completions accepted in part or whole (one per acceptance notification)."""
    accepted_share: float | None
    """accepted / shown."""
    accepted_chars_share: float | None
    """Accepted characters over the characters of the accepted items."""
    latency_ms: dict[str, float] | None
    """p50/p90/p99 of the answered completions' latency (engine + server, cache hits included)."""


def summarize(path: Path) -> StatsSummary:
    answered, shown, accepted, accepted_chars, offered_chars = 0, 0, 0, 0, 0
    latencies: list[float] = []
    if path.is_file():
        for line in path.read_text("utf-8").splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue  # a line cut by a crash
            kind = event.get("event")
            if kind == "answered":
                answered += 1
                latencies.append(float(event.get("ms", 0.0)))
            elif kind == "shown":
                shown += 1
            elif kind == "accepted":
                accepted += 1
                accepted_chars += int(event.get("accepted", 0))
                offered_chars += int(event.get("length", 0))
    return StatsSummary(
        file=str(path),
        answered=answered,
        shown=shown,
        accepted=accepted,
        accepted_share=round(accepted / shown, 4) if shown else None,
        accepted_chars_share=round(min(1.0, accepted_chars / offered_chars), 4) if offered_chars else None,
        latency_ms=_percentiles(latencies) if latencies else None,
    )


def _percentiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)

    def nearest_rank(p: float) -> float:
        return ordered[max(0, math.ceil(p * len(ordered)) - 1)]

    return {"p50": nearest_rank(0.5), "p90": nearest_rank(0.9), "p99": nearest_rank(0.99)}


# -- `dgemma-lsp stats` ----------------------------------------------------------------------


def add_arguments(parser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--file", type=Path, default=None, help="the stats file (default: the server's)")


def run(args) -> int:
    path = args.file or stats_path()
    if path is None:
        sys.stderr.write(f"dgemma-lsp stats: turned off ({STATS_FILE_ENV} is empty)\n")
        return 1
    summary = summarize(path)
    if args.json:
        sys.stdout.write(msgspec.json.encode(summary).decode() + "\n")
        return 0
    share = "n/a" if summary.accepted_share is None else f"{summary.accepted_share:.1%}"
    latency = summary.latency_ms
    lines = [
        f"stats file        {summary.file} (kept on this machine only)",
        f"answered          {summary.answered}",
        f"shown             {summary.shown}",
        f"accepted          {summary.accepted} ({share} of shown)",
        "latency ms        " + ("n/a" if latency is None else
                                f"p50 {latency['p50']}  p90 {latency['p90']}  p99 {latency['p99']}"),
    ]
    sys.stdout.write("\n".join(lines) + "\n")
    return 0
