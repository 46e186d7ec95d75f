"""The latency benchmark drives a real `dgemma-lsp --stdio` and measures every figure it reports."""

import pytest

from dgemma_lsp.bench import latency


@pytest.mark.parametrize("loop_probe", [False, True], ids=["real-traffic", "1ms-probe"])
def test_a_short_typing_session_yields_every_figure(loop_probe):
    report = latency.run_benchmark("tiny", keystrokes=6, steps=2, max_tokens=32, loop_floor=True,
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
