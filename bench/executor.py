"""Runs untrusted Python programs (model output) for pass@1 scoring, one subprocess each.

Each program runs in a fresh `python -I` in its own empty temporary directory,
with a wall-clock time limit (the whole process group is killed), rlimits on
CPU time, address space, file size, open files and processes, no core dumps,
and a minimal environment. Network: where unprivileged namespaces work the
child runs under `unshare -rn` (a network namespace with no interfaces);
everywhere an audit hook, installed before the program runs and impossible to
remove from Python, refuses sockets, new processes, signals to other
processes, and writes/deletes outside the temporary directory.

This is a guard against accidents in generated code (an infinite loop, a
memory blow-up, a stray `rm`), not a security boundary against a determined
attacker: ctypes could bypass the audit hook. Knows nothing of models or
HumanEval: it takes a program text and says whether it exited cleanly.
"""

from __future__ import annotations

import functools
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Literal

import msgspec

Outcome = Literal["passed", "failed", "timeout"]

DEFAULT_TIMEOUT_S = 10.0
"""Wall clock per program. HumanEval's own harness uses 3 s on an idle machine;
this machine is shared, and a slow canonical solution must not count as a failure."""

MEMORY_LIMIT_BYTES = 2 * 1024**3
FILE_SIZE_LIMIT_BYTES = 16 * 1024**2
OPEN_FILES_LIMIT = 64
PROCESS_LIMIT = 64

# Runs in the child before the program. An audit hook cannot be removed once added,
# so the program inherits it for good. It must stay self-contained (no imports of ours).
_GUARD = r'''
import os, resource, sys
for _limit, _value in LIMITS:
    resource.setrlimit(_limit, (_value, _value))
_root = os.path.realpath(os.getcwd())
_blocked = {
    "socket.__new__", "socket.connect", "socket.bind", "socket.getaddrinfo", "socket.sendto",
    "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty",
    "subprocess.Popen", "os.kill", "os.killpg", "pty.spawn", "ctypes.dlopen", "resource.setrlimit",
}
_path_events = {"os.remove", "os.rmdir", "os.rename", "shutil.rmtree", "os.chmod", "os.chown",
                "os.truncate", "os.mkdir", "os.symlink", "os.link", "os.utime"}
_write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC

def _inside(path):
    if isinstance(path, int):
        return True
    try:
        real = os.path.realpath(os.fsdecode(path))
    except Exception:
        return False
    return real == _root or real.startswith(_root + os.sep)

def _guard(event, args):
    if event in _blocked:
        raise PermissionError(f"sandbox: {event} is not allowed")
    if event == "open" and len(args) >= 3 and args[0] is not None:
        mode, flags = args[1] or "", args[2] or 0
        writes = any(c in mode for c in "wax+") or (flags & _write_flags)
        if writes and not _inside(args[0]):
            raise PermissionError(f"sandbox: writing {args[0]!r} is not allowed")
    elif event in _path_events and args and not _inside(args[0]):
        raise PermissionError(f"sandbox: {event} outside the sandbox is not allowed")

sys.addaudithook(_guard)
del _guard
with open("program.py", encoding="utf-8") as _file:
    _source = _file.read()
_namespace = {"__name__": "__main__", "__builtins__": __builtins__}
exec(compile(_source, "program.py", "exec"), _namespace)
'''


class ExecutionResult(msgspec.Struct, frozen=True, kw_only=True):
    """How one program ended."""

    outcome: Outcome
    """passed: exit status 0 within the time limit; failed: anything else; timeout: killed."""
    seconds: float
    """Wall time of the child."""
    detail: str = ""
    """Last line of stderr for a failure (the exception), empty otherwise."""


@functools.cache
def network_namespace_prefix() -> tuple[str, ...]:
    """`unshare -rn` when this machine allows unprivileged network namespaces, else nothing."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return ()
    try:
        probe = subprocess.run([unshare, "-rn", "true"], capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return ()
    return (unshare, "-rn") if probe.returncode == 0 else ()


def _guard_script(timeout_s: float) -> str:
    """The child's bootstrap with its rlimits filled in.

    The limits are set by the child itself, not in a preexec_fn: preexec_fn is
    unsafe in a threaded parent, and run_programs uses threads.
    """
    cpu = int(timeout_s) + 1
    limits = [
        (resource.RLIMIT_CPU, cpu),
        (resource.RLIMIT_AS, MEMORY_LIMIT_BYTES),
        (resource.RLIMIT_FSIZE, FILE_SIZE_LIMIT_BYTES),
        (resource.RLIMIT_NOFILE, OPEN_FILES_LIMIT),
        (resource.RLIMIT_CORE, 0),
        # The audit hook already refuses new processes; this also holds for non-root users.
        (resource.RLIMIT_NPROC, PROCESS_LIMIT),
    ]
    return _GUARD.replace("LIMITS", repr(limits), 1)


def run_program(source: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> ExecutionResult:
    """Run `source` as __main__ in a sandboxed child and report how it ended."""
    import time

    with tempfile.TemporaryDirectory(prefix="dgemma-exec-") as workdir:
        with open(os.path.join(workdir, "program.py"), "w", encoding="utf-8") as file:
            file.write(source)
        command = [*network_namespace_prefix(), sys.executable, "-I", "-B", "-c", _guard_script(timeout_s)]
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONHASHSEED": "0"}
        started = time.perf_counter()
        child = subprocess.Popen(
            command,
            cwd=workdir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,  # its own process group, killed as a whole on timeout
        )
        try:
            _, stderr = child.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(child)
            return ExecutionResult(outcome="timeout", seconds=time.perf_counter() - started)
        seconds = time.perf_counter() - started
    if child.returncode == 0:
        return ExecutionResult(outcome="passed", seconds=seconds)
    lines = stderr.decode("utf-8", "replace").strip().splitlines()
    return ExecutionResult(outcome="failed", seconds=seconds, detail=lines[-1][:200] if lines else "")


def _kill_group(child: subprocess.Popen) -> None:
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    child.communicate()


def run_programs(
    sources: Iterable[str], timeout_s: float = DEFAULT_TIMEOUT_S, workers: int | None = None
) -> list[ExecutionResult]:
    """Run many programs, `workers` at a time (default: the CPU count), results in input order."""
    workers = workers or os.cpu_count() or 1
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(functools.partial(run_program, timeout_s=timeout_s), sources))
