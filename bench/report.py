"""What every benchmark does at its edges: progress to stderr, the report to stdout as a table or JSON.

Stdout carries only the report, so `--json` output can be piped; everything else
(progress, errors) goes to stderr. Knows msgspec; knows nothing of what is measured.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import msgspec


def say(line: str) -> None:
    """Progress and errors: stderr, flushed at once (a long benchmark shows where it is)."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def write_report(report, as_json: bool, format_table: Callable[[object], str]) -> None:
    """The report on stdout: one JSON line (any msgspec-encodable value), or the human table."""
    sys.stdout.write((msgspec.json.encode(report).decode() if as_json else format_table(report)) + "\n")
