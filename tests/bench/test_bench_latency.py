"""The latency benchmark drives a real `dgemma-lsp --stdio` and measures every figure it reports."""

import pytest

from dgemma_lsp.bench import latency


@pytest.mark.parametrize("loop_probe", [False, True], ids=["real-traffic", "1ms-probe"])
def test_a_short_typing_session_yields_every_figure(loop_probe):
    report = latency.run_benchmark("tiny-random", keystrokes=6, steps=2, max_tokens=32, loop_floor=True,
                                   loop_probe=loop_probe)
    assert report.keystrokes == 6 and report.loop_probe == loop_probe
    for figure in (report.final_ms, report.first_draft_ms, report.engine_ms,
                   report.server_overhead_ms, report.cache_hit_ms):
        assert figure.p50 is not None and figure.p50 <= figure.p99
    assert report.cache_hits == 6  # the repeated request never reached the engine
    stall = report.loop_stall_ms  # read from the server's own loop monitor
    assert stall.p50 is not None and 0 <= stall.p50 <= stall.p99 <= stall.max
    busy = report.loop_busy_ms  # the server loop's passes through its callbacks
    assert busy.p50 is not None and 0 < busy.p50 <= busy.p99 <= busy.max
    floor = report.loop_stall_floor_ms  # a bare loop beside the server, read in the same windows
    assert floor.p50 is not None and 0 <= floor.p50 <= floor.p99 <= floor.max
    assert report.encoded_tokens.p50 is not None and report.encoded_tokens.p50 > 0  # at least the tail
    assert 0 < report.answers_from_drafts <= report.keystrokes  # the tiny model's result is its last draft


def test_the_typing_point_is_an_indented_statement():
    text = "def f(x):\n    if x:\n        y = x + 1\n        return y\n    return 0\n"
    line, indent = latency.typing_point(text)
    assert text.split("\n")[line].startswith(indent) and indent == "        "


def test_a_series_judges_each_run_and_pools_every_keystroke(monkeypatch):
    samples_of_runs = []  # each run's raw samples, as the series got them
    run_once = latency._run_once

    def recording_run_once(*args, **kwargs):
        report, samples = run_once(*args, **kwargs)
        samples_of_runs.append(samples)
        return report, samples

    monkeypatch.setattr(latency, "_run_once", recording_run_once)
    series = latency.run_series("tiny-random", runs=2, keystrokes=3, steps=2, max_tokens=32)
    assert len(series.runs) == 2 and series.pooled.keystrokes == 6
    assert series.runs_meeting_all_targets == sum(all(run.targets_met.values()) for run in series.runs)
    for run in series.runs:
        assert run.load_average is not None and run.load_average.start >= 0 and run.load_average.end >= 0
    assert series.pooled.loop_stall_ms.max == max(run.loop_stall_ms.max for run in series.runs)
    # Pooled from both runs' keystrokes, each of which its own run's figures summarize.
    assert len(samples_of_runs) == 2 and all(len(samples["final"]) == 3 for samples in samples_of_runs)
    assert series.pooled == latency.pooled_figures(samples_of_runs, keystrokes=6)
    for run, samples in zip(series.runs, samples_of_runs, strict=True):
        assert run.server_overhead_ms == latency.percentiles(samples["overhead"])
    rows = dict(latency.series_rows(series))
    assert rows["runs meeting all three"].startswith(f"{series.runs_meeting_all_targets}/2")
    # The pooled figures come from the runs' keystrokes together, not from their summaries: on
    # these samples a median of the runs' medians (2 and 30 ms; 1 and 3 ms) would read 16 and 2.
    short = {"overhead": [1.0, 2.0, 3.0], "cache_hit": [0.5], "loop_stall": [5.0, 1.0, 1.0]}
    long = {"overhead": [10.0, 20.0, 30.0, 40.0, 50.0], "cache_hit": [0.7, 0.9], "loop_stall": [2.0, 3.0, 4.0]}
    pooled = latency.pooled_figures([short, long], keystrokes=8)
    assert pooled.server_overhead_ms == latency.Percentiles(15.0, 50.0)
    assert pooled.cache_hit_ms == latency.Percentiles(0.7, 0.9)
    assert pooled.loop_stall_ms == latency.StallPercentiles(2.5, 5.0, 5.0)


def test_a_series_of_no_runs_is_refused_with_a_clear_error():
    import subprocess
    import sys

    finished = subprocess.run([sys.executable, "-m", "dgemma_lsp.server.cli", "bench", "latency", "--runs", "0"],
                              capture_output=True, text=True, timeout=120)
    assert finished.returncode == 2 and finished.stdout == ""
    assert "--runs must be at least 1, got 0" in finished.stderr


def test_a_workspace_is_indexed_before_typing_starts(tmp_path):
    # The server opens the folder as its workspace; typing waits for its cross-file index.
    for n in range(5):
        (tmp_path / f"helpers_{n}.py").write_text(f"def helper_{n}(value):\n    return value + {n}\n")
    typed = tmp_path / "main.py"
    typed.write_text("from helpers_1 import helper_1\n\n\nclass Job:\n    def run(self, value):\n"
                     "        total = helper_1(value)\n        total += 1\n        return total\n")
    report = latency.run_benchmark("tiny-random", file=typed, workspace=tmp_path, keystrokes=3, steps=2, max_tokens=32)
    assert report.workspace == str(tmp_path.resolve()) and report.index_files == 6
    assert report.index_wall_s is not None and report.final_ms.p50 is not None
    with pytest.raises(ValueError, match="not inside --workspace"):
        latency.run_benchmark("tiny-random", file=latency.default_file(), workspace=tmp_path, keystrokes=1)


def test_the_anatomy_names_the_slowest_keystrokes_and_who_had_the_cores():
    report = latency.run_benchmark("tiny-random", keystrokes=4, steps=2, max_tokens=32, anatomy=True)
    assert 1 <= len(report.slowest) <= latency.SLOWEST
    overheads = [k.overhead_ms for k in report.slowest]
    assert overheads == sorted(overheads, reverse=True)
    for keystroke in report.slowest:
        assert keystroke.anatomy.daemon_cpu_ms > 0  # the model ran in the daemon during the window
        assert keystroke.verdict.split(":")[0] in ("server", "machine", "ours")
