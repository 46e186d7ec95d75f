"""HumanEval-Infilling harness: honest on canonical and empty middles, and the tiny model runs through it."""

import json
import subprocess
import sys

import pytest

from dgemma_lsp.bench import humaneval

DATA = humaneval.default_data_dir()
pytestmark = pytest.mark.skipif(DATA is None, reason="HumanEval-Infilling data (shared/data) is not beside the repo")


def test_canonical_middles_pass_and_empty_middles_mostly_fail():
    problems = humaneval.load_problems(DATA, "single-line", limit=20)
    canonical = humaneval.evaluate(problems, "canonical", timeout_s=30)
    empty = humaneval.evaluate(problems, "empty", timeout_s=30)
    assert canonical.problems == 20 and canonical.pass_at_1 == 1.0
    assert empty.pass_at_1 < 0.5


def test_every_subset_loads_with_its_fields():
    for subset in humaneval.SUBSETS:
        (problem,) = humaneval.load_problems(DATA, subset, limit=1)
        assert problem.entry_point in problem.prompt + problem.canonical_solution + problem.suffix


def test_tiny_model_smoke_run_scores_twenty_problems():
    command = [sys.executable, "-m", "dgemma_lsp.server.cli", "bench", "humaneval", "--model", "tiny",
               "--subset", "single-line", "--limit", "20", "--steps", "2", "--max-tokens", "32", "--json"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=1200, check=True)
    report = json.loads(done.stdout)
    assert report["problems"] == 20
    assert 0.0 <= report["passAt1"] <= 1.0
    assert report["model"] == "tiny"
