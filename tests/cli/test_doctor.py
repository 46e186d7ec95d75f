"""`dgemma-lsp doctor` on this machine, as a user runs it: no GPU, no checkpoint of the real model.

A real subprocess with its own empty Hugging Face cache and runtime dir, so what it finds
is what a fresh machine has.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.fixture
def fresh(tmp_path: Path) -> dict[str, str]:
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    return {**os.environ, "HF_HOME": str(tmp_path / "hf"), "DGEMMA_LSP_RUNTIME_DIR": str(runtime),
            "CUDA_VISIBLE_DEVICES": ""}


def doctor(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dgemma_lsp.server.cli", "doctor", *args],
                          capture_output=True, text=True, timeout=600, env=env)


def test_the_real_model_without_checkpoint_or_gpu_cannot_run_and_says_how_to_fix_it(fresh):
    done = doctor(fresh, "--json")
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    assert report["canRun"] is False and report["model"] == "google/diffusiongemma-26B-A4B-it"
    checks = {check["name"]: check for check in report["checks"]}
    assert checks["checkpoint"]["status"] == "fail"
    assert checks["checkpoint"]["fix"] == "dgemma-lsp fetch-model google/diffusiongemma-26B-A4B-it"
    assert checks["gpu"]["status"] == "warn" and "--engine vllm" in checks["gpu"]["fix"]
    # Each mode's plan, from the architecture (no checkpoint here), against this machine's memory.
    plan = checks["memory plan"]["detail"]
    for mode in ("none", "fp8", "int8", "int4"):
        assert f"{mode} " in plan
    assert "architecture config" in plan and "on cpu" in plan
    assert checks["quantization"]["status"] in ("ok", "fail")
    assert checks["engine daemon"]["status"] == "ok" and "none running" in checks["engine daemon"]["detail"]
    assert checks["grammars"]["status"] in ("ok", "warn") and "python" in checks["grammars"]["detail"]
    for editor in ("neovim", "vscode", "emacs"):  # best effort, but always reported
        assert editor in checks
    for check in report["checks"]:
        assert check["status"] in ("ok", "warn", "fail")
        assert (check["fix"] is None) == (check["status"] == "ok"), check
    assert done.stderr == ""


def test_the_text_report_gives_each_problem_its_fix_and_a_verdict(fresh):
    done = doctor(fresh, "--no-editors")
    assert done.returncode == 1, done.stderr
    lines = done.stdout.splitlines()
    failing = next(i for i, line in enumerate(lines) if line.startswith("FAIL") and "checkpoint" in line)
    assert lines[failing + 1].strip() == "fix: dgemma-lsp fetch-model google/diffusiongemma-26B-A4B-it"
    assert lines[-1].endswith("cannot run on this machine")


def test_the_tiny_model_can_run_here(fresh):
    done = doctor(fresh, "--model", "tiny-random", "--no-editors", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    checks = {check["name"]: check for check in report["checks"]}
    assert report["canRun"] is True
    assert checks["checkpoint"]["status"] == "ok"
    assert "checkpoint headers" in checks["memory plan"]["detail"]
    assert checks["quantization"]["status"] == "ok"
    assert "neovim" not in checks
