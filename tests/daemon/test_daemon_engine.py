"""One real daemon on the tiny model, driven by DaemonEngineClients and raw sockets.

Covers: file permissions, refused handshakes (token, version, model), malformed and
oversized frames closing only their own connection, cancellation reaching the
running denoise, the queue's priority order, and a front end that vanishes
mid-request leaving nothing running.
"""

from __future__ import annotations

import asyncio
import os
import signal
import stat
import subprocess
import sys
import textwrap
from dataclasses import dataclass

import pytest
from daemon_helpers import LONG, TIMEOUT, quick, raw_hello, wait_for_status, within

from dgemma_lsp.engine import errors
from dgemma_lsp.engine.api import EngineStatus
from dgemma_lsp.engine.client import EngineUnavailableError
from dgemma_lsp.engine.daemon.client import DaemonEngineClient, open_stream, query_info, spawn_daemon
from dgemma_lsp.engine.daemon.paths import EnginePaths, engine_key, new_token, read_token, write_private
from dgemma_lsp.engine.daemon.protocol import (
    PROTOCOL_VERSION,
    DraftFrame,
    EngineKey,
    Failed,
    Hello,
    Refused,
    Result,
    Submit,
    Welcome,
    client_decoder,
    daemon_decoder,
    encode_frame,
)


@dataclass
class Daemon:
    key: EngineKey
    paths: EnginePaths
    pid: int


@pytest.fixture(scope="module")
def daemon(module_runtime_dir) -> Daemon:
    key = engine_key("tiny-random")
    paths = EnginePaths.for_key(key)
    pid = spawn_daemon(key, paths, idle_unload=None)
    assert pid is not None
    return Daemon(key, paths, pid)


@pytest.fixture
async def client(daemon: Daemon):
    engine = DaemonEngineClient(daemon.key, spawn=False, name="test")
    await engine.start()
    await wait_for_status(engine, lambda status: status.state == "ready")
    yield engine
    await engine.close()


def test_runtime_dir_socket_token_and_endpoint_are_private(daemon: Daemon):
    assert stat.S_IMODE(daemon.paths.folder.stat().st_mode) == 0o700
    socket_mode = daemon.paths.socket.stat().st_mode
    assert stat.S_ISSOCK(socket_mode) and stat.S_IMODE(socket_mode) == 0o600
    for path in (daemon.paths.token, daemon.paths.endpoint, daemon.paths.log):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    assert len(read_token(daemon.paths.token)) >= 32


async def test_wrong_token_version_or_model_is_refused(daemon: Daemon):
    good = Hello(version=PROTOCOL_VERSION, token=read_token(daemon.paths.token), engine=daemon.key)
    assert isinstance(await raw_hello(daemon.paths, good), Welcome)
    for bad in (
        Hello(version=PROTOCOL_VERSION, token="not-the-token", engine=daemon.key),
        Hello(version=PROTOCOL_VERSION + 1, token=good.token, engine=daemon.key),
        Hello(version=PROTOCOL_VERSION, token=good.token, engine=EngineKey(model="another-model")),
    ):
        answer = await raw_hello(daemon.paths, bad)
        assert isinstance(answer, Refused), bad
        assert answer.reason


async def test_a_client_for_another_model_reports_the_refusal(daemon: Daemon):
    other = DaemonEngineClient(EngineKey(model="another-model"), paths=daemon.paths, spawn=False)
    with pytest.raises(EngineUnavailableError):
        await within(other.denoise(quick(), lambda draft: None))
    assert other.status().state == "error" and other.status().message
    await other.close()


@pytest.mark.parametrize("garbage", [b"\xff\xff\xff\xff", b"\x00\x00\x00\x03abc", b"\x00\x00\x00\x01\xc1"])
async def test_a_malformed_or_oversized_frame_closes_only_that_connection(daemon: Daemon, client, garbage):
    reader, writer = await open_stream(daemon.paths)
    writer.write(garbage)
    assert await within(reader.read(65536)) == b""  # closed by the daemon, no answer
    writer.close()
    result = await within(client.denoise(quick(), lambda draft: None))  # the others are still served
    assert len(result.candidates) == 1


