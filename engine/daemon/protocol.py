"""The resident engine's wire protocol: message Structs and length-prefixed msgpack frames.

A frame is a 4-byte big-endian payload length followed by one msgpack-encoded
message. Messages are frozen msgspec Structs in two tagged unions (field
`type`): what a client sends (`ClientMessage`) and what the daemon sends
(`DaemonMessage`). They carry the engine's public types (DenoiseRequest,
Draft, DenoiseResult, EngineStatus) unchanged.

A connection opens with `Hello` (protocol version, token, the model the client
wants); the daemon answers `Welcome` or `Refused` and closes. Anything that is
not a whole, well-formed frame of the expected union raises ProtocolError: the
peer closes that one connection and serves the others.

Knows msgspec and the engine's types; reads frames from any async `read(n)` (a
StreamReader's), and knows nothing of sockets, torch or LSP.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Callable
from typing import Literal

import msgspec

from ..api import DenoiseRequest, DenoiseResult, Draft, EngineStatus
from ..errors import EngineError

PROTOCOL_VERSION = 2
"""Bumped on any incompatible change; a mismatch is refused at the handshake.
2: Forget and PromptCacheBudget; EngineStatus.progress / prompt_cache_bytes; DaemonInfo.prompt_cache_bytes."""

MAX_FRAME_BYTES = 16 * 1024 * 1024
"""Largest payload accepted. Requests carry a context cut to a token budget, so
real frames are kilobytes; anything bigger is a bug or an attack."""

HEADER_BYTES = 4
READ_CHUNK = 64 * 1024


class ProtocolError(EngineError):
    """A malformed, oversized or unexpected frame: the connection that sent it is closed."""


class DaemonRefusedError(EngineError):
    """The daemon refused the handshake (wrong token, protocol version or model)."""


class EngineKey(msgspec.Struct, frozen=True, kw_only=True):
    """Which engine a daemon serves: one daemon per (model, device, dtype, quantization)."""

    model: str
    """Model spec, normalized (`tiny`, an absolute folder, or a hub id)."""
    device: str = "auto"
    """torch device asked for; `auto` is CUDA if present, else CPU."""
    dtype: str = "auto"
    """torch dtype asked for; `auto` follows the device."""
    quantization: str = "none"
    """Weight-only quantization at load time."""


# -- client -> daemon ----------------------------------------------------------------


class Hello(msgspec.Struct, frozen=True, kw_only=True, tag="hello"):
    """First frame of every connection."""

    version: int
    """The client's PROTOCOL_VERSION."""
    token: str
    """The secret from the daemon's token file (proves the client runs as the same user)."""
    engine: EngineKey
    """The engine the client wants; a daemon serving another refuses."""
    pid: int = 0
    """The client's process id (shown by `engine status`)."""
    name: str = ""
    """What the client is (`lsp`, `cli`), for logs and status."""


class Submit(msgspec.Struct, frozen=True, kw_only=True, tag="submit"):
    """Queue one denoising job; the answer is Result or Failed with the same id."""

    id: int
    """Client-chosen job id, unique per connection."""
    request: DenoiseRequest
    """The job; its priority orders the daemon's queue."""
    drafts: bool = True
    """Stream a DraftFrame after every step; False: the engine makes no drafts at all."""


class Cancel(msgspec.Struct, frozen=True, kw_only=True, tag="cancel"):
    """Cancel a job: dropped if queued, stopped within one step if running (answered by Failed)."""

    id: int
    """The job to cancel."""


class Load(msgspec.Struct, frozen=True, tag="load"):
    """Load the model now if it is not resident (no answer; watch StatusFrame)."""

    force: bool = False
    """Reload: drop a resident model and load again, ignoring a failed load's backoff (`dgemma.reloadModel`)."""


class InfoQuery(msgspec.Struct, frozen=True, kw_only=True, tag="info"):
    """Ask for DaemonInfo (answered by InfoFrame with the same id)."""

    id: int
    """Client-chosen id echoed in the answer."""


