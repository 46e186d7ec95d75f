"""Data-parallel training (engine/training/parallel.py): real ranks in spawned processes over gloo."""

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import parallel_targets
import pytest
import torch

from dgemma_lsp.engine.training.parallel import launch, run_ranks


def _train(run_dir: Path, *options: str, recipe: Path | None = None):
    config = ["--config", str(recipe)] if recipe else []
    return subprocess.Popen([sys.executable, "-m", "dgemma_lsp.server.cli", "train", str(run_dir), *config,
                             "--quiet", *options], stderr=subprocess.PIPE, text=True)


def _finish(process: subprocess.Popen, timeout: float = 300) -> tuple[int, str]:
    _, stderr = process.communicate(timeout=timeout)
    return process.returncode, stderr


def test_gradients_are_averaged_and_a_batch_is_shared_between_the_ranks():
    assert launch(parallel_targets.average_gradients, (), 2) == 0


@pytest.mark.timeout(300)  # the hang guard: a SIGTERM, which the waiting rank traps, would leave it waiting
@pytest.mark.parametrize(("how", "exitcode", "status"), [("raises", 1, 1), ("aborts", -signal.SIGABRT, 134)])
def test_a_failing_rank_is_named_and_stops_the_others_instead_of_leaving_them_waiting(how, exitcode, status):
    outcome = run_ranks(parallel_targets.one_rank_fails, (how,), 2)
    # Rank 1 failed first (rank 0 cannot end by itself), and the run's status is its failure's, not rank 0's.
    assert (outcome.first_failure.rank, outcome.first_failure.exitcode) == (1, exitcode)
    assert outcome.status == status
    # Rank 0 waited where only a kill ends a rank that traps SIGTERM: launch's stop is what ended it.
    assert [(end.rank, end.exitcode, end.stopped_by_launch) for end in outcome.ends] == \
           [(1, exitcode, False), (0, -signal.SIGKILL, True)]


@pytest.mark.timeout(300)
def test_no_thread_of_gloo_outlives_the_ranks_teardown_when_the_model_code_imports_torch_distributed(tmp_path):
    """A gloo thread alive into the interpreter's shutdown now and then aborted a rank whose work was done."""
    assert launch(parallel_targets.build_the_model, (str(tmp_path / "threads"),), 2) == 0
    for rank in (0, 1):
        alive = (tmp_path / f"threads-{rank}").read_text().split()
        assert alive and not [name for name in alive if "gloo" in name or "tcpstore" in name], alive


@pytest.mark.timeout(900)
def test_two_ranks_train_the_examples_one_process_trains_and_keep_one_model(tmp_path, micro_recipe):
    one = _train(tmp_path / "one", "--steps", "3", "--threads", "1", recipe=micro_recipe)
    code, stderr = _finish(one)
    assert code == 0, stderr[-3000:]
    two = _train(tmp_path / "two", "--steps", "3", "--procs", "2", recipe=micro_recipe)
    code, stderr = _finish(two)
    assert code == 0, stderr[-3000:]  # which rank failed, and why
    single = torch.load(tmp_path / "one" / "checkpoint.pt", weights_only=False)
    split = torch.load(tmp_path / "two" / "checkpoint.pt", weights_only=False)
    # The same examples, split in two: the same tokens and answer tokens, step by step.
    lines = [[json.loads(line) for line in (tmp_path / run / "log.jsonl").read_text().splitlines()]
             for run in ("one", "two")]
    assert [(x["step"], x["tokens"], x["answerTokens"]) for x in lines[0]] == \
           [(x["step"], x["tokens"], x["answerTokens"]) for x in lines[1]]
    assert split["step"] == 3 and split["cpuSeconds"] > 0
    # One model: the ranks' weights were checked equal at every checkpoint; it learned as one process does
    # (the second rank draws its own noise, so not bit for bit).
    assert all(torch.allclose(single["model"][k], split["model"][k], atol=0.05) for k in single["model"])
    assert (tmp_path / "two" / "model" / "model.safetensors").is_file()


@pytest.mark.timeout(900)
def test_a_stop_reaches_every_rank_the_checkpoint_is_saved_and_the_run_resumes(tmp_path, micro_recipe):
    run = tmp_path / "run"
    training = _train(run, "--steps", "100000", "--procs", "2", recipe=micro_recipe)
    log = run / "log.jsonl"
    deadline = time.monotonic() + 300
    while not (log.exists() and log.read_text().count("\n") >= 2) and time.monotonic() < deadline:
        time.sleep(0.2)
    training.send_signal(signal.SIGINT)  # to the parent only, as `pkill -INT -f "dgemma-lsp train"` does
    code, stderr = _finish(training)
    assert code == 130, stderr
    stopped = torch.load(run / "checkpoint.pt", weights_only=False)["step"]
    assert 2 <= stopped < 100000 and "checkpoint saved" in stderr
    resumed = _train(run, "--steps", str(stopped + 2), "--procs", "2")
    code, stderr = _finish(resumed)
    assert code == 0, stderr[-3000:]
    assert torch.load(run / "checkpoint.pt", weights_only=False)["step"] == stopped + 2
