"""The daemon's warm standby (engine/daemon/standby.py): a killed daemon is replaced by the process that was
already waiting, which keeps a standby of its own; a daemon that stops on purpose takes its standby with it."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest
from daemon_helpers import dgemma, engine_status, quick, within

from dgemma_lsp.engine.daemon import standby
from dgemma_lsp.engine.daemon.client import DaemonEngineClient, query_info
from dgemma_lsp.engine.daemon.paths import engine_key, lock_is_held

pytestmark = pytest.mark.skipif(not standby.supported(), reason="a standby is kept on Linux only")


def alive(pid: int) -> bool:
    """A process that runs (a zombie waiting for its parent to reap it has ended)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return False
    return fields[0] != "Z"


async def until(predicate) -> None:
    while not predicate():  # other processes' lifetimes: no event to wait on from here
        await asyncio.sleep(0.05)


async def test_a_killed_daemon_is_replaced_by_the_standby_that_was_waiting(runtime_dir):
    assert dgemma("engine", "start").returncode == 0
    before = engine_status()
    daemon, waiting = before["pid"], before["standbyPid"]
    assert waiting not in (0, daemon) and alive(waiting)

    os.kill(daemon, signal.SIGKILL)
    await within(until(lambda: engine_status().get("state") not in (None, "unknown")
                        and engine_status().get("pid") != daemon))
    after = engine_status()
    assert after["pid"] == waiting  # the process that was already there, not a new start
    assert after["standbyPid"] not in (0, daemon, waiting) and alive(after["standbyPid"])
    assert "standby   pid" in dgemma("engine", "status").stdout

    assert dgemma("engine", "stop").returncode == 0
    await within(until(lambda: not alive(waiting) and not alive(after["standbyPid"])))


async def test_a_daemon_that_exits_when_idle_ends_its_standby(runtime_dir):
    key = engine_key("tiny-random")
    client = DaemonEngineClient(key, idle_unload=0.5, name="test")
    try:
        await client.start()
        assert len((await within(client.denoise(quick(), lambda draft: None))).candidates) == 1
        info = await within(query_info(key, client.paths))
        assert info.standby_pid and alive(info.standby_pid)
    finally:
        await client.close()
    # The last client gone, the idle timeout ends the daemon, and the daemon its standby: none takes over.
    await within(until(lambda: not lock_is_held(client.paths.pid_lock) and not alive(info.standby_pid)))