class Shutdown(msgspec.Struct, frozen=True, tag="shutdown"):
    """Stop the daemon: cancel all work, close every connection, exit."""


class Forget(msgspec.Struct, frozen=True, kw_only=True, tag="forget"):
    """A document was closed: free what the engine keeps for it (its prompt-cache snapshot). No answer."""

    document: str
    """The document's prompt cache key (DenoiseRequest.cache_key: its URI)."""


class PromptCacheBudget(msgspec.Struct, frozen=True, kw_only=True, tag="prompt-cache-budget"):
    """Bound the engine's prompt cache (shared by every client: the last one sent wins). No answer."""

    max_bytes: int | None
    """Bytes of snapshots the engine may keep; None sizes it from the memory free after loading."""


ClientMessage = Hello | Submit | Cancel | Load | InfoQuery | Shutdown | Forget | PromptCacheBudget


# -- daemon -> client ----------------------------------------------------------------


class DaemonInfo(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """What `dgemma-lsp engine status --json` prints."""

    pid: int
    """The daemon's process id."""
    socket: str
    """Where it listens: a Unix socket path, or `tcp://127.0.0.1:PORT`."""
    model: str
    """Model spec it serves."""
    device: str
    """torch device of the loaded model (the requested one while unloaded)."""
    dtype: str
    """torch dtype asked for."""
    quantization: str
    """Weight-only quantization."""
    state: str
    """Engine lifecycle state (EngineStatus.state)."""
    message: str
    """Detail of the state, e.g. why loading failed."""
    memory: int
    """Bytes of parameters and buffers resident for the model (0 while unloaded)."""
    clients: int
    """Connections that completed the handshake (not counting the one that asks)."""
    client_pids: list[int]
    """Their process ids."""
    queue: int
    """Jobs waiting (not counting the running one)."""
    running_jobs: int
    """Jobs running now (0 or 1)."""
    loads: int
    """How many times the model was loaded since the daemon started."""
    uptime: float
    """Seconds since the daemon started."""
    idle_unload: float | None
    """Seconds without work before the model is unloaded; None never."""
    last_latency_ms: float | None
    """Total time of the last finished job."""
    log_file: str
    """Where the daemon logs."""
    protocol: int
    """PROTOCOL_VERSION of the daemon."""
    standby_pid: int = 0
    """The process of its warm standby, which serves in its place if it is killed (0: none is kept)."""
    prompt_cache_bytes: int = 0
    """Bytes of prompt-cache snapshots kept on the model's device."""
    cancelled: int = 0
    """Jobs the engine stopped on a cancel before their last step (EngineStatus.cancelled)."""


class Welcome(msgspec.Struct, frozen=True, kw_only=True, tag="welcome"):
    """The handshake succeeded."""

    version: int
    """The daemon's PROTOCOL_VERSION."""
    pid: int
    """The daemon's process id."""
    status: EngineStatus
    """The engine's state now."""


class Refused(msgspec.Struct, frozen=True, kw_only=True, tag="refused"):
    """The handshake failed; the daemon closes the connection after this frame."""

    reason: str
    """One line for a person: what is wrong and what to do."""


class DraftFrame(msgspec.Struct, frozen=True, kw_only=True, tag="draft"):
    """One denoising step of a running job."""

    id: int
    """The job."""
    draft: Draft
    """The argmax canvas after this step."""


class Result(msgspec.Struct, frozen=True, kw_only=True, tag="result"):
    """A job finished."""

    id: int
    """The job."""
    result: DenoiseResult
    """The denoiser's answer."""


FailureKind = Literal["cancelled", "bad-request", "model-not-found", "model-load", "engine", "internal"]


class Failed(msgspec.Struct, frozen=True, kw_only=True, tag="failed"):
    """A job ended without a result."""

    id: int
    """The job."""
    kind: FailureKind
    """Which engine error it was (the client re-raises the matching type)."""
    message: str
    """One line for a person."""


class StatusFrame(msgspec.Struct, frozen=True, kw_only=True, tag="status"):
    """The engine's state changed (sent to every client)."""

    status: EngineStatus
    """The new state."""


class InfoFrame(msgspec.Struct, frozen=True, kw_only=True, tag="info"):
    """Answer to InfoQuery."""

    id: int
    """The query's id."""
    info: DaemonInfo
    """The daemon now."""


class Goodbye(msgspec.Struct, frozen=True, kw_only=True, tag="goodbye"):
    """The daemon is stopping on purpose (`engine stop`, SIGTERM): clients need not respawn it at once."""

    reason: str
    """Why, for a person."""


DaemonMessage = Welcome | Refused | DraftFrame | Result | Failed | StatusFrame | InfoFrame | Goodbye


# -- framing -------------------------------------------------------------------------

_encoder = msgspec.msgpack.Encoder()


def encode_frame(message: ClientMessage | DaemonMessage) -> bytes:
    """One frame: length header + msgpack payload."""
    payload = _encoder.encode(message)
    if len(payload) > MAX_FRAME_BYTES:
        raise ProtocolError(f"frame of {len(payload)} bytes exceeds the {MAX_FRAME_BYTES}-byte limit")
    return len(payload).to_bytes(HEADER_BYTES, "big") + payload


class FrameDecoder:
    """Incremental decoder: feed bytes as they arrive, get whole messages back.

    Raises ProtocolError for an oversized length header or a payload that is not
    a message of the expected union; after that the decoder is unusable (the
    connection must be closed: the stream has lost its frame boundaries).
    """

    def __init__(self, message_type, max_frame_bytes: int = MAX_FRAME_BYTES) -> None:
        self._decoder = msgspec.msgpack.Decoder(message_type)
        self._max = max_frame_bytes
        self._buffer = bytearray()
        self._broken = False
        self._ready: deque = deque()  # decoded by `next_message`, not yet handed out

    def feed(self, data: bytes) -> list:
        """Messages completed by `data` (possibly none), in order."""
        if self._broken:
            raise ProtocolError("the stream is already broken")
        self._buffer += data
        messages = []
        while len(self._buffer) >= HEADER_BYTES:
            length = int.from_bytes(self._buffer[:HEADER_BYTES], "big")
            if length > self._max:
                self._broken = True
                raise ProtocolError(f"frame of {length} bytes exceeds the {self._max}-byte limit")
            end = HEADER_BYTES + length
            if len(self._buffer) < end:
                break
            payload = bytes(self._buffer[HEADER_BYTES:end])
            del self._buffer[:end]
            try:
                messages.append(self._decoder.decode(payload))
            except (msgspec.DecodeError, msgspec.ValidationError) as error:
                self._broken = True
                raise ProtocolError(f"malformed frame: {error}") from None
        return messages

    async def next_message(self, read: Callable[[int], Awaitable[bytes]]):
        """The next message from the stream that `read(n)` reads, or None at its clean end.

        A stream that ends inside a frame raises ProtocolError.
        """
        while not self._ready:
            data = await read(READ_CHUNK)
            if not data:
                if self._buffer:
                    raise ProtocolError(f"connection closed inside a frame ({len(self._buffer)} bytes)")
                return None
            self._ready.extend(self.feed(data))
        return self._ready.popleft()

    @property
    def pending_bytes(self) -> int:
        """Bytes of an incomplete frame held back."""
        return len(self._buffer)


def client_decoder() -> FrameDecoder:
    """Decodes what a client sends (used by the daemon)."""
    return FrameDecoder(ClientMessage)


def daemon_decoder() -> FrameDecoder:
    """Decodes what the daemon sends (used by clients)."""
    return FrameDecoder(DaemonMessage)
