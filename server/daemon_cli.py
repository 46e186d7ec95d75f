"""`dgemma-lsp engine start|stop|status [--json]`: the resident engine daemons from a shell.

One daemon serves one (model, device, dtype, quantization). `start` spawns the
one the --model, --device, --dtype and --quantization options choose (default
model: the real checkpoint) detached (it logs to `engine-*.log` in the runtime
dir) and asks it to load the model. `status` and `stop` act on every daemon of
this user running now, like `ollama ps`; each of those options given narrows
them to the daemons that match. `status` prints what each is doing (`--json`: a
list of the DaemonInfo fields, plus `running`); `stop` asks each to finish and
exit (`--json`: a list of what was stopped). The hidden action `serve` is the
daemon process itself, run by `start` and by language servers that find no daemon.

Exit codes: 0 done; 1 failure; 3 `status` found no daemon.
Knows argparse and the daemon client; the daemon process imports the engine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time

from dgemma_lsp.engine import errors
from dgemma_lsp.engine.daemon.client import (
    CANCEL_GRACE_S,
    DEFAULT_IDLE_UNLOAD_S,
    DaemonNotRunningError,
    query_info,
    request_shutdown,
    send_load,
    spawn_daemon,
)
from dgemma_lsp.engine.daemon.paths import (
    EnginePaths,
    RunningEngine,
    default_transport,
    engine_key,
    lock_is_held,
    running_engines,
)
from dgemma_lsp.engine.daemon.protocol import DaemonRefusedError, EngineKey, ProtocolError
from dgemma_lsp.engine.model.folders import DEFAULT_MODEL_ID

NOT_RUNNING = 3


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=["start", "stop", "status", "serve"], metavar="{start,stop,status}")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument(
        "--idle-unload", type=float, default=DEFAULT_IDLE_UNLOAD_S, metavar="SECONDS",
        help=f"unload the model after this long without work; 0 never (default {DEFAULT_IDLE_UNLOAD_S:.0f})",
    )
    parser.add_argument("--ready-fd", type=int, default=None, help=argparse.SUPPRESS)
    # None = not given: `status` and `stop` then match every value; `start` and `serve` use the defaults.
    parser.set_defaults(model=None, quantization=None)


def run(args: argparse.Namespace) -> int:
    try:
        if args.action == "serve":
            key, paths = _chosen(args)
            from dgemma_lsp.engine.daemon.host import run_daemon

            return run_daemon(key, paths, idle_unload=args.idle_unload or None, transport=default_transport(),
                              ready_fd=args.ready_fd)
        if args.action == "start":
            return _start(*_chosen(args), args)
        engines = _matching(running_engines(), args)
        return {"stop": _stop, "status": _status}[args.action](engines, args)
    except (PermissionError, errors.EngineError) as error:
        return _fail(str(error))


def _chosen(args) -> tuple[EngineKey, EnginePaths]:
    key = engine_key(args.model or DEFAULT_MODEL_ID, args.device, args.dtype, args.quantization)
    return key, EnginePaths.for_key(key)


def _matching(engines: list[RunningEngine], args) -> list[RunningEngine]:
    """The engines whose key matches every option given (all of them when none is)."""
    wanted = {
        "model": engine_key(args.model).model if args.model else None,
        "device": args.device, "dtype": args.dtype, "quantization": args.quantization,
    }
    wanted = {field: value for field, value in wanted.items() if value is not None}
    if not wanted:
        return engines
    return [e for e in engines
            if e.key is not None and all(getattr(e.key, field) == value for field, value in wanted.items())]


def _start(key, paths: EnginePaths, args) -> int:
    try:
        info = asyncio.run(query_info(key, paths))
        started = False
    except DaemonNotRunningError:
        spawn_daemon(key, paths, idle_unload=args.idle_unload or None, log_level=_daemon_log_level(args))
        asyncio.run(send_load(key, paths))
        info = asyncio.run(query_info(key, paths))
        started = True
    if args.json:
        _write_json({"running": True, "started": started, **_info_dict(info)})
    else:
        verb = "started" if started else "already running:"
        sys.stdout.write(f"engine daemon {verb} pid {info.pid}, {info.socket} (log: {info.log_file})\n")
    return 0


def _stop(engines: list[RunningEngine], args) -> int:
    stopped = []
    for engine in engines:
        pid = _stop_one(engine)
        if pid is not None:
            stopped.append({**_key_dict(engine), "pid": pid, "stopped": True})
    if args.json:
        _write_json(stopped)
    elif not stopped:
        sys.stdout.write(f"no engine daemon is running{_for_what(args)}\n")
    for entry in [] if args.json else stopped:
        sys.stdout.write(f"engine daemon pid {entry['pid']} ({entry['model'] or 'unknown model'}) stopped\n")
    return 0


def _stop_one(engine: RunningEngine) -> int | None:
    """Stop one daemon; its pid, or None when it was already gone."""
    if engine.key is not None:
        try:
            return asyncio.run(request_shutdown(engine.key, engine.paths))
        except DaemonNotRunningError:
            if not lock_is_held(engine.paths.pid_lock):
                return None  # it exited between the scan and now
        except (DaemonRefusedError, ProtocolError):
            pass  # another protocol version: it cannot be asked, so it is told (below)
    # No key to shake hands with, or a daemon that will not talk to us: SIGTERM, which every
    # version handles like Shutdown, and wait for its pid lock to go with the process.
    if engine.pid <= 0:
        return None
    try:
        os.kill(engine.pid, signal.SIGTERM)
    except ProcessLookupError:
        return None
    deadline = time.monotonic() + CANCEL_GRACE_S
    while lock_is_held(engine.paths.pid_lock) and time.monotonic() < deadline:
        time.sleep(0.05)
    return engine.pid


def _status(engines: list[RunningEngine], args) -> int:
    found = [info for info in (_describe(engine) for engine in engines) if info is not None]
    if args.json:
        _write_json(found)
    elif not found:
        sys.stdout.write(f"no engine daemon is running{_for_what(args)}\n")
    for info in [] if args.json else found:
        sys.stdout.write(_status_text(info))
    return 0 if found else NOT_RUNNING


def _describe(engine: RunningEngine) -> dict | None:
    """What one running daemon reports, or the little its files say when it cannot be asked."""
    if engine.key is not None:
        try:
            return {"running": True, **_info_dict(asyncio.run(query_info(engine.key, engine.paths)))}
        except DaemonNotRunningError:
            if not lock_is_held(engine.paths.pid_lock):
                return None  # it exited between the scan and now
            message = "not answering yet (starting up?)"
        except (DaemonRefusedError, ProtocolError) as error:
            message = str(error)
    else:
        message = "starting up, or another version of dgemma-lsp: `engine stop` ends it"
    return {"running": True, **_key_dict(engine), "pid": engine.pid, "state": "unknown", "message": message,
            "logFile": str(engine.paths.log)}


def _status_text(info: dict) -> str:
    if info["state"] == "unknown":
        return f"engine daemon pid {info['pid']}: {info['message']}\n  log       {info['logFile']}\n"
    memory = f"{info['memory'] / 2**20:.1f} MiB" if info["memory"] else "not loaded"
    detail = f" ({info['message']})" if info["message"] else ""
    return (
        f"engine daemon pid {info['pid']}: {info['state']}{detail}\n"
        f"  model     {info['model']} on {info['device']} ({info['dtype']}, {info['quantization']}), "
        f"loaded {info['loads']}x, {memory}\n"
        f"  clients   {info['clients']}  queue {info['queue']}  running {info['runningJobs']}\n"
        f"  prompt cache {info.get('promptCacheBytes', 0) / 2**20:.1f} MiB\n"
        f"  uptime    {info['uptime']:.0f} s  idle unload {info['idleUnload'] or 'never'}\n"
        f"  standby   {('pid ' + str(info['standbyPid'])) if info.get('standbyPid') else 'none'}\n"
        f"  socket    {info['socket']}\n  log       {info['logFile']}\n"
    )


def _key_dict(engine: RunningEngine) -> dict:
    key = engine.key
    if key is None:
        return {"model": None, "device": None, "dtype": None, "quantization": None}
    return {"model": key.model, "device": key.device, "dtype": key.dtype, "quantization": key.quantization}


def _for_what(args) -> str:
    given = [f"{name} {value}" for name, value in (("model", args.model), ("device", args.device),
                                                   ("dtype", args.dtype), ("quantization", args.quantization))
             if value is not None]
    return f" for {', '.join(given)}" if given else ""


def _info_dict(info) -> dict:
    import msgspec

    return msgspec.to_builtins(info)


def _write_json(data) -> None:
    sys.stdout.write(json.dumps(data, indent=2) + "\n")


def _daemon_log_level(args) -> str:
    # The CLI's own default (WARNING) would leave the daemon's log nearly empty; INFO tells its story.
    return "INFO" if args.log_level == "WARNING" else args.log_level


def _fail(message: str) -> int:
    sys.stderr.write(f"dgemma-lsp engine: {message}\n")
    return 1
