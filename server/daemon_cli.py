"""`dgemma-lsp engine start|stop|status [--json]`: the resident engine daemon from a shell.

One daemon serves one (model, device, dtype, quantization): the usual --model,
--device, --dtype and --quantization options choose which one these actions
act on (default: the tiny model). `start` spawns it detached (it logs to
`engine-*.log` in the runtime dir) and asks it to load the model; `stop` asks
it to finish and exit; `status` prints what it is doing (`--json`: the
DaemonInfo fields, plus `running`). The hidden action `serve` is the daemon
process itself, run by `start` and by language servers that find no daemon.

Exit codes: 0 done; 1 failure; 3 `status` found no daemon.
Knows argparse and the daemon client; the daemon process imports the engine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

from dgemma_lsp.engine import errors
from dgemma_lsp.engine.daemon.client import (
    DEFAULT_IDLE_UNLOAD_S,
    DaemonNotRunningError,
    query_info,
    request_shutdown,
    send_load,
    spawn_daemon,
)
from dgemma_lsp.engine.daemon.paths import EnginePaths, default_transport, engine_key

NOT_RUNNING = 3


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=["start", "stop", "status", "serve"], metavar="{start,stop,status}")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument(
        "--idle-unload", type=float, default=DEFAULT_IDLE_UNLOAD_S, metavar="SECONDS",
        help=f"unload the model after this long without work; 0 never (default {DEFAULT_IDLE_UNLOAD_S:.0f})",
    )
    parser.add_argument("--ready-fd", type=int, default=None, help=argparse.SUPPRESS)


def run(args: argparse.Namespace) -> int:
    key = engine_key(args.model, args.device, args.dtype, args.quantization)
    try:
        paths = EnginePaths.for_key(key)
    except PermissionError as error:
        return _fail(str(error))
    if args.action == "serve":
        from dgemma_lsp.engine.daemon.host import run_daemon

        return run_daemon(key, paths, idle_unload=args.idle_unload or None, transport=default_transport(),
                          ready_fd=args.ready_fd)
    try:
        return {"start": _start, "stop": _stop, "status": _status}[args.action](key, paths, args)
    except errors.EngineError as error:
        return _fail(str(error))


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


def _stop(key, paths: EnginePaths, args) -> int:
    try:
        pid = asyncio.run(request_shutdown(key, paths))
    except DaemonNotRunningError:
        if args.json:
            _write_json({"running": False, "stopped": None})
        else:
            sys.stdout.write("no engine daemon is running for this model\n")
        return 0
    if args.json:
        _write_json({"running": False, "stopped": pid})
    else:
        sys.stdout.write(f"engine daemon pid {pid} stopped\n")
    return 0


def _status(key, paths: EnginePaths, args) -> int:
    try:
        info = asyncio.run(query_info(key, paths))
    except DaemonNotRunningError:
        if args.json:
            _write_json({"running": False, "model": key.model, "socket": str(paths.socket)})
        else:
            sys.stdout.write(f"no engine daemon is running for {key.model}\n")
        return NOT_RUNNING
    if args.json:
        _write_json({"running": True, **_info_dict(info)})
        return 0
    memory = f"{info.memory / 2**20:.1f} MiB" if info.memory else "not loaded"
    sys.stdout.write(
        f"engine daemon pid {info.pid}: {info.state}{' (' + info.message + ')' if info.message else ''}\n"
        f"  model     {info.model} on {info.device} ({info.quantization}), loaded {info.loads}x, {memory}\n"
        f"  clients   {info.clients}  queue {info.queue}  running {info.running_jobs}\n"
        f"  prompt cache {info.prompt_cache_bytes / 2**20:.1f} MiB\n"
        f"  uptime    {info.uptime:.0f} s  idle unload {info.idle_unload or 'never'}\n"
        f"  socket    {info.socket}\n  log       {info.log_file}\n"
    )
    return 0


def _info_dict(info) -> dict:
    import msgspec

    return msgspec.to_builtins(info)


def _write_json(data: dict) -> None:
    sys.stdout.write(json.dumps(data, indent=2) + "\n")


def _daemon_log_level(args) -> str:
    # The CLI's own default (WARNING) would leave the daemon's log nearly empty; INFO tells its story.
    return "INFO" if args.log_level == "WARNING" else args.log_level


def _fail(message: str) -> int:
    sys.stderr.write(f"dgemma-lsp engine: {message}\n")
    return 1
