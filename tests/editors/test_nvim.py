"""Real Neovim (0.11 and 0.12, headless) driving the dgemma plugin against `dgemma-lsp --stdio --model tiny-random`.

The scenarios live in editors/nvim/tests/scenarios.lua (typed keys, ghost text read back from
extmarks, accept / word / line / dismiss, rewrite of a visual selection, the definitions a second
real language server (pylsp) finds reaching the prompt, checkhealth); this file only provides the
editors (`make tools` installs them into .tools/), a scratch folder, the server command and pylsp's,
and reports Neovim's own verdict. Nothing here knows the plugin's internals.
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
SCENARIOS = REPO / "editors" / "nvim" / "tests" / "scenarios.lua"
TIMEOUT_S = 300

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


def _pylsp() -> str:
    script = Path(sys.executable).with_name("pylsp")
    executable = str(script) if script.exists() else shutil.which("pylsp")
    assert executable, "pylsp is not installed (python-lsp-server, in the dev extras: make test installs it)"
    return executable


@pytest.mark.parametrize("version", ["0.11", "0.12"])
def test_nvim_scenarios(version: str, tmp_path: Path) -> None:
    nvim = REPO / ".tools" / "bin" / f"nvim-{version}"
    assert nvim.exists(), f"{nvim} is missing: run `make tools` (editors/nvim/scripts/install-nvim.sh)"
    workdir = tmp_path / "project"
    workdir.mkdir()
    (workdir / ".git").mkdir()  # a root marker, as in a real project
    (workdir / "sample.py").write_text(SAMPLE)
    server_log = tmp_path / "server.log"
    command = _server_command() + ["--log-file", str(server_log), "--log-level", "INFO"]
    env = {
        **os.environ,
        "DGEMMA_NVIM_CMD": json.dumps(command),
        "DGEMMA_NVIM_WORKDIR": str(workdir),
        "DGEMMA_NVIM_TIMEOUT_S": str(TIMEOUT_S - 30),
        # A second, real language server for the editor-definitions scenario (the dev extras install it).
        "DGEMMA_NVIM_PYLSP": json.dumps([_pylsp()]),
        # Neovim's own state (lsp.log, shada) stays in the scratch folder.
        "XDG_STATE_HOME": str(tmp_path / "state"),
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
        "XDG_DATA_HOME": str(tmp_path / "data"),
    }
    result = subprocess.run(
        [str(nvim), "--headless", "-u", "NONE", "-i", "NONE", "-c", f"luafile {SCENARIOS}"],
        cwd=workdir,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    report = f"--- stdout\n{result.stdout}\n--- stderr (tail)\n{result.stderr[-3000:]}"
    if result.returncode != 0 or "PASS" not in result.stdout.splitlines():
        log_tail = server_log.read_text()[-4000:] if server_log.exists() else "(no server log)"
        pytest.fail(f"Neovim {version} scenarios failed (exit {result.returncode})\n{report}\n--- server log\n{log_tail}")
    print(report)  # noqa: T201 - shown with `pytest -s`: per-scenario times and what was accepted
