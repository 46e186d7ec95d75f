"""Ctrl-C in a terminal, the way a user presses it: tmux runs the command on a real pty and sends C-c
to it. One Ctrl-C ends `dgemma-lsp` serving stdio (stdin and stdout are the terminal) and
`dgemma-lsp complete`: status 130, one line on stderr that says so, no traceback.

tmux comes from `make tools`; without it these tests are skipped."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from dgemma_lsp.server.stdio import SERVING

TMUX = shutil.which("tmux")
pytestmark = pytest.mark.skipif(TMUX is None, reason="tmux is not installed (`make tools` installs it)")
WAIT_S = 240.0
"""Hang guard for each wait: the tiny model on a busy 2-core machine is slow, never stuck."""


class Terminal:
    """One tmux server of this test's own (its socket in tmp_path), one window, one command."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.socket = folder / "tmux.sock"
        self.stderr = folder / "stderr.txt"
        self.status = folder / "status.txt"

    def tmux(self, *args: str) -> str:
        return subprocess.run([TMUX, "-S", str(self.socket), *args], check=True, capture_output=True,
                              text=True, timeout=60).stdout

    def start(self, *args: str) -> None:
        """Run `python -m dgemma_lsp.server.cli ARGS` with stdin and stdout on the terminal, stderr to a file."""
        command = " ".join(f"'{arg}'" for arg in (sys.executable, "-m", "dgemma_lsp.server.cli", *args))
        script = self.folder / "run.sh"
        script.write_text(f"{command} 2> '{self.stderr}'\necho $? > '{self.status}.tmp'\n"
                          f"mv '{self.status}.tmp' '{self.status}'\nsleep 600\n")
        self.tmux("new-session", "-d", "-x", "200", "-y", "50", f"PYTHONWARNINGS=ignore bash '{script}'")

    def wait_for(self, condition: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + WAIT_S  # a hang guard, not a verdict
        while not condition():
            assert time.monotonic() < deadline, f"no {what} within {WAIT_S:.0f} s; stderr:\n{self.read_stderr()}"
            time.sleep(0.1)

    def read_stderr(self) -> str:
        return self.stderr.read_text(errors="replace") if self.stderr.exists() else ""

    def ctrl_c(self) -> None:
        self.tmux("send-keys", "C-c")

    def exit_status(self) -> int:
        self.wait_for(self.status.exists, "exit")
        return int(self.status.read_text())

    def close(self) -> None:
        subprocess.run([TMUX, "-S", str(self.socket), "kill-server"], capture_output=True, timeout=60)


@pytest.fixture
def terminal(tmp_path: Path):
    terminal = Terminal(tmp_path)
    yield terminal
    terminal.close()


def test_one_ctrl_c_ends_the_server_on_a_terminal(terminal: Terminal):
    terminal.start("--model", "tiny-random", "--engine", "inprocess", "--log-level", "INFO")
    terminal.wait_for(lambda: SERVING in terminal.read_stderr(), "serving")
    terminal.ctrl_c()
    assert terminal.exit_status() == 130, terminal.read_stderr()
    stderr = terminal.read_stderr()
    assert "Traceback" not in stderr and "Fatal Python error" not in stderr, stderr
    assert stderr.splitlines()[-1].startswith("dgemma-lsp: "), stderr


def test_ctrl_c_during_complete_says_it_was_interrupted(terminal: Terminal, tmp_path: Path):
    source = tmp_path / "circle.py"
    source.write_text("def area(radius):\n    return \n")
    terminal.start("complete", f"{source}:2:12", "--model", "tiny-random", "--steps", "100000", "--drafts")
    terminal.wait_for(lambda: "[draft " in terminal.read_stderr(), "draft")
    terminal.ctrl_c()
    assert terminal.exit_status() == 130, terminal.read_stderr()
    stderr = terminal.read_stderr()
    assert "Traceback" not in stderr, stderr
    after_drafts = [line for line in stderr.splitlines() if line.strip() and not line.startswith("[draft ")]
    assert len(after_drafts) == 1 and after_drafts[0].startswith("dgemma-lsp: "), stderr