async def test_a_job_submitted_without_drafts_streams_none(daemon: Daemon):
    """An editor with drafts off asks for none, and the daemon sends (and decodes) none."""
    reader, writer = await open_stream(daemon.paths)
    writer.write(encode_frame(Hello(version=PROTOCOL_VERSION, token=read_token(daemon.paths.token), engine=daemon.key)))
    decoder = daemon_decoder()

    async def frames_until_result(job_id: int) -> list:
        seen: list = []
        while not any(isinstance(m, Result) and m.id == job_id for m in seen):
            data = await within(reader.read(65536))
            assert data, "the daemon closed the connection"
            seen.extend(decoder.feed(data))
        return [m for m in seen if getattr(m, "id", None) == job_id]

    try:
        writer.write(encode_frame(Submit(id=1, request=quick(), drafts=True)))
        with_drafts = await frames_until_result(1)
        writer.write(encode_frame(Submit(id=2, request=quick(), drafts=False)))
        without = await frames_until_result(2)
    finally:
        writer.close()
    assert sum(isinstance(m, DraftFrame) for m in with_drafts) == quick().settings.steps
    assert [type(m) for m in without] == [Result]
    assert len(without[0].result.candidates) == 1


async def test_the_client_asks_for_drafts_only_when_someone_listens(runtime_dir):
    """The other side of `test_a_job_submitted_without_drafts_streams_none`: a peer that speaks
    the daemon's handshake records what the real client submits, and fails every job."""
    key = engine_key("tiny-random")
    paths = EnginePaths.for_key(key, folder=runtime_dir)
    write_private(paths.token, new_token())
    submits: asyncio.Queue[Submit] = asyncio.Queue()

    async def peer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        decoder = client_decoder()
        while data := await reader.read(65536):
            for message in decoder.feed(data):
                if isinstance(message, Hello):
                    status = EngineStatus(state="ready", model="tiny-random")
                    writer.write(encode_frame(Welcome(version=PROTOCOL_VERSION, pid=os.getpid(), status=status)))
                elif isinstance(message, Submit):
                    submits.put_nowait(message)
                    writer.write(encode_frame(Failed(id=message.id, kind="engine", message="recorded")))

    server = await asyncio.start_unix_server(peer, path=str(paths.socket))
    engine = DaemonEngineClient(key, paths=paths, spawn=False, name="test")
    try:
        for listener, wanted in ((None, False), (lambda draft: None, True)):
            with pytest.raises(errors.EngineError, match="recorded"):
                await within(engine.denoise(quick(), listener), 30)
            assert (await within(submits.get(), 30)).drafts is wanted
    finally:
        await engine.close()
        server.close()


async def test_cancel_reaches_the_running_denoise(daemon: Daemon, client):
    first = asyncio.Event()
    cancelled_before = (await within(query_info(daemon.key, daemon.paths))).cancelled

    def on_draft(draft) -> None:
        first.set()

    task = asyncio.create_task(client.denoise(LONG, on_draft))
    await within(first.wait())
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await within(task)
    # The client waited for the daemon to let go: nothing is running or queued now.
    info = await within(query_info(daemon.key, daemon.paths))
    assert (info.running_jobs, info.queue) == (0, 0)
    assert info.cancelled == cancelled_before + 1  # the engine stopped the request, not the client alone
    assert len((await within(client.denoise(quick(), lambda draft: None))).candidates) == 1


async def test_the_queue_runs_higher_priority_first_then_the_newest(daemon: Daemon, client):
    started = asyncio.Event()
    blocker = asyncio.create_task(client.denoise(LONG, lambda draft: started.set()))
    await within(started.wait())
    finished: list[str] = []

    async def job(name: str, priority: int) -> None:
        await client.denoise(quick(priority), lambda draft: None)
        finished.append(name)

    jobs = [asyncio.create_task(job("old keystroke", 0))]
    await _queue_length(daemon, 1)
    jobs.append(asyncio.create_task(job("speculative", -1)))
    await _queue_length(daemon, 2)
    jobs.append(asyncio.create_task(job("urgent", 5)))
    jobs.append(asyncio.create_task(job("new keystroke", 0)))
    await _queue_length(daemon, 4)
    blocker.cancel()
    await within(asyncio.gather(*jobs))
    assert finished == ["urgent", "new keystroke", "old keystroke", "speculative"]


