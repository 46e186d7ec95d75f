"""A daemon's life as a user sees it: `engine start|status|stop`, auto-spawn, idle unload and
reload, `engine stop` under an attached client, and the loopback-TCP transport with its token."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import stat
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import msgspec
import pytest
from daemon_helpers import dgemma, engine_status, quick, raw_hello, wait_for_status, within

from dgemma_lsp.engine.daemon.client import DaemonEngineClient, query_info, spawn_daemon
from dgemma_lsp.engine.daemon.paths import TRANSPORT_ENV, EnginePaths, engine_key, lock_is_held, read_token
from dgemma_lsp.engine.daemon.protocol import PROTOCOL_VERSION, Hello, Refused, Welcome
from dgemma_lsp.engine.model.tiny_model import ensure_tiny_random_model


def test_engine_start_status_stop(runtime_dir):
    assert dgemma("engine", "status").returncode == 3
    assert engine_status()["running"] is False

    started = dgemma("engine", "start", "--json")
    assert started.returncode == 0, started.stderr
    again = dgemma("engine", "start", "--json")
    assert again.returncode == 0, again.stderr
    first, second = (json.loads(done.stdout) for done in (started, again))
    assert first["started"] and not second["started"] and first["pid"] == second["pid"]

    status = engine_status()
    assert status["running"] and status["pid"] == first["pid"]
    assert {"pid", "socket", "model", "device", "memory", "clients", "queue", "loads", "uptime"} <= set(status)
    assert status["model"] == "tiny-random" and status["clients"] == 0 and status["queue"] == 0

    stopped = dgemma("engine", "stop")
    assert stopped.returncode == 0, stopped.stderr
    paths = EnginePaths.for_key(engine_key("tiny-random"))
    assert not lock_is_held(paths.pid_lock)  # the process is gone, not just its socket
    assert not paths.socket.exists() and not paths.token.exists()
    assert dgemma("engine", "status").returncode == 3
    assert dgemma("engine", "stop").returncode == 0  # stopping nothing is fine


def test_stop_during_a_load_ends_the_process_without_waiting_for_the_load(runtime_dir, monkeypatch):
    """A load cannot be interrupted (a checkpoint on a slow disk, a big model on a busy CPU):
    `engine stop` must end the process all the same, not say "stopped" while it loads on."""
    folder = ensure_tiny_random_model()
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).parent / "stalled_disk"))  # its reads never end
    started = dgemma("engine", "start", "--json", model=str(folder))
    assert started.returncode == 0, started.stderr
    assert json.loads(started.stdout)["state"] == "loading"

    stopped = dgemma("engine", "stop", model=str(folder))
    assert stopped.returncode == 0, stopped.stderr
    paths = EnginePaths.for_key(engine_key(str(folder)))
    assert not lock_is_held(paths.pid_lock)  # the process is gone: its lock went with it
    assert not paths.socket.exists() and not paths.token.exists()
    assert "exiting without waiting" in paths.log.read_text()


def test_status_and_stop_without_model_act_on_every_engine_and_model_options_narrow(runtime_dir):
    float32 = ("--dtype", "float32")  # the tiny model again, as a second engine with its own daemon
    pids = {}
    for dtype, extra in (("auto", ()), ("float32", float32)):
        started = dgemma("engine", "start", "--json", "--idle-unload", "0", *extra)
        assert started.returncode == 0, started.stderr
        pids[dtype] = json.loads(started.stdout)["pid"]
    assert pids["auto"] != pids["float32"]

    every = dgemma("engine", "status", "--json", model=None)
    assert every.returncode == 0, every.stderr
    listed = json.loads(every.stdout)
    assert {(e["model"], e["dtype"], e["pid"]) for e in listed} == {("tiny-random", d, pid) for d, pid in pids.items()}
    assert all(e["running"] for e in listed)
    assert dgemma("engine", "status", model=None).stdout.count("engine daemon pid") == 2
    assert engine_status(*float32)["pid"] == pids["float32"]  # --model tiny-random --dtype float32: that one
    assert dgemma("engine", "status", "--json", model="some/other-model").returncode == 3

    narrowed = dgemma("engine", "stop", "--json", *float32)
    assert narrowed.returncode == 0, narrowed.stderr
    assert [e["pid"] for e in json.loads(narrowed.stdout)] == [pids["float32"]]
    assert [e["pid"] for e in json.loads(dgemma("engine", "status", "--json", model=None).stdout)] == [pids["auto"]]

    rest = dgemma("engine", "stop", "--json", model=None)
    assert rest.returncode == 0, rest.stderr
    assert [(e["model"], e["pid"]) for e in json.loads(rest.stdout)] == [("tiny-random", pids["auto"])]
    nothing = dgemma("engine", "status", "--json", model=None)
    assert (nothing.returncode, json.loads(nothing.stdout)) == (3, [])
    assert not any(lock_is_held(path) for path in runtime_dir.glob("*.pid"))


def test_a_daemon_whose_endpoint_names_no_engine_is_listed_and_stopped_by_its_pid(runtime_dir):
    # What an older dgemma-lsp left running after an upgrade: its endpoint file says no key.
    started = dgemma("engine", "start", "--json", "--idle-unload", "0")
    assert started.returncode == 0, started.stderr
    pid = json.loads(started.stdout)["pid"]
    paths = EnginePaths.for_key(engine_key("tiny-random"))
    endpoint = json.loads(paths.endpoint.read_text())
    del endpoint["engine"]
    paths.endpoint.write_text(json.dumps(endpoint))

    (listed,) = json.loads(dgemma("engine", "status", "--json", model=None).stdout)
    assert (listed["pid"], listed["state"], listed["model"]) == (pid, "unknown", None)
    stopped = dgemma("engine", "stop", "--json", model=None)
    assert stopped.returncode == 0, stopped.stderr
    assert [e["pid"] for e in json.loads(stopped.stdout)] == [pid]
    assert not lock_is_held(paths.pid_lock)


async def test_auto_spawn_idle_unload_reload_and_stop_under_a_client(runtime_dir):
    key = engine_key("tiny-random")
    client = DaemonEngineClient(key, idle_unload=0.5, name="test")
    try:
        await client.start()  # no daemon yet: the client spawns one
        assert len((await within(client.denoise(quick(), lambda draft: None))).candidates) == 1
        await wait_for_status(client, lambda status: status.state == "unloaded")
        info = await within(query_info(key, client.paths))
        assert (info.state, info.memory, info.loads) == ("unloaded", 0, 1)

        assert len((await within(client.denoise(quick(), lambda draft: None))).candidates) == 1
        info = await within(query_info(key, client.paths))
        assert info.loads == 2 and info.clients == 1
        first_pid = info.pid

        # `engine stop` with a client attached: the client says so and does not respawn at once ...
        assert dgemma("engine", "stop").returncode == 0
        await wait_for_status(client, lambda status: status.state == "unloaded" and status.message)
        assert not lock_is_held(client.paths.pid_lock)
        # ... but the next request starts a new daemon.
        assert len((await within(client.denoise(quick(), lambda draft: None))).candidates) == 1
        assert (await within(query_info(key, client.paths))).pid != first_pid
    finally:
        await client.close()
    # The last client gone, the idle timeout ends the daemon itself.
    await within(_until(lambda: not lock_is_held(client.paths.pid_lock)))


async def test_a_request_running_when_the_daemon_is_killed_is_answered_by_the_new_daemon(runtime_dir):
    client = DaemonEngineClient(engine_key("tiny-random"), name="test")
    request = quick()
    request = msgspec.structs.replace(request, settings=msgspec.structs.replace(request.settings, steps=20))
    running = asyncio.Event()
    try:
        await client.start()
        await wait_for_status(client, lambda status: status.state == "ready")
        killed_pid = client.daemon_pid
        assert killed_pid is not None
        answer = asyncio.create_task(client.denoise(request, lambda draft: running.set()))
        await within(running.wait())  # the daemon is denoising this request right now
        os.kill(killed_pid, signal.SIGKILL)
        # The user is still waiting for this completion: the respawned daemon serves it.
        assert len((await within(answer)).candidates) == 1
        assert client.daemon_pid not in (None, killed_pid)
    finally:
        await client.close()


async def _until(predicate) -> None:
    while not predicate():  # another process's lifetime: no event to wait on from here
        await asyncio.sleep(0.05)


async def test_loopback_tcp_transport_checks_the_token(runtime_dir, monkeypatch):
    monkeypatch.setenv(TRANSPORT_ENV, "tcp")
    started = dgemma("engine", "start", "--idle-unload", "0")
    assert started.returncode == 0, started.stderr
    status = engine_status()
    assert status["socket"].startswith("tcp://127.0.0.1:")
    key = engine_key("tiny-random")
    paths = EnginePaths.for_key(key)
    assert not paths.socket.exists()
    assert stat.S_IMODE(os.stat(paths.token).st_mode) == 0o600
    token = read_token(paths.token)
    assert isinstance(await raw_hello(paths, Hello(version=PROTOCOL_VERSION, token=token, engine=key)), Welcome)
    refused = await raw_hello(paths, Hello(version=PROTOCOL_VERSION, token=token[::-1], engine=key))
    assert isinstance(refused, Refused)
    assert dgemma("engine", "stop").returncode == 0


def test_a_runtime_dir_owned_by_the_user_but_too_open_is_tightened(runtime_dir):
    os.chmod(runtime_dir, 0o755)
    done = dgemma("engine", "status")
    assert done.returncode == 3, done.stderr
    assert stat.S_IMODE(runtime_dir.stat().st_mode) == 0o700


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to hand the folder to another user")
def test_a_runtime_dir_owned_by_someone_else_is_refused(runtime_dir):
    os.chown(runtime_dir, 12345, 12345)
    done = dgemma("engine", "status")
    assert done.returncode == 1 and done.stderr


def test_racing_spawners_start_exactly_one_daemon(runtime_dir):
    key = engine_key("tiny-random")
    paths = EnginePaths.for_key(key)
    with ThreadPoolExecutor(4) as pool:
        pids = list(pool.map(lambda _: spawn_daemon(key, paths, idle_unload=None), range(4)))
    spawned = [pid for pid in pids if pid is not None]
    assert len(spawned) == 1  # the others found it running and attach instead
    assert engine_status()["pid"] == spawned[0]
