"""The resident engine daemon: one InfillService shared by every editor window of a user.

`EngineDaemon.serve()` listens on a Unix socket (mode 0600 in the 0700 runtime
dir) or on loopback TCP, and speaks `protocol` frames. Every client's
jobs go into one queue, ordered by DenoiseRequest.priority and, within a
priority, newest first (the latest keystroke is the one the user is waiting
for; older ones are usually stale). One dispatcher runs one job at a time on a
single worker thread, so the model is loaded once however many clients attach.

- Cancel frames set the running job's threading.Event (the service stops
  within one step) or drop a queued job; a connection that closes cancels all
  of its jobs, so a vanished front end leaves nothing running.
- After `idle_unload` seconds without work the model is unloaded; the next
  job loads it again. When that timeout finds no client attached, the daemon
  exits (so daemons of closed editors do not pile up). Status changes are
  pushed to every client.
- A malformed, oversized or unexpected frame closes that connection only.
- Race safety: the live daemon holds an flock on its `.pid` file for its whole
  life; a second daemon for the same engine exits at once.

Knows asyncio, the service and the protocol; knows nothing of LSP. torch is
imported by the service only when the model loads.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import json
import logging
import os
import secrets
import signal
import threading
import time
from dataclasses import dataclass, field

from .. import errors
from ..api import DenoiseRequest, EngineStatus
from . import standby as standbys
from .paths import ALREADY_RUNNING_EXIT, EnginePaths, FileLock, new_token, write_private
from .protocol import (
    PROTOCOL_VERSION,
    Cancel,
    DaemonInfo,
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
    client_decoder,
    encode_frame,
)

log = logging.getLogger(__name__)
Standby = standbys.Standby

HANDSHAKE_TIMEOUT_S = 10.0
DRAFT_BACKLOG_BYTES = 1024 * 1024
"""A client that has this much unread output gets no more drafts (results still go out)."""


class DaemonAlreadyRunningError(errors.EngineError):
    """Another daemon already serves this engine (it holds the pid lock)."""


@dataclass(eq=False)
class Job:
    id: int
    connection: Connection
    request: DenoiseRequest
    drafts: bool
    sequence: int
    cancel: threading.Event = field(default_factory=threading.Event)

    @property
    def order(self) -> tuple[int, int]:
        return (self.request.priority, self.sequence)


@dataclass(eq=False)
class Connection:
    writer: asyncio.StreamWriter
    pid: int = 0
    name: str = ""
    welcomed: bool = False
    closed: bool = False
    jobs: dict[int, Job] = field(default_factory=dict)

    def send(self, message) -> None:
        if self.closed or self.writer.is_closing():
            return
        self.writer.write(encode_frame(message))

    def backlog(self) -> int:
        return self.writer.transport.get_write_buffer_size()


class EngineDaemon:
    """Serves one InfillService over a local socket until Shutdown or SIGTERM."""

    def __init__(self, service, key: EngineKey, paths: EnginePaths, *,
                 idle_unload: float | None = 900.0, transport: str = "unix") -> None:
        self.service = service
        self.key = key
        self.paths = paths
        self.idle_unload = idle_unload if idle_unload and idle_unload > 0 else None
        self.transport = transport
        self.address = ""
        self._token = ""
        self._started = time.monotonic()
        self._connections: set[Connection] = set()
        self._queue: list[Job] = []
        self._running: Job | None = None
        self._sequence = itertools.count()
        self._load_wanted = False
        self._reload_wanted = False
        self._loading = False
        self.load_abandoned = False
        """Set when the daemon stopped during a load: the process must exit without joining the loader."""
        self._unload_due = False
        self._idle_timer: asyncio.TimerHandle | None = None
        self._last_status: EngineStatus | None = None
        # One worker thread: jobs, loads and unloads never overlap on the model.
        self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="dgemma-engine")
        self._work = asyncio.Event()
        self._stopping = asyncio.Event()
        self._stop_reason = "stopped by a signal"
        self.standby: Standby | None = None
        """The warm standby that serves in our place if this process is killed (standby.py)."""

    # -- lifecycle -------------------------------------------------------------------------

    async def serve(self, ready_fd: int | None = None, *, pid_lock: FileLock | None = None,
                    standby: Standby | None = None) -> None:
        """Listen, tell the spawner we are ready (a line on `ready_fd`), serve until stopped.

        `pid_lock`: already held (a standby taking over); `standby`: ours, stopped before the lock is let go."""
        self.standby = standby
        if pid_lock is None:
            pid_lock = FileLock(self.paths.pid_lock)
            if not pid_lock.acquire(blocking=False):
                raise DaemonAlreadyRunningError(f"an engine daemon for {self.key.model} is already running")
        server = None
        try:
            pid_lock.write(f"{os.getpid()}\n")
            self._token = new_token()
            write_private(self.paths.token, self._token)
            server = await self._listen()
            write_private(self.paths.endpoint, json.dumps({
                "transport": self.transport, "address": self.address, "pid": os.getpid(),
                "protocol": PROTOCOL_VERSION,
                # What this daemon serves, so `engine status|stop` can find every engine of the user.
                "engine": {"model": self.key.model, "device": self.key.device, "dtype": self.key.dtype,
                           "quantization": self.key.quantization},
            }))
            loop = asyncio.get_running_loop()
            for signum in (signal.SIGTERM, signal.SIGINT):
                try:
                    loop.add_signal_handler(signum, self._stopping.set)
                except (NotImplementedError, RuntimeError):  # Windows, or not the main thread
                    pass
            log.info("engine daemon %d serving %s at %s (idle unload: %s s)",
                     os.getpid(), self.key.model, self.address, self.idle_unload)
            if ready_fd is not None:
                os.write(ready_fd, f"{os.getpid()}\n".encode())
                os.close(ready_fd)
            # Load progress (shards read) is pushed to every client from the loading thread.
            self.service.on_change = lambda: loop.call_soon_threadsafe(self._publish)
            dispatcher = asyncio.create_task(self._dispatch(), name="dgemma-dispatch")
            self._arm_idle_timer()  # a daemon nobody attaches to does not stay forever
            await self._stopping.wait()
            log.info("engine daemon stopping")
            await self._shut_down(server, dispatcher)
        finally:
            for path in (self.paths.endpoint, self.paths.token):
                path.unlink(missing_ok=True)
            if self.transport == "unix":
                self.paths.socket.unlink(missing_ok=True)
            if standby is not None:
                standby.stop()  # we stop on purpose: it must not take over
            if self.load_abandoned:  # said before the lock goes: whoever waits for the lock reads it in the log
                log.info("engine daemon stopped during a load: exiting without waiting for it")
            pid_lock.release()

    async def _listen(self) -> asyncio.AbstractServer:
        if self.transport == "unix":
            path = self.paths.socket
            path.unlink(missing_ok=True)  # stale: we hold the pid lock, so no live daemon owns it
            old_umask = os.umask(0o177)  # the socket is born 0600: no window where others may connect
            try:
                server = await asyncio.start_unix_server(self._handle, path=str(path))
            finally:
                os.umask(old_umask)
            os.chmod(path, 0o600)
            self.address = str(path)
        else:
            server = await asyncio.start_server(self._handle, host="127.0.0.1", port=0)
            host, port = server.sockets[0].getsockname()[:2]
            self.address = f"tcp://{host}:{port}"
        return server

    async def _shut_down(self, server: asyncio.AbstractServer, dispatcher: asyncio.Task) -> None:
        loading = self._loading  # read before the dispatcher's cancellation clears it
        server.close()
        for job in list(self._queue):
            self._finish_queued(job, "cancelled", "the engine daemon is shutting down")
        if self._running is not None:
            self._running.cancel.set()
        dispatcher.cancel()
        for connection in list(self._connections):
            if connection.welcomed:
                connection.send(Goodbye(reason=f"the engine daemon was {self._stop_reason}"))
            connection.closed = True
            connection.writer.close()
        if loading:
            # A load cannot be interrupted and may take minutes: `engine stop` must not wait for it.
            # It only reads files, so the process may leave it (run_daemon exits at once).
            self.load_abandoned = True
            self._executor.shutdown(wait=False, cancel_futures=True)
            # Let the connections' handlers see their end of stream before asyncio.run cancels them.
            closing = [connection.writer.wait_closed() for connection in list(self._connections)]
            try:
                await asyncio.wait_for(asyncio.gather(*closing, return_exceptions=True), 5.0)
            except TimeoutError:
                pass  # a peer that does not close: it is cancelled with the rest
            await asyncio.sleep(0)
            return
        # Let the worker leave the model (one step) before the process exits.
        await asyncio.get_running_loop().run_in_executor(None, self._executor.shutdown, True)

    # -- connections -----------------------------------------------------------------------

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connection = Connection(writer)
        self._connections.add(connection)
        decoder = client_decoder()
        try:
            hello = await asyncio.wait_for(decoder.next_message(reader.read), HANDSHAKE_TIMEOUT_S)
            if hello is None:
                return
            refusal = self._check_hello(hello)
            if refusal:
                log.warning("refused a client: %s", refusal)
                connection.send(Refused(reason=refusal))
                await writer.drain()
                return
            connection.pid, connection.name, connection.welcomed = hello.pid, hello.name, True
            connection.send(Welcome(version=PROTOCOL_VERSION, pid=os.getpid(), status=self._status()))
            log.info("client %s (pid %d) attached; %d clients", hello.name, hello.pid, self._clients())
            while (message := await decoder.next_message(reader.read)) is not None:
                self._on_message(connection, message)
        except ProtocolError as error:
            log.warning("closing a connection (pid %d): %s", connection.pid, error)
        except TimeoutError:
            log.warning("closing a connection that sent no hello in %.0f s", HANDSHAKE_TIMEOUT_S)
        except (ConnectionError, OSError) as error:
            log.info("connection (pid %d) lost: %s", connection.pid, error)
        finally:
            self._drop(connection)
            writer.close()

    def _check_hello(self, hello) -> str:
        if not isinstance(hello, Hello):
            return "the first frame must be a hello"
        if hello.version != PROTOCOL_VERSION:
            return (f"protocol version {hello.version} of the client does not match version "
                    f"{PROTOCOL_VERSION} of the engine daemon (pid {os.getpid()}); "
                    "run `dgemma-lsp engine stop` so a matching daemon starts")
        if not secrets.compare_digest(hello.token.encode(), self._token.encode()):
            return f"wrong token: read it from {self.paths.token} (same user only)"
        if hello.engine != self.key:
            return (f"this engine daemon serves {_describe(self.key)}, not {_describe(hello.engine)}; "
                    "each (model, device, dtype, quantization) has its own daemon")
        return ""

    def _on_message(self, connection: Connection, message) -> None:
        if isinstance(message, Submit):
            if message.id in connection.jobs:
                raise ProtocolError(f"job id {message.id} is already in use on this connection")
            job = Job(message.id, connection, message.request, message.drafts, next(self._sequence))
            connection.jobs[job.id] = job
            self._queue.append(job)
            self._work.set()
        elif isinstance(message, Cancel):
            job = connection.jobs.get(message.id)
            if job is not None:
                self._cancel(job)
        elif isinstance(message, Load):
            self._load_wanted = True
            self._reload_wanted |= message.force
            self._work.set()
        elif isinstance(message, InfoQuery):
            connection.send(InfoFrame(id=message.id, info=self.info(asking=connection)))
        elif isinstance(message, Forget):
            self.service.forget(message.document)  # never blocks: deferred while a job runs
            self._publish()
        elif isinstance(message, PromptCacheBudget):
            self.service.set_prompt_cache_budget(message.max_bytes)
            self._publish()
        elif isinstance(message, Shutdown):
            log.info("shutdown requested by pid %d", connection.pid)
            self._stop_reason = f"stopped on request of pid {connection.pid}"
            self._stopping.set()
        else:  # a second Hello
            raise ProtocolError(f"unexpected {type(message).__name__} after the handshake")

    def _cancel(self, job: Job) -> None:
        if job is self._running:
            job.cancel.set()  # the worker raises CancelledError within one step; Failed follows
        elif job in self._queue:
            self._finish_queued(job, "cancelled", "cancelled before it started")

    def _finish_queued(self, job: Job, kind: str, message: str) -> None:
        self._queue.remove(job)
        job.connection.jobs.pop(job.id, None)
        job.connection.send(Failed(id=job.id, kind=kind, message=message))

    def _drop(self, connection: Connection) -> None:
        """A connection closed: nothing it asked for keeps running."""
        connection.closed = True
        self._connections.discard(connection)
        for job in list(connection.jobs.values()):
            self._cancel(job)
        if connection.welcomed:
            log.info("client %s (pid %d) detached; %d clients", connection.name, connection.pid,
                     self._clients())
        if self._clients() == 0:
            self._arm_idle_timer()

    def _clients(self) -> int:
        return sum(1 for c in self._connections if c.welcomed and not c.closed)

    # -- work ------------------------------------------------------------------------------

    async def _dispatch(self) -> None:
        """The only place that touches the model: loads, jobs and unloads, one at a time."""
        loop = asyncio.get_running_loop()
        while True:
            await self._work.wait()
            self._work.clear()
            self._disarm_idle_timer()
            if self._reload_wanted:  # a model that failed to load, or changed files: try again now
                self._reload_wanted = False
                if self.service.loaded:
                    await loop.run_in_executor(self._executor, self.service.unload)
                self.service.allow_retry()
            if (self._load_wanted or self._queue) and not self.service.loaded:
                self._load_wanted = False
                failure = await self._load(loop)
                if failure is not None:  # every waiting job gets the load error, not a second attempt
                    for job in list(self._queue):
                        self._finish_queued(job, *failure)
            self._load_wanted = False
            while self._queue:
                job = max(self._queue, key=lambda j: j.order)
                self._queue.remove(job)
                self._running = job
                # "busy" goes out once the job is on its way to the engine thread (`_run` hands
                # it over before it first waits): the status is not on the keystroke's path.
                loop.call_soon(self._publish)
                try:
                    await self._run(loop, job)
                finally:
                    self._running = None
                    job.connection.jobs.pop(job.id, None)
                self._publish()
            if self._unload_due:
                self._unload_due = False
                if self.service.loaded:
                    log.info("idle for %s s: unloading the model", self.idle_unload)
                    await loop.run_in_executor(self._executor, self.service.unload)
                    self._publish()
                if self._clients() == 0 and not self._queue:
                    # Nobody attached and nothing loaded: a resident process would only be litter.
                    log.info("idle for %s s with no clients: exiting", self.idle_unload)
                    self._stop_reason = "idle with no clients"
                    self._stopping.set()
                    return
            self._arm_idle_timer()

    async def _load(self, loop: asyncio.AbstractEventLoop) -> tuple[str, str] | None:
        """Load the model; on failure the (Failed.kind, message) to answer waiting jobs with."""
        self._loading = True
        self._publish()
        try:
            took = await loop.run_in_executor(self._executor, self.service.load)
            log.info("model %s loaded in %.0f ms", self.key.model, took)
            return None
        except errors.ModelNotFoundError as error:
            log.error("model not found: %s", error)
            return "model-not-found", str(error)
        except errors.EngineError as error:
            log.error("model failed to load: %s", error)
            return "model-load", str(error)
        except Exception as error:
            log.exception("model failed to load")
            return "model-load", f"the model failed to load: {error!r}"
        finally:
            self._loading = False
            self._publish()

    async def _run(self, loop: asyncio.AbstractEventLoop, job: Job) -> None:
        connection = job.connection

        def on_draft(draft) -> None:  # worker thread
            if not job.cancel.is_set():
                loop.call_soon_threadsafe(self._send_draft, job, draft)

        try:
            # No listener when the client wants no drafts: the engine then decodes none.
            result = await loop.run_in_executor(
                self._executor, self.service.denoise, job.request, on_draft if job.drafts else None, job.cancel
            )
        except errors.CancelledError as error:
            connection.send(Failed(id=job.id, kind="cancelled", message=str(error)))
        except errors.BadRequestError as error:
            connection.send(Failed(id=job.id, kind="bad-request", message=str(error)))
        except errors.ModelNotFoundError as error:
            connection.send(Failed(id=job.id, kind="model-not-found", message=str(error)))
        except errors.ModelLoadError as error:
            connection.send(Failed(id=job.id, kind="model-load", message=str(error)))
        except errors.EngineError as error:
            connection.send(Failed(id=job.id, kind="engine", message=str(error)))
        except Exception as error:  # a bug in the engine must not take every editor down with it
            log.exception("job %d of pid %d failed", job.id, connection.pid)
            connection.send(Failed(id=job.id, kind="internal", message=f"internal engine error: {error!r}"))
        else:
            connection.send(Result(id=job.id, result=result))

    def _send_draft(self, job: Job, draft) -> None:
        # A client that does not read its drafts must not grow our memory without bound.
        if not job.cancel.is_set() and job.connection.backlog() < DRAFT_BACKLOG_BYTES:
            job.connection.send(DraftFrame(id=job.id, draft=draft))

    def _arm_idle_timer(self) -> None:
        """(Re)start the idle clock if there is something to do when it runs out."""
        self._disarm_idle_timer()
        if self.idle_unload is None or self._queue or self._running or self._stopping.is_set():
            return
        if self.service.loaded or self._clients() == 0:
            loop = asyncio.get_running_loop()
            self._idle_timer = loop.call_later(self.idle_unload, self._idle_timeout)

    def _disarm_idle_timer(self) -> None:
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None

    def _idle_timeout(self) -> None:
        self._idle_timer = None
        self._unload_due = True
        self._work.set()

    # -- status ----------------------------------------------------------------------------

    def _status(self) -> EngineStatus:
        status = self.service.status()
        state = status.state
        if self._loading:
            state = "loading"
        elif self._running is not None and state in ("ready", "idle"):
            state = "busy"
        elif state == "busy" and self._running is None:
            state = "ready"
        if state != status.state:
            status = _replace(status, state=state)
        return status

    def _publish(self) -> None:
        status = self._status()
        if status == self._last_status:
            return
        self._last_status = status
        for connection in list(self._connections):
            if connection.welcomed:
                connection.send(StatusFrame(status=status))

    def info(self, asking: Connection | None = None) -> DaemonInfo:
        status = self._status()
        attached = [c for c in self._connections if c.welcomed and not c.closed and c is not asking]
        return DaemonInfo(
            pid=os.getpid(),
            socket=self.address,
            model=self.key.model,
            device=status.device or self.key.device,
            dtype=self.key.dtype,
            quantization=self.key.quantization,
            state=status.state,
            message=status.message,
            memory=status.memory_bytes,
            clients=len(attached),
            client_pids=sorted(c.pid for c in attached),
            queue=len(self._queue),
            running_jobs=int(self._running is not None),
            loads=status.loads,
            uptime=round(time.monotonic() - self._started, 3),
            idle_unload=self.idle_unload,
            last_latency_ms=status.last_latency_ms,
            log_file=str(self.paths.log),
            protocol=PROTOCOL_VERSION,
            prompt_cache_bytes=status.prompt_cache_bytes,
            standby_pid=self.standby.pid if self.standby is not None else 0,
            cancelled=status.cancelled,
        )


def _describe(key: EngineKey) -> str:
    return (f"model {key.model!r} (device {key.device}, dtype {key.dtype}, "
            f"quantization {key.quantization})")


def _replace(status: EngineStatus, **changes) -> EngineStatus:
    import msgspec

    return msgspec.structs.replace(status, **changes)


def run_daemon(key: EngineKey, paths: EnginePaths, *, idle_unload: float | None, transport: str,
               ready_fd: int | None = None, preload: bool = False) -> int:
    """Entry point of `dgemma-lsp engine serve`: blocks until the daemon stops; returns an exit code.

    Where a standby can be kept (standby.py), the model's imports come first and a standby is forked
    before anything else exists; a standby that takes over returns through here to serve."""
    # The lock first: of two daemons starting at once (a front end's and a standby taking over), the
    # loser leaves before paying for the imports.
    pid_lock = FileLock(paths.pid_lock)
    if not pid_lock.acquire(blocking=False):
        log.info("an engine daemon for %s is already running", key.model)
        return ALREADY_RUNNING_EXIT
    spare = None
    if standbys.supported():
        standbys.warm_imports()
        keep_out = (pid_lock.fileno(),) if ready_fd is None else (pid_lock.fileno(), ready_fd)
        spare, taken_over = standbys.start(paths, close_in_child=keep_out)
        if taken_over is not None:  # this process is the standby of a daemon that died
            pid_lock, ready_fd = taken_over, None  # the spawner's pipe was the dead daemon's, and is closed here
    try:
        return _serve(key, paths, idle_unload=idle_unload, transport=transport, ready_fd=ready_fd, preload=preload,
                      pid_lock=pid_lock, spare=spare)
    except BaseException:
        if spare is not None:  # a daemon that failed must not be replaced by its standby, failing again
            spare.stop()
        raise
    finally:
        standbys.thaw()


def _serve(key: EngineKey, paths: EnginePaths, *, idle_unload: float | None, transport: str, ready_fd: int | None,
           preload: bool, pid_lock: FileLock, spare: Standby | None) -> int:
    from ..runtime.service import serving_service

    service = serving_service(
        key.model,
        device=None if key.device == "auto" else key.device,
        dtype=None if key.dtype == "auto" else key.dtype,
        quantization=key.quantization,
    )
    daemon = EngineDaemon(service, key, paths, idle_unload=idle_unload, transport=transport)

    async def main() -> None:
        if preload:
            daemon._load_wanted = True
            daemon._work.set()
        await daemon.serve(ready_fd, pid_lock=pid_lock, standby=spare)

    try:
        asyncio.run(main())
    finally:
        if service.loaded and not daemon.load_abandoned:
            service.unload()
    if daemon.load_abandoned:
        # The loader thread is still reading the checkpoint; a normal exit would join it
        # (concurrent.futures' atexit hook). Its files and lock are already released.
        logging.shutdown()
        os._exit(0)
    return 0
