"""Where a resident engine lives on disk: runtime dir, per-engine file names, token, locks.

The runtime dir is `$DGEMMA_LSP_RUNTIME_DIR`, else `$XDG_RUNTIME_DIR/dgemma-lsp`,
else `/tmp/dgemma-lsp-$UID` (on Windows `%LOCALAPPDATA%\\dgemma-lsp\\run`); it
is created mode 0700 and refused when another user owns it or others can
write to it. One daemon serves one EngineKey (model, device, dtype,
quantization); its files are named `engine-<hash of the key>.*`:

  .sock   the Unix socket (mode 0600)                 .token  the shared secret (0600)
  .json   the endpoint (transport, address, pid, key) .log    the daemon's log
  .lock   held by whoever is spawning a daemon        .pid    held (flock) by the live daemon

Knows the filesystem and the OS; knows nothing of msgpack, torch or LSP.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import stat
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..model.tiny_model import BUILTIN_MODELS
from .protocol import EngineKey

RUNTIME_DIR_ENV = "DGEMMA_LSP_RUNTIME_DIR"
TRANSPORT_ENV = "DGEMMA_LSP_TRANSPORT"
"""`unix` (default where available) or `tcp` (loopback + token; the only choice on Windows)."""


ALREADY_RUNNING_EXIT = 3
"""`engine serve`'s exit status when another daemon (or a standby taking over) holds the engine's pid lock."""


def engine_key(model: str, device: str | None = None, dtype: str | None = None,
               quantization: str | None = None) -> EngineKey:
    """The key of the daemon serving these options; a local folder is made absolute."""
    if model not in BUILTIN_MODELS and Path(model).expanduser().exists():
        model = str(Path(model).expanduser().resolve())
    return EngineKey(model=model, device=device or "auto", dtype=dtype or "auto",
                     quantization=quantization or "none")


def default_transport() -> str:
    chosen = os.environ.get(TRANSPORT_ENV, "")
    if chosen in ("unix", "tcp"):
        return chosen
    return "tcp" if sys.platform == "win32" else "unix"


def runtime_dir() -> Path:
    """The per-user folder for sockets, tokens and logs, created 0700 and checked."""
    override = os.environ.get(RUNTIME_DIR_ENV)
    if override:
        path = Path(override)
    elif sys.platform == "win32":
        path = Path(os.environ.get("LOCALAPPDATA", tempfile.gettempdir())) / "dgemma-lsp" / "run"
    elif os.environ.get("XDG_RUNTIME_DIR"):
        path = Path(os.environ["XDG_RUNTIME_DIR"]) / "dgemma-lsp"
    else:
        path = Path(tempfile.gettempdir()) / f"dgemma-lsp-{os.getuid()}"
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    _check_private_dir(path)
    return path


def _check_private_dir(path: Path) -> None:
    if sys.platform == "win32":  # the user profile is private; POSIX modes mean little there
        return
    info = path.lstat()
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise PermissionError(f"{path} is not a directory: refusing to use it as the runtime dir")
    if info.st_uid != os.getuid():
        raise PermissionError(f"{path} belongs to uid {info.st_uid}, not to you: refusing to use it")
    if stat.S_IMODE(info.st_mode) != 0o700:
        os.chmod(path, 0o700)  # ours but too open (e.g. an old umask): tighten it


@dataclass(frozen=True)
class EnginePaths:
    """The files of one daemon."""

    folder: Path
    stem: str

    @classmethod
    def for_key(cls, key: EngineKey, folder: Path | None = None) -> EnginePaths:
        # A hash keeps the socket path under the ~100-byte AF_UNIX limit whatever the model path.
        digest = hashlib.sha256(
            "\0".join((key.model, key.device, key.dtype, key.quantization)).encode()
        ).hexdigest()[:12]
        return cls(folder or runtime_dir(), f"engine-{digest}")

    def _file(self, suffix: str) -> Path:
        return self.folder / f"{self.stem}{suffix}"

    socket = property(lambda self: self._file(".sock"))
    endpoint = property(lambda self: self._file(".json"))
    token = property(lambda self: self._file(".token"))
    log = property(lambda self: self._file(".log"))
    spawn_lock = property(lambda self: self._file(".lock"))
    pid_lock = property(lambda self: self._file(".pid"))


@dataclass(frozen=True)
class RunningEngine:
    """A live daemon found in the runtime dir."""

    paths: EnginePaths
    pid: int
    """From its pid file (0 when unreadable)."""
    key: EngineKey | None
    """What it serves, from its endpoint file; None while it starts up or when an older
    version wrote the file (it can still be stopped by its pid)."""


def running_engines(folder: Path | None = None) -> list[RunningEngine]:
    """Every daemon of this user alive now (one whose pid lock is held), in file-name order."""
    engines = []
    for pid_file in sorted((folder or runtime_dir()).glob("engine-*.pid")):
        if not lock_is_held(pid_file):
            continue  # a daemon that exited (or was killed) leaves its files: not running
        paths = EnginePaths(pid_file.parent, pid_file.stem)
        engines.append(RunningEngine(paths, _read_pid(pid_file), _read_key(paths.endpoint)))
    return engines


def _read_pid(path: Path) -> int:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def _read_key(endpoint: Path) -> EngineKey | None:
    try:
        fields = json.loads(endpoint.read_text())["engine"]
        return EngineKey(**{name: str(fields[name]) for name in ("model", "device", "dtype", "quantization")})
    except (OSError, ValueError, KeyError, TypeError):
        return None


def write_private(path: Path, text: str) -> None:
    """Replace `path` with `text`, readable by this user only (0600 from creation on)."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    os.replace(temporary, path)


def new_token() -> str:
    return secrets.token_urlsafe(32)


def read_token(path: Path) -> str:
    """The daemon's secret; empty when there is no token file (the handshake then fails clearly)."""
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        return ""


class FileLock:
    """An exclusive advisory lock on a file, released on close or process death."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def acquire(self, blocking: bool = True) -> bool:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            if not _lock_fd(fd, blocking):
                os.close(fd)
                return False
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        return True

    def write(self, text: str) -> None:
        assert self._fd is not None, "write to a lock you do not hold"
        os.ftruncate(self._fd, 0)
        os.lseek(self._fd, 0, os.SEEK_SET)
        os.write(self._fd, text.encode())

    def fileno(self) -> int:
        assert self._fd is not None, "the descriptor of a lock you do not hold"
        return self._fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the lock
            self._fd = None

    def __enter__(self) -> FileLock:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def lock_is_held(path: Path) -> bool:
    """Whether some live process holds the lock at `path` (false when the file is absent)."""
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        return False
    try:
        if _lock_fd(fd, blocking=False):
            return False  # we got it, so nobody held it (closing releases it again)
        return True
    finally:
        os.close(fd)


if sys.platform == "win32":
    import msvcrt

    def _lock_fd(fd: int, blocking: bool) -> bool:
        try:
            msvcrt.locking(fd, msvcrt.LK_LOCK if blocking else msvcrt.LK_NBLCK, 1)
        except OSError:
            if blocking:
                raise
            return False
        return True

else:
    import fcntl

    def _lock_fd(fd: int, blocking: bool) -> bool:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            return False
        return True
