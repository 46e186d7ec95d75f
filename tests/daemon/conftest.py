"""Daemon fixtures: a private runtime dir per test (or module), and no daemon outlives its test."""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from dgemma_lsp.engine.daemon.paths import RUNTIME_DIR_ENV, lock_is_held


@contextmanager
def private_runtime_dir() -> Iterator[Path]:
    # A short path under /tmp: AF_UNIX socket paths must stay under ~100 bytes.
    folder = Path(tempfile.mkdtemp(prefix="dgd-", dir="/tmp"))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(RUNTIME_DIR_ENV, str(folder))
        try:
            yield folder
        finally:
            kill_daemons(folder)
            shutil.rmtree(folder, ignore_errors=True)


def kill_daemons(folder: Path) -> None:
    """SIGKILL every daemon that still holds a pid lock in `folder`."""
    for pid_file in folder.glob("*.pid"):
        if lock_is_held(pid_file):
            try:
                os.kill(int(pid_file.read_text().split()[0]), signal.SIGKILL)
            except (ValueError, IndexError, ProcessLookupError):
                pass


@pytest.fixture
def runtime_dir() -> Iterator[Path]:
    with private_runtime_dir() as folder:
        yield folder


@pytest.fixture(scope="module")
def module_runtime_dir() -> Iterator[Path]:
    with private_runtime_dir() as folder:
        yield folder
