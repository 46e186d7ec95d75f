"""The command line as a user types it: option values in any case, and what `bench` offers."""

from __future__ import annotations

import pytest

from dgemma_lsp.bench import cli as bench_cli
from dgemma_lsp.server.cli import build_parser


@pytest.mark.parametrize("typed", ["debug", "DEBUG", "Debug"])
def test_log_level_is_accepted_in_any_case(typed):
    assert build_parser().parse_args(["--log-level", typed]).log_level == "DEBUG"
    assert build_parser().parse_args(["engine", "status", "--log-level", typed]).log_level == "DEBUG"


def test_an_unknown_log_level_is_still_refused():
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--log-level", "chatty"])


def test_bench_help_names_every_benchmark_with_what_it_measures(monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "400")  # one line per benchmark, as a wide terminal shows them
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "--help"])
    lines = capsys.readouterr().out.splitlines()
    for name, (_module, description) in bench_cli.BENCHMARKS.items():
        assert any(line.split() and line.split()[0] == name and description in line for line in lines), name


def test_bench_with_no_benchmark_names_every_one(capsys):
    assert bench_cli.run(build_parser().parse_args(["bench"])) == 2
    named = capsys.readouterr().err
    assert all(name in named for name in [*bench_cli.BENCHMARKS, "all"])
