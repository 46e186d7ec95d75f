"""Session-wide safety net: no test touches the user's real engine daemon.

Every `dgemma-lsp --stdio` started by a test (directly or by an editor under
test) inherits a private runtime dir (and writes its completion stats there), so a daemon it spawns lives there and is
killed when the session ends. Tests that need their own dir (tests/daemon/)
override the variable per test.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
from pathlib import Path

import pytest

from dgemma_lsp.engine.daemon.paths import RUNTIME_DIR_ENV, lock_is_held
from dgemma_lsp.server.stats import STATS_FILE_ENV

# Set at import, before any test starts a subprocess. A short path: AF_UNIX paths must stay < ~100 bytes.
_RUNTIME_DIR = Path(tempfile.mkdtemp(prefix="dgt-", dir="/tmp"))
os.environ[RUNTIME_DIR_ENV] = str(_RUNTIME_DIR)
# Completion stats of test servers go there too, never into the user's own stats file.
os.environ[STATS_FILE_ENV] = str(_RUNTIME_DIR / "completion-stats.jsonl")


def pytest_sessionfinish(session, exitstatus) -> None:
    for pid_file in _RUNTIME_DIR.glob("*.pid"):
        if lock_is_held(pid_file):
            try:
                os.kill(int(pid_file.read_text().split()[0]), signal.SIGKILL)
            except (ValueError, IndexError, ProcessLookupError):
                pass
    shutil.rmtree(_RUNTIME_DIR, ignore_errors=True)


TRITON_INTERPRET = "TRITON_INTERPRET"


@pytest.fixture(autouse=True)
def _triton_interpreter_only_where_asked(request, monkeypatch):
    """Kernel tests set TRITON_INTERPRET=1 when their module is imported (at collection, so for the
    whole session). Everywhere else it would send CPU runs, and every subprocess a test starts, down
    the interpreted-kernel path instead of the CPU path users run: unset it there."""
    if not getattr(request.module, "USES_TRITON_INTERPRETER", False):
        monkeypatch.delenv(TRITON_INTERPRET, raising=False)
