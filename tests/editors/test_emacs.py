"""Real Emacs (28, batch) with lsp-mode 10 driving `dgemma-lsp --stdio --model tiny-random`.

The scenarios live in editors/emacs/tests/scenarios.el (an inline suggestion shown at the cursor
and accepted; a selection rewritten through the code action); this file only provides the
editor (`make tools` installs lsp-mode into .tools/emacs, or into $DGEMMA_TOOLS_DIR), a scratch
project and the server command, and reports Emacs' own verdict. lsp-mode loads the user-facing
client, editors/emacs/dgemma-lsp.el, as a user would.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCENARIOS = REPO / "editors" / "emacs" / "tests" / "scenarios.el"
TOOLS = Path(os.environ.get("DGEMMA_TOOLS_DIR", REPO / ".tools"))
TIMEOUT_S = 300
SETTINGS = {"steps": 2, "maxTokens": 32, "seed": 7, "earlyStop": False, "debounceMs": 10}

SAMPLE = '''"""A small module the scenarios type into."""


def greet(name):
    return "hello " + name
'''


def _server_command() -> list[str]:
    script = Path(sys.executable).with_name("dgemma-lsp")
    executable = str(script) if script.exists() else shutil.which("dgemma-lsp")
    assert executable, "dgemma-lsp is not installed (make test installs it into .venv)"
    # In-process engine: the test owns the model's lifetime (no resident daemon outlives it).
    return [executable, "--stdio", "--model", "tiny-random", "--engine", "inprocess"]


def test_lsp_mode_inline_completion_and_rewrite(tmp_path: Path) -> None:
    emacs = shutil.which("emacs")
    elpa = TOOLS / "emacs" / "elpa"
    assert emacs, "no emacs on PATH: run `make tools` (editors/emacs/scripts/install-emacs.sh)"
    assert (elpa / "lsp-mode-10.0.0").is_dir(), f"no lsp-mode 10 in {elpa}: run `make tools`"
    project = tmp_path / "project"
    (project / ".git").mkdir(parents=True)  # a root marker, as in a real project
    (project / "sample.py").write_text(SAMPLE)
    state = tmp_path / "state"
    state.mkdir()
    server_log = tmp_path / "server.log"
    command = _server_command() + ["--log-file", str(server_log), "--log-level", "INFO"]
    env = {
        **os.environ,
        "DGEMMA_EMACS_ELPA": str(elpa),
        "DGEMMA_EMACS_CMD": json.dumps(command),
        "DGEMMA_EMACS_SETTINGS": json.dumps(SETTINGS),
        "DGEMMA_EMACS_STATE": str(state),
        "DGEMMA_EMACS_TIMEOUT_S": str(TIMEOUT_S - 30),
        "HOME": str(tmp_path),  # no user init, no ~/.emacs.d written to
    }
    result = subprocess.run(
        [emacs, "--batch", "-Q", "-l", str(SCENARIOS)],
        cwd=project, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=TIMEOUT_S,
    )
    report = f"--- stdout\n{result.stdout}\n--- stderr (tail)\n{result.stderr[-3000:]}"
    if result.returncode != 0 or "PASS" not in result.stdout.splitlines():
        log_tail = server_log.read_text()[-4000:] if server_log.exists() else "(no server log)"
        pytest.fail(f"Emacs scenarios failed (exit {result.returncode})\n{report}\n--- server log\n{log_tail}")
    print(report)  # noqa: T201 - shown with `pytest -s`: what was suggested and accepted
