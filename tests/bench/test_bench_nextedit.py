"""bench/nextedit.py's own parts, without the network or the model: pairs, scoring, the oracle row."""

from __future__ import annotations

from dgemma_lsp.bench.nextedit import cases_of, changed_text, chrf, oracle_answer, prepare, propose, score
from dgemma_lsp.engine.api import GenerationSettings

OLD = '''def load(path, mode):
    """Read a file."""
    with open(path, mode) as handle:
        return handle.read()


def other():
    return 1
'''
NEW = '''def load(filename, mode):
    """Read a file."""
    with open(filename, mode) as handle:
        return handle.read()


def other():
    return 2
'''


def test_a_release_diff_gives_related_and_unrelated_cases():
    related, unrelated = cases_of("pkg", "pkg/io.py", OLD, NEW, max_gap=40)
    # Both renaming hunks relate to each other (`path` -> `filename`); `return 1` -> `2` touches no name.
    assert [case.expected for case in related] == [NEW.replace("return 2", "return 1")] * 2
    first = related[0]
    assert first.before == OLD.replace("def load(path", "def load(filename")
    assert first.before[first.user_start:first.user_end] == "def load(filename, mode):\n"
    assert first.user_before == "def load(path, mode):\n"
    assert unrelated == []  # the only other hunk touches no identifier: no case either way


def test_the_oracle_keeps_a_true_next_edit_inside_the_window():
    related, _ = cases_of("pkg", "pkg/io.py", OLD, NEW, max_gap=40)
    case = related[0]
    log, prepared = prepare(case, 0.4, GenerationSettings(steps=2, seed=0), max_lines=30)
    answer, inside = oracle_answer(case, prepared)
    assert inside
    after = propose(case, prepared, log, answer)
    assert after == case.expected
    row = score("oracle", [case], [after], [], [])
    assert (row.exact, row.chrf, row.proposed_related) == (1.0, 100.0, 1.0)
    nothing = score("none", [case], [case.before], [], [])
    assert (nothing.exact, nothing.chrf) == (0.0, 0.0)


def test_chrf_is_100_for_equal_text_and_0_for_disjoint_text():
    assert chrf("open(filename)", "open(filename)") == 100.0
    assert chrf("abc", "xyz") == 0.0
    assert 0 < chrf("open(fname)", "open(filename)") < 100
    assert changed_text("f(path)", "f(filename)") == "path\nfilename"
