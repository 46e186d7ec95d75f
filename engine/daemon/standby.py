"""A warm standby for the engine daemon: a forked copy, its imports done, that serves when the daemon dies.

Why: a daemon killed outright (the OOM killer, a crash inside a kernel, `kill -9`) is replaced
by the front ends, and a fresh process spends most of its way back importing torch and
transformers (`bench respawn` splits a respawn in phases). So the daemon imports them once,
before it serves (`warm_imports`), and forks a standby (`start`): a copy-on-write child that
shares those pages and sleeps until the daemon's end of a pipe closes, which the kernel does
however the daemon dies. It then takes the daemon's pid lock, forks a standby of its own and
serves in its place; the front ends find it listening when they reconnect. A daemon that stops
on purpose (idle with no clients, `engine stop`, a signal) stops its standby first
(`Standby.stop`), so a standby never outlives a daemon that meant to go.

Fork is safe here only because it happens before any thread, event loop, socket or lock
exists in the daemon, and before CUDA is touched: torch's CUDA check is made through NVML
(`PYTORCH_NVML_BASED_CUDA_CHECK`, torch's documented fork-safe check), so importing never
initialises the driver in the daemon, and the standby initialises it for itself when it loads
the model. Linux only; elsewhere the front ends respawn a daemon as before. Knows os, signals
and the pid lock; knows nothing of the protocol or the model.
"""

from __future__ import annotations

import gc
import logging
import os
import select
import signal
import sys
import time
from dataclasses import dataclass

from .paths import EnginePaths, FileLock

log = logging.getLogger(__name__)

TAKEOVER_WAIT_S = 2.0
"""How long a woken standby tries for the pid lock (the dead daemon's is dropped within moments);
if another daemon holds it after that, a front end started one first and the standby leaves."""


def supported() -> bool:
    return sys.platform.startswith("linux") and hasattr(os, "fork")


def warm_imports() -> None:
    """Import what loading and serving a model imports, so that a forked standby has it too."""
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")  # before torch: its CUDA check never inits the driver
    # transformers' generate calls torch.compiler.cudagraph_mark_step_begin() every step, and the first call
    # imports inductor's graph trees (about a fifth of the import time): imported here, not in a request.
    import torch._inductor.cudagraph_trees  # noqa: F401

    from ..runtime import denoising, service  # noqa: F401  transformers and the model classes come with them
    from ..weights import loading, text_model  # noqa: F401

    gc.collect()
    gc.freeze()  # the collector no longer writes to these objects: their pages stay shared with the standby


def thaw() -> None:
    """Undo `warm_imports`' freeze before the interpreter exits: its final collection then frees those objects
    (frozen, they would be reported as leaked by the extension modules that check, triton's among them)."""
    gc.unfreeze()


@dataclass
class Standby:
    """The daemon's handle on its standby: the child's pid and the pipe end whose closing wakes it."""

    pid: int
    wake_fd: int

    def stop(self) -> None:
        """End the standby (the daemon stops on purpose): it must not serve after us."""
        try:
            os.kill(self.pid, signal.SIGKILL)  # it runs no code worth a clean exit: it only waits
            os.waitpid(self.pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
        try:
            os.close(self.wake_fd)
        except OSError:
            pass


def start(paths: EnginePaths, *, close_in_child: tuple[int, ...] = ()) -> tuple[Standby | None, FileLock | None]:
    """Fork a standby. In the daemon: (its handle, None). In the standby: returns only when it is to serve
    in a dead daemon's place, with (its own new standby, the pid lock it now holds); when it is not
    needed, it exits without returning.

    `close_in_child`: descriptors only this process may keep (the spawner's ready pipe)."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid:
        os.close(read_fd)
        log.info("standby pid %d is ready to take over", pid)
        return Standby(pid, write_fd), None
    try:  # the standby
        os.close(write_fd)
        for fd in close_in_child:
            try:
                os.close(fd)
            except OSError:
                pass
        _wait_for_the_daemons_end(read_fd)
        pid_lock = _take_the_lock(paths)
        if pid_lock is None:
            os._exit(0)
        log.warning("the engine daemon ended; standby pid %d takes over", os.getpid())
        # Before any thread: the next standby is forked from a clean process. It must not keep our lock's
        # descriptor (a flock is dropped only when every copy is closed), nor our wake pipe.
        successor, _ = start(paths, close_in_child=(pid_lock.fileno(),))
        return successor, pid_lock
    except BaseException:  # noqa: BLE001 - nothing of the daemon's may run in a standby that failed
        log.exception("the standby failed")
        os._exit(1)


def _wait_for_the_daemons_end(read_fd: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C in the daemon's terminal is the daemon's to handle
    while True:
        readable, _, _ = select.select([read_fd], [], [])
        if readable and not os.read(read_fd, 1):  # end of file: the daemon's process is gone
            os.close(read_fd)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            return


def _take_the_lock(paths: EnginePaths) -> FileLock | None:
    """The dead daemon's pid lock, once the kernel has dropped it; None when another daemon holds it."""
    deadline = time.monotonic() + TAKEOVER_WAIT_S
    lock = FileLock(paths.pid_lock)
    while not lock.acquire(blocking=False):
        if time.monotonic() > deadline:
            log.info("another engine daemon holds the lock: the standby is not needed")
            return None
        time.sleep(0.005)
    return lock
