"""The engine as a resident daemon: attach to it, spawn it when absent, survive its death.

`DaemonEngineClient` implements the `EngineClient` Protocol (engine/client.py)
over the daemon protocol (engine/daemon/protocol.py). One per language server:

- `start()` connects in the background, spawning `dgemma-lsp engine serve`
  when no daemon answers; a lock file makes two front ends starting at once
  end up with one daemon. The spawner learns the daemon is listening from a
  line on an inherited pipe (no polling), and the daemon writes its stderr
  and log to the runtime dir, never to the editor's stdout.
- `denoise()` submits a job; drafts arrive as frames; cancelling the awaiting
  task sends a Cancel and waits (one denoising step) for the daemon to let go.
- When the connection drops (daemon killed or crashed), the status turns
  "error" with a message and a new connection (respawning the daemon) starts
  at once, not at the next request; every request that was waiting is sent
  again to the new daemon, once, so the user's last keystroke is still
  answered. A daemon stopped on purpose (`engine stop`) fails waiting calls
  with EngineUnavailableError and starts again only when work comes.

Knows asyncio, the protocol and the engine's public types; knows nothing of
LSP. Never imports torch: the daemon process does, when it loads the model.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import select
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import msgspec

from .. import errors
from ..api import DenoiseRequest, DenoiseResult, EngineStatus
from ..client import DraftListener, EngineUnavailableError, StatusListener
from ..model.folders import declared_context_tokens
from .paths import (
    ALREADY_RUNNING_EXIT,
    EnginePaths,
    FileLock,
    default_transport,
    engine_key,
    lock_is_held,
    read_token,
)
from .protocol import (
    PROTOCOL_VERSION,
    Cancel,
    DaemonInfo,
    DaemonRefusedError,
    DraftFrame,
    EngineKey,
    Failed,
    Forget,
    Goodbye,
    Hello,
    InfoFrame,
    InfoQuery,
    Load,
    PromptCacheBudget,
    ProtocolError,
    Refused,
    Result,
    Shutdown,
    StatusFrame,
    Submit,
    Welcome,
    daemon_decoder,
    encode_frame,
)
from .standby import supported as standby_supported

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 10.0
SPAWN_TIMEOUT_S = 120.0
RETRY_S = 0.02
"""Between two tries to connect to a daemon that is coming up."""
STANDBY_GRACE_S = 0.5 if standby_supported() else 0.0
"""After a daemon is lost, how long its standby may take to claim its place before another is started
(it takes milliseconds: the kernel closes the dead daemon's pipe and lock at once)."""
CANCEL_GRACE_S = 10.0
RELOAD_WAIT_S = 600.0
"""How long `reload` waits for the daemon's load to settle before answering with "loading"."""
DEFAULT_IDLE_UNLOAD_S = 900.0


class DaemonNotRunningError(errors.EngineError):
    """No daemon answers for this engine (and we were not asked to start one)."""


class ConnectionLostError(EngineUnavailableError):
    """The daemon's connection dropped under a waiting request: `denoise` sends it again once."""


# -- reaching a daemon -----------------------------------------------------------------------


async def open_stream(paths: EnginePaths) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A raw connection to the daemon of `paths`; DaemonNotRunningError when none listens."""
    try:
        endpoint = json.loads(paths.endpoint.read_text())
    except (FileNotFoundError, ValueError):
        endpoint = {"transport": "unix", "address": str(paths.socket)}
    address = str(endpoint.get("address", ""))
    try:
        if endpoint.get("transport") == "tcp":
            host, _, port = address.removeprefix("tcp://").rpartition(":")
            return await asyncio.wait_for(asyncio.open_connection(host, int(port)), CONNECT_TIMEOUT_S)
        return await asyncio.wait_for(asyncio.open_unix_connection(address), CONNECT_TIMEOUT_S)
    except (OSError, ValueError, TimeoutError) as error:
        raise DaemonNotRunningError(f"no engine daemon listens at {address or paths.folder}: {error}") from None


class DaemonSession:
    """One handshaken connection: sends frames, hands every received message to `on_message`."""

    def __init__(self, reader, writer, welcome: Welcome, paths: EnginePaths) -> None:
        self.reader, self.writer, self.welcome, self.paths = reader, writer, welcome, paths
        self.pid = welcome.pid
        self._decoder = daemon_decoder()
        self._reader_task: asyncio.Task | None = None

    @classmethod
    async def open(cls, key: EngineKey, paths: EnginePaths, name: str) -> DaemonSession:
        reader, writer = await open_stream(paths)
        try:
            hello = Hello(version=PROTOCOL_VERSION, token=read_token(paths.token), engine=key,
                          pid=os.getpid(), name=name)
            writer.write(encode_frame(hello))
            decoder = daemon_decoder()
            answer = await asyncio.wait_for(decoder.next_message(reader.read), CONNECT_TIMEOUT_S)
            if answer is None:
                raise DaemonNotRunningError("the engine daemon closed the connection during the handshake")
            if isinstance(answer, Refused):
                raise DaemonRefusedError(f"the engine daemon refused this client: {answer.reason}")
            if not isinstance(answer, Welcome):
                raise ProtocolError(f"expected a welcome from the engine daemon, got {type(answer).__name__}")
        except BaseException as error:
            writer.close()
            if isinstance(error, (ConnectionError, TimeoutError)):
                raise DaemonNotRunningError(f"the engine daemon did not answer: {error!r}") from None
            raise
        session = cls(reader, writer, answer, paths)
        session._decoder = decoder
        return session

    def listen(self, on_message: Callable, on_closed: Callable[[BaseException | None], None]) -> None:
        """Start the reader task; `on_closed(error)` runs once when the connection ends."""

        async def read() -> None:
            error: BaseException | None = None
            try:
                while (message := await self._decoder.next_message(self.reader.read)) is not None:
                    on_message(message)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a broken stream ends this session, nothing else
                error = exc
            finally:
                self.writer.close()
            on_closed(error)

        self._reader_task = asyncio.create_task(read(), name="dgemma-daemon-reader")

    def send(self, message) -> None:
        if not self.writer.is_closing():
            self.writer.write(encode_frame(message))

    @property
    def alive(self) -> bool:
        return not self.writer.is_closing() and (self._reader_task is None or not self._reader_task.done())

    async def close(self) -> None:
        if self._reader_task is not None:
            self._reader_task.cancel()
        self.writer.close()
        try:
            await self.writer.wait_closed()
        except (ConnectionError, OSError):
            pass


async def query_info(key: EngineKey, paths: EnginePaths) -> DaemonInfo:
    """DaemonInfo of the running daemon (DaemonNotRunningError when there is none)."""
    session = await DaemonSession.open(key, paths, "cli")
    try:
        session.send(InfoQuery(id=1))
        while (message := await session._decoder.next_message(session.reader.read)) is not None:
            if isinstance(message, InfoFrame):
                return message.info
        raise DaemonNotRunningError("the engine daemon closed the connection")
    finally:
        await session.close()


async def request_shutdown(key: EngineKey, paths: EnginePaths) -> int:
    """Ask the daemon to stop and wait until it has; returns its pid."""
    session = await DaemonSession.open(key, paths, "cli")
    session.send(Shutdown())
    # The daemon closes every connection once its work is cancelled: end of stream means done.
    while await session._decoder.next_message(session.reader.read) is not None:
        pass
    await session.close()
    # Then it leaves the model and exits; its pid lock goes with the process.
    deadline = time.monotonic() + CANCEL_GRACE_S
    while lock_is_held(paths.pid_lock) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    return session.pid


async def send_load(key: EngineKey, paths: EnginePaths) -> None:
    session = await DaemonSession.open(key, paths, "cli")
    session.send(Load())
    await session.writer.drain()
    await session.close()


# -- starting a daemon -------------------------------------------------------------------------


def spawn_daemon(key: EngineKey, paths: EnginePaths, *, idle_unload: float | None = DEFAULT_IDLE_UNLOAD_S,
                 log_level: str = "INFO", timeout: float = SPAWN_TIMEOUT_S) -> int | None:
    """Start `dgemma-lsp engine serve` detached and wait until it listens; returns its pid.

    Returns None when another process started one first (the caller just
    connects). Raises EngineError with the daemon's last log lines when it dies
    on the way up. Blocking: run it in a thread from async code.
    """
    with FileLock(paths.spawn_lock):
        if lock_is_held(paths.pid_lock):
            return None  # someone else's daemon is up (or coming up: it listens before taking work)
        command = [
            sys.executable, "-m", "dgemma_lsp.server.cli", "engine", "serve",
            "--model", key.model, "--quantization", key.quantization,
            "--idle-unload", str(idle_unload if idle_unload is not None else 0),
            "--log-file", str(paths.log), "--log-level", log_level,
        ]
        if key.device != "auto":
            command += ["--device", key.device]
        if key.dtype != "auto":
            command += ["--dtype", key.dtype]
        # stderr (tracebacks before logging is set up) goes to the log, stdout nowhere:
        # the editor's stdout is the LSP stream and the daemon outlives this process anyway.
        log_fd = os.open(paths.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        env = {**os.environ, "DGEMMA_LSP_TRANSPORT": default_transport(), "PYTHONUNBUFFERED": "1"}
        try:
            if sys.platform == "win32":
                process = subprocess.Popen(
                    command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log_fd, env=env,
                    creationflags=subprocess.CREATE_NEW_PROCESS_GROUP | subprocess.DETACHED_PROCESS,
                )
                ready = _wait_for_endpoint(paths, process, timeout)
            else:
                read_end, write_end = os.pipe()
                try:
                    process = subprocess.Popen(
                        [*command, "--ready-fd", str(write_end)], stdin=subprocess.DEVNULL,
                        stdout=subprocess.DEVNULL, stderr=log_fd, env=env,
                        start_new_session=True, pass_fds=(write_end,),
                    )
                finally:
                    os.close(write_end)
                try:
                    ready = _read_ready_line(read_end, timeout)
                finally:
                    os.close(read_end)
        finally:
            os.close(log_fd)
        # Reap it when it exits, so a killed daemon does not linger as a zombie of this process.
        threading.Thread(target=process.wait, name="dgemma-daemon-reaper", daemon=True).start()
        if not ready:
            try:  # it closed the pipe: its exit status is moments away
                code = process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                code = None
            if code == ALREADY_RUNNING_EXIT:
                return None  # a daemon's standby took the lock first (standby.py): connect to it
            if process.poll() is None:
                process.kill()
            raise errors.EngineError(
                f"the engine daemon did not start; the end of {paths.log}:\n{_log_tail(paths)}"
            )
        log.info("spawned engine daemon pid %d for %s", process.pid, key.model)
        return process.pid


def _read_ready_line(fd: int, timeout: float) -> bool:
    """True once the daemon wrote its pid line; False if it exited (EOF) or timed out first."""
    deadline = time.monotonic() + timeout
    data = b""
    while b"\n" not in data:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        readable, _, _ = select.select([fd], [], [], left)
        if not readable:
            return False
        chunk = os.read(fd, 64)
        if not chunk:
            return False
        data += chunk
    return True


def _wait_for_endpoint(paths: EnginePaths, process: subprocess.Popen, timeout: float) -> bool:
    # Windows has no pass_fds: watch for the endpoint file instead (the daemon writes it once listening).
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and process.poll() is None:
        if paths.endpoint.exists():
            return True
        time.sleep(0.05)
    return False


def _log_tail(paths: EnginePaths, lines: int = 8) -> str:
    try:
        return "\n".join(paths.log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


async def attach_or_spawn(key: EngineKey, paths: EnginePaths, name: str, *, spawn: bool = True,
                          idle_unload: float | None = DEFAULT_IDLE_UNLOAD_S, log_level: str = "INFO",
                          on_spawn: Callable[[], None] | None = None, standby_grace_s: float = 0.0) -> DaemonSession:
    """A session with the daemon of `key`, starting one when none answers.

    `standby_grace_s`: after a daemon was lost, how long to wait for its standby (standby.py) to take the
    pid lock before starting another daemon."""
    started = time.monotonic()
    deadline = started + SPAWN_TIMEOUT_S
    while True:
        try:
            return await DaemonSession.open(key, paths, name)
        except DaemonNotRunningError:
            if not spawn or time.monotonic() > deadline:
                raise
        if lock_is_held(paths.pid_lock) or time.monotonic() - started < standby_grace_s:
            # A daemon holds the pid lock but does not answer yet: it is coming up (a fresh one importing,
            # or a standby taking over), or a killed one whose lock the kernel has not dropped yet. Or a
            # daemon was just lost and its standby has not taken the lock yet. Either settles within moments.
            await asyncio.sleep(RETRY_S)
            continue
        if on_spawn is not None:
            on_spawn()
        pid = await asyncio.to_thread(spawn_daemon, key, paths, idle_unload=idle_unload, log_level=log_level)
        if pid is None:  # another process's daemon took the lock first: connect to it
            await asyncio.sleep(RETRY_S)


# -- the EngineClient --------------------------------------------------------------------------


class DaemonEngineClient:
    """An EngineClient whose engine runs in the user's resident daemon."""

    def __init__(self, key: EngineKey, *, paths: EnginePaths | None = None, spawn: bool = True,
                 idle_unload: float | None = DEFAULT_IDLE_UNLOAD_S, log_level: str = "INFO",
                 name: str = "lsp") -> None:
        self.key = key
        self.paths = paths or EnginePaths.for_key(key)
        self._spawn = spawn
        self._lost = False
        """The last session was lost (not closed by us): its standby may be taking over."""
        self._idle_unload = idle_unload
        self._log_level = log_level
        self._name = name
        # The model folder's context limit, known before the daemon answers: a request prepared meanwhile is cut too.
        self._status = EngineStatus(state="idle", model=key.model, context_tokens=declared_context_tokens(key.model))
        self._listeners: list[StatusListener] = []
        self._session: DaemonSession | None = None
        self._connecting: asyncio.Task[DaemonSession] | None = None
        self._jobs: dict[int, tuple[asyncio.Future, DraftListener]] = {}
        self._ids = itertools.count(1)
        self._closed = False
        self._goodbye: str | None = None  # set when the daemon said it stops on purpose
        self._prompt_cache_budget: int | None = None
        self._budget_set = False  # sent again on every (re)connection once the server set it
        self._reloads: list[asyncio.Future[None]] = []  # reload() calls waiting for the load to settle

    @classmethod
    def from_args(cls, args) -> DaemonEngineClient:
        key = engine_key(args.model, args.device, args.dtype, args.quantization)
        idle = getattr(args, "idle_unload", None)
        return cls(key, idle_unload=DEFAULT_IDLE_UNLOAD_S if idle is None else idle)

    @property
    def daemon_pid(self) -> int | None:
        return self._session.pid if self._session is not None and self._session.alive else None

    # -- EngineClient ------------------------------------------------------------------------

    async def start(self) -> None:
        if self._connecting is None and self._session is None:
            # "loading" right away: the server decides on a progress bar as soon as start() returns.
            self._set_status(state="loading", message="attaching to the engine daemon")
            self._connect_in_background()

    def status(self) -> EngineStatus:
        return self._status

    def on_status(self, listener: StatusListener) -> None:
        self._listeners.append(listener)

    async def denoise(self, request: DenoiseRequest, on_draft: DraftListener | None = None) -> DenoiseResult:
        try:
            return await self._denoise_once(request, on_draft)
        except ConnectionLostError as error:
            # The daemon died under this request (kill -9, crash) and a new one is on its way:
            # the user is still waiting for this answer, so ask the new daemon. Only once, in
            # case this very request is what brought the daemon down.
            log.info("%s; sending the request again", error)
        try:
            return await self._denoise_once(request, on_draft)
        except ConnectionLostError as error:
            raise EngineUnavailableError(str(error)) from None

    async def _denoise_once(self, request: DenoiseRequest, on_draft: DraftListener | None) -> DenoiseResult:
        session = await self._attached()
        job_id = next(self._ids)
        done: asyncio.Future[DenoiseResult] = asyncio.get_running_loop().create_future()
        self._jobs[job_id] = (done, on_draft or _ignore_draft)
        try:
            if not session.alive:  # it died while we resumed: _on_closed has already failed the others
                raise ConnectionLostError(f"the engine daemon (pid {session.pid}) went away; restarting it")
            session.send(Submit(id=job_id, request=request, drafts=on_draft is not None))
            return await asyncio.shield(done)
        except asyncio.CancelledError:
            self._jobs[job_id] = (done, _ignore_draft)  # no drafts of a cancelled request reach the editor
            if not done.done() and session.alive:
                session.send(Cancel(id=job_id))
                # "Cancelled" means no work left running: wait for the daemon's answer (one step).
                try:
                    await asyncio.wait_for(asyncio.shield(done), CANCEL_GRACE_S)
                except BaseException:
                    pass
            raise
        finally:
            self._jobs.pop(job_id, None)

    async def reload(self) -> EngineStatus:
        session = await self._attached()
        settled = asyncio.get_running_loop().create_future()
        self._reloads.append(settled)
        self._set_status(state="loading", message="reloading the model")
        session.send(Load(force=True))
        try:
            # The daemon answers with StatusFrames: wait for it to leave "loading" (a load can take minutes).
            await asyncio.wait_for(asyncio.shield(settled), RELOAD_WAIT_S)
        except TimeoutError:
            pass
        finally:
            if settled in self._reloads:
                self._reloads.remove(settled)
        return self._status

    async def close(self) -> None:
        self._closed = True
        if self._connecting is not None:
            self._connecting.cancel()
        session, self._session = self._session, None
        if session is not None:
            for job_id in list(self._jobs):
                session.send(Cancel(id=job_id))
            await session.close()
        self._fail_jobs(EngineUnavailableError("the engine client is closed"))

    def forget(self, document: str) -> None:
        # Not connected: nothing to send; a daemon that lost us keeps the snapshot until its LRU drops it.
        if self._session is not None and self._session.alive:
            self._session.send(Forget(document=document))

    def set_prompt_cache_budget(self, max_bytes: int | None) -> None:
        self._prompt_cache_budget, self._budget_set = max_bytes, True
        if self._session is not None and self._session.alive:
            self._session.send(PromptCacheBudget(max_bytes=max_bytes))

    # -- connection --------------------------------------------------------------------------

    async def _attached(self) -> DaemonSession:
        if self._closed:
            raise EngineUnavailableError("the engine client is closed")
        if self._session is not None and self._session.alive:
            return self._session
        if self._connecting is None:
            self._connect_in_background()
        assert self._connecting is not None
        try:
            return await asyncio.shield(self._connecting)
        except errors.EngineError as error:
            raise EngineUnavailableError(str(error)) from None

    def _connect_in_background(self) -> None:
        self._connecting = asyncio.create_task(self._connect(), name="dgemma-daemon-connect")
        self._connecting.add_done_callback(self._connected)

    async def _connect(self) -> DaemonSession:
        if self._status.state not in ("loading", "error"):
            self._set_status(state="loading", message="attaching to the engine daemon")
        lost, self._lost = self._lost, False
        session = await attach_or_spawn(
            self.key, self.paths, self._name, spawn=self._spawn, idle_unload=self._idle_unload,
            log_level=self._log_level,
            on_spawn=lambda: self._set_status(state="loading", message="starting the engine daemon"),
            standby_grace_s=STANDBY_GRACE_S if lost else 0.0,
        )
        session.listen(self._on_message, lambda error: self._on_closed(session, error))
        if self._budget_set:
            session.send(PromptCacheBudget(max_bytes=self._prompt_cache_budget))
        session.send(Load())  # a fresh or idle-unloaded daemon starts loading now, not at the first keystroke
        log.info("attached to engine daemon pid %d at %s", session.pid, self.paths.folder)
        return session

    def _connected(self, task: asyncio.Task) -> None:
        self._connecting = None
        if task.cancelled():
            return
        error = task.exception()
        if error is None:
            self._session = task.result()
            status = self._session.welcome.status
            if status.state in ("idle", "unloaded"):  # we just sent Load: say so, no flicker through idle
                status = msgspec.structs.replace(status, state="loading")
            self._publish(status)
            return
        log.warning("cannot reach the engine daemon: %s", error)
        self._set_status(state="error", message=f"engine daemon unavailable: {error}")

    def _on_closed(self, session: DaemonSession, error: BaseException | None) -> None:
        if self._session is session:
            self._session = None
        if self._closed:
            return
        goodbye, self._goodbye = self._goodbye, None
        if goodbye is not None:
            # Stopped on purpose (`engine stop`): start a new one only when work comes.
            message = f"{goodbye}; it starts again on the next request"
            log.info(message)
            self._fail_jobs(EngineUnavailableError(message))
            self._set_status(state="unloaded", message=message, device="", memory_bytes=0)
            return
        why = f": {error}" if error else ""
        message = f"the engine daemon (pid {session.pid}) went away{why}; restarting it"
        log.warning(message)
        # Respawn first, then wake the waiting requests: they find the new connection under way.
        self._set_status(state="error", message=message)
        self._lost = True  # its standby may be taking over
        if self._connecting is None:
            self._connect_in_background()
        self._fail_jobs(ConnectionLostError(message))

    def _on_message(self, message) -> None:
        if isinstance(message, DraftFrame):
            job = self._jobs.get(message.id)
            if job is not None and not job[0].done():
                try:
                    job[1](message.draft)
                except Exception:
                    log.exception("draft listener failed")
        elif isinstance(message, Result):
            self._settle(message.id, result=message.result)
        elif isinstance(message, Failed):
            self._settle(message.id, error=_failure_error(message))
        elif isinstance(message, StatusFrame):
            self._publish(message.status)
            if message.status.state not in ("idle", "loading", "unloaded"):
                for settled in self._reloads:
                    if not settled.done():
                        settled.set_result(None)
        elif isinstance(message, Goodbye):
            self._goodbye = message.reason
        elif isinstance(message, InfoFrame):
            pass  # only the CLI asks
        else:
            raise ProtocolError(f"unexpected {type(message).__name__} from the engine daemon")

    def _settle(self, job_id: int, *, result=None, error: BaseException | None = None) -> None:
        job = self._jobs.get(job_id)
        if job is None or job[0].done():
            return
        if error is None:
            job[0].set_result(result)
        else:
            job[0].set_exception(error)

    def _fail_jobs(self, error: BaseException) -> None:
        for done, _ in self._jobs.values():
            if not done.done():
                done.set_exception(error)

    # -- status ------------------------------------------------------------------------------

    def _set_status(self, **changes) -> None:
        self._publish(msgspec.structs.replace(self._status, **changes))

    def _publish(self, status: EngineStatus) -> None:
        if status == self._status:
            return
        self._status = status
        for listener in list(self._listeners):
            try:
                listener(status)
            except Exception:
                log.exception("status listener failed")


def _ignore_draft(draft) -> None:
    pass


def _failure_error(failed: Failed) -> BaseException:
    if failed.kind == "cancelled":
        return errors.CancelledError(failed.message)
    if failed.kind == "bad-request":
        return errors.BadRequestError(failed.message)
    if failed.kind in ("model-not-found", "model-load"):
        return EngineUnavailableError(failed.message)
    return errors.EngineError(failed.message)