async def _queue_length(daemon: Daemon, length: int) -> None:
    # Submits travel on the client's connection, queries on their own: wait until the daemon has them.
    async def loop() -> None:
        while (await query_info(daemon.key, daemon.paths)).queue < length:
            await asyncio.sleep(0.05)

    await within(loop())


VANISHING_FRONT_END = textwrap.dedent("""
    import asyncio, sys
    from daemon_helpers import LONG
    from dgemma_lsp.engine.daemon.paths import engine_key
    from dgemma_lsp.engine.daemon.client import DaemonEngineClient

    async def main():
        client = DaemonEngineClient(engine_key("tiny-random"), spawn=False, name="doomed")
        drafting = asyncio.Event()
        job = asyncio.create_task(client.denoise(LONG, lambda draft: drafting.set()))
        await drafting.wait()
        sys.stdout.write("drafting\\n")
        sys.stdout.flush()
        await job

    asyncio.run(main())
""")


async def test_a_front_end_that_vanishes_mid_request_leaves_nothing_running(daemon: Daemon, client):
    helpers = os.path.dirname(__file__)
    front_end = subprocess.Popen(
        [sys.executable, "-c", VANISHING_FRONT_END], stdout=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [helpers, os.environ.get("PYTHONPATH")]))},
    )
    try:
        line = await within(asyncio.to_thread(front_end.stdout.readline))
        assert line == "drafting\n"
        await wait_for_status(client, lambda status: status.state == "busy")
        front_end.send_signal(signal.SIGKILL)
        await wait_for_status(client, lambda status: status.state == "ready")
    finally:
        front_end.kill()
        front_end.wait(TIMEOUT)
    info = await within(query_info(daemon.key, daemon.paths))
    assert (info.running_jobs, info.queue, info.clients) == (0, 0, 1)
    assert info.loads == 1


async def test_a_bad_request_fails_alone_with_its_own_error(client):
    bad = quick()
    bad = type(bad)(context=bad.context, settings=type(bad.settings)(steps=0))
    with pytest.raises(errors.BadRequestError):
        await within(client.denoise(bad, lambda draft: None))
    assert len((await within(client.denoise(quick(), lambda draft: None))).candidates) == 1


async def test_a_closed_document_is_forgotten_through_the_daemon_and_status_reports_the_bytes(daemon, client):
    import msgspec
    from daemon_helpers import engine_status

    uri = "file:///tmp/forget_me.py"
    await within(client.denoise(msgspec.structs.replace(quick(), cache_key=uri), lambda draft: None))
    assert (await within(query_info(daemon.key, daemon.paths))).prompt_cache_bytes > 0
    assert engine_status()["promptCacheBytes"] > 0  # `engine status --json`

    client.forget(uri)

    async def forgotten() -> None:
        while (await query_info(daemon.key, daemon.paths)).prompt_cache_bytes:
            await asyncio.sleep(0.05)

    await within(forgotten(), 30)

    client.set_prompt_cache_budget(0)  # keep nothing: the next request's snapshot is used, not kept
    await within(client.denoise(msgspec.structs.replace(quick(), cache_key=uri), lambda draft: None))
    assert (await within(query_info(daemon.key, daemon.paths))).prompt_cache_bytes == 0
    client.set_prompt_cache_budget(None)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="nice is per thread on Linux only")
async def test_the_daemon_denoises_on_a_niced_thread_and_serves_on_the_others(daemon: Daemon, client):
    """On the CPU the engine's computation gives way to the editor, the server and the daemon's
    own event loop (engine/runtime/service.py, serving_engine_nice): the thread that denoised
    (and any torch threads it started) runs at CPU_ENGINE_NICE, its event loop (the main
    thread) at 0."""
    from dgemma_lsp.engine.runtime.service import CPU_ENGINE_NICE

    assert len((await within(client.denoise(quick()))).candidates) == 1

    def nice_of(thread: str) -> int:
        stat_line = open(f"/proc/{daemon.pid}/task/{thread}/stat").read()
        return int(stat_line.rsplit(")", 1)[1].split()[16])  # field 19 of proc(5): nice

    nices = {thread: nice_of(thread) for thread in os.listdir(f"/proc/{daemon.pid}/task")}
    assert list(nices.values()).count(CPU_ENGINE_NICE) >= 1, nices
    assert nices[str(daemon.pid)] == 0
