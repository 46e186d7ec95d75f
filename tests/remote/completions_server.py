"""A real HTTP server implementing the subset of vLLM's OpenAI-compatible API that engine/remote uses.

`GET /v1/models` (one model card: `id` the served name, `root` the checkpoint, as vLLM
lists a `--served-model-name` alias) and `POST /v1/completions` (streamed as server-sent events or
not; `model`, `prompt`, `max_tokens`, `n`, `seed`, `logprobs`, `stream`,
`stream_options.include_usage`, `add_special_tokens`; `suffix` rejected with
400 as vLLM does for DiffusionGemma; `Authorization: Bearer` when a key is set).
Answers come from the real tiny DiffusionGemma through our DenoisingRuntime:
the prompt text is tokenized as vLLM does (the tokenizer, `add_special_tokens`
honoured) and denoised by `DenoisingRuntime.run`, whose prompt builder is
swapped for one that takes the text verbatim. Like vLLM for this model, the
denoising steps are server-wide (`steps`), and a stream carries only finished
canvases: one event per canvas per choice (the runtime's text, split in as
many pieces as it denoised canvases), then usage, then `[DONE]`.

Logprobs: the runtime exposes one confidence per candidate (the mean top-token
probability), not per-token values; each token of a choice carries log(that
confidence), so a client's mean of exp(logprob) recovers exactly the runtime's
figure. Said here so nobody takes them for vLLM's per-token values.

Why the stdlib (`ThreadingHTTPServer`, HTTP/1.1 keep-alive, chunked bodies)
rather than aiohttp or starlette: it adds no dependency, one thread per
connection matches a blocking model call, and it exposes the socket, so a
client that goes away mid-denoise is noticed (EOF on the socket) and the
runtime is cancelled, the way vLLM aborts a request whose client disconnected.

`Behaviour` holds the faults tests switch on: HTTP errors, malformed streams,
a dropped connection, delays (a slow server). `stop()` closes the listening
socket and every open connection (the server is down); `start()` again on the
same port brings it back.
"""

from __future__ import annotations

import asyncio
import json
import math
import select
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from dgemma_lsp.engine.api import DenoiseRequest, GenerationSettings, InfillContext
from dgemma_lsp.engine.errors import CancelledError
from dgemma_lsp.engine.model.prompting import PromptIds


@dataclass
class Behaviour:
    """What the server does wrong (or slowly); tests change it while the server runs."""

    fail_status: int | None = None
    """Answer the next `fail_count` completion requests with this HTTP status."""
    fail_count: int = 0
    probe_status: int | None = None
    """Answer GET /models with this status (e.g. 503 while "down")."""
    malformed: str | None = None
    """One completion answered wrongly: "json" (a broken event), "no-done" (ends without [DONE]),
    "content-type" (JSON instead of a stream), "drop" (connection closed mid-stream)."""
    first_byte_delay: float = 0.0
    """Seconds before the answer starts (a queue on a busy server)."""
    chunk_delay: float = 0.0
    """Seconds between two events of a stream."""
    steps: int = 2
    """Denoising steps per canvas, server-wide (vLLM's --diffusion-config)."""


@dataclass
class Counters:
    completions: int = 0
    """POST /completions requests received."""
    completed: int = 0
    """Completions answered in full. Counted after the last byte is written, so a client
    that returns at `[DONE]` can run ahead of it: read it with `CompletionsServer.counted`."""
    disconnected: int = 0
    """Streams the client closed before their end."""
    aborted: int = 0
    """Denoising runs cancelled because the client went away."""
    probes: int = 0
    """GET /models requests received."""
    connections: int = 0
    """TCP connections accepted (keep-alive: fewer than requests)."""
    bodies: list[dict] = field(default_factory=list)
    """Every completion request body, in order."""


class VerbatimPrompt:
    """A PromptBuilder stand-in: the 'context' prefix is already the whole prompt text."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer

    def build(self, context: InfillContext, *, rewrite: bool = False, original: str | None = None,
              layout: str | None = None, edits: str | None = None) -> PromptIds:
        ids = self.tokenizer(context.prefix, add_special_tokens=False)["input_ids"]
        return PromptIds(stable=[], tail=ids)


class CompletionsServer:
    """The tiny model behind the API subset, on 127.0.0.1, one model call at a time (one GPU)."""

    def __init__(self, runtime, *, model: str = "tiny-random", api_key: str | None = None) -> None:
        self.runtime = runtime
        self.model = model
        """The served name (vLLM's --served-model-name, else the checkpoint)."""
        self.root: str | None = None
        """The checkpoint listed as the model card's `root`; None: the served name itself, as vLLM does."""
        self.api_key = api_key
        self.behaviour = Behaviour()
        self.counters = Counters()
        self.streaming = threading.Event()
        """Set when a stream has sent its first event."""
        self.denoising = threading.Event()
        """Set when a model call starts."""
        self.port = 0
        self._model_lock = threading.Lock()
        self._lock = threading.Lock()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._connections: set[socket.socket] = set()
        runtime.prompts = VerbatimPrompt(runtime.tokenizer)

    async def counted(self, name: str, value: int, seconds: float = 60.0) -> None:
        """Waits until counter `name` reads `value`; the handler thread counts after its last write."""
        deadline = time.monotonic() + seconds
        while getattr(self.counters, name) != value:
            assert time.monotonic() < deadline, f"{name} stayed {getattr(self.counters, name)}, not {value}: {self.counters}"
            await asyncio.sleep(0.02)

    @property
    def running(self) -> bool:
        return self._httpd is not None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> str:
        server = self

        class Handler(_Handler):
            owner = server

        self._httpd = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._httpd.daemon_threads = True
        self.port = self._httpd.server_address[1]
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="completions-server", daemon=True)
        self._thread.start()
        return self.url

    def stop(self) -> None:
        """Down: no listening socket, every open connection reset."""
        if self._httpd is None:
            return
        self._httpd.shutdown()
        self._httpd.server_close()
        with self._lock:
            for connection in list(self._connections):
                try:
                    connection.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        self._httpd = None

    def reset(self) -> None:
        self.model, self.root = "tiny-random", None
        self.behaviour = Behaviour()
        self.counters = Counters()
        self.streaming.clear()
        self.denoising.clear()

    # -- the model ---------------------------------------------------------------------------

    def complete(self, prompt: str, *, n: int, max_tokens: int, seed: int | None,
                 add_special_tokens: bool = True, cancel: threading.Event | None = None):
        """(texts, confidences, tokens, canvases, prompt token count) from the tiny model; serialised."""
        bos = self.runtime.tokenizer.bos_token or ""
        text = (bos if add_special_tokens else "") + prompt
        request = DenoiseRequest(
            context=InfillContext(prefix=text, suffix=""),
            settings=GenerationSettings(
                steps=self.behaviour.steps, max_tokens=max_tokens, candidates=n, seed=seed, early_stop=False
            ),
        )
        with self._model_lock:
            self.denoising.set()
            result = self.runtime.run(request, cancel=cancel)
        return result

    # -- bookkeeping for the handler -----------------------------------------------------------

    def track(self, connection: socket.socket, open_: bool) -> None:
        with self._lock:
            (self._connections.add if open_ else self._connections.discard)(connection)

    def count(self, name: str, by: int = 1, into: Counters | None = None) -> None:
        """Add to `into` (the counters a request started under), else to the current ones.

        A request still running when a test ends must not count into the next
        test's fresh counters (`reset`): handlers pass the object they began with.
        """
        with self._lock:
            counters = into if into is not None else self.counters
            setattr(counters, name, getattr(counters, name) + by)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: the client's pool reuses connections
    owner: CompletionsServer

    def setup(self) -> None:
        super().setup()
        self.owner.track(self.connection, True)
        self.owner.count("connections")

    def finish(self) -> None:
        self.owner.track(self.connection, False)
        try:
            super().finish()
        except OSError:
            pass

    def log_message(self, format, *args) -> None:  # quiet: the test output is the tests'
        pass

    # -- routing -------------------------------------------------------------------------------

    def do_GET(self) -> None:
        if self.path.rstrip("/") != "/v1/models":
            return self._error(404, f"no route {self.path}")
        self.owner.count("probes")
        if not self._authorized():
            return self._error(401, "invalid API key")
        if (status := self.owner.behaviour.probe_status) is not None:
            return self._error(status, "the server is not ready")
        card = {"id": self.owner.model, "object": "model", "owned_by": "vllm", "root": self.owner.root or self.owner.model}
        self._json(200, {"object": "list", "data": [card]})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        if self.path.rstrip("/") != "/v1/completions":
            return self._error(404, f"no route {self.path}")
        owner, behaviour = self.owner, self.owner.behaviour
        self.counters = counters = owner.counters  # this request counts into the test it began in
        owner.count("completions", into=counters)
        if not self._authorized():
            return self._error(401, "invalid API key")
        try:
            body = json.loads(raw)
        except ValueError:
            return self._error(400, "the body is not JSON")
        with owner._lock:
            counters.bodies.append(body)
        if behaviour.fail_count > 0 and behaviour.fail_status is not None:
            behaviour.fail_count -= 1
            return self._error(behaviour.fail_status, "injected failure")
        problem = _invalid(body, owner.model)
        if problem is not None:
            return self._error(*problem)
        if behaviour.first_byte_delay:
            time.sleep(behaviour.first_byte_delay)
        malformed, behaviour.malformed = behaviour.malformed, None
        if malformed == "content-type":
            return self._json(200, {"choices": []})
        cancel = threading.Event()
        watcher = threading.Thread(target=_watch_disconnect, args=(self.connection, cancel), daemon=True)
        watcher.start()
        try:
            result = owner.complete(
                body["prompt"], n=body.get("n", 1), max_tokens=body.get("max_tokens", 16),
                seed=body.get("seed"), add_special_tokens=body.get("add_special_tokens", True), cancel=cancel,
            )
        except CancelledError:
            owner.count("aborted", into=counters)
            self.close_connection = True
            return
        except Exception as error:  # a bug here must read as a server error, like vLLM's 500
            return self._error(500, f"{type(error).__name__}: {error}")
        finally:
            cancel.set()  # stops the watcher
            watcher.join()
        if body.get("stream"):
            self._stream(body, result, malformed)
        else:
            self._json(200, _completion(owner.model, body, result))
            owner.count("completed", into=counters)

    # -- answers -------------------------------------------------------------------------------

    def _stream(self, body: dict, result, malformed: str | None) -> None:
        owner = self.owner
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        events = _stream_events(owner.model, body, result, owner.runtime.tokenizer)
        try:
            for number, event in enumerate(events):
                if number == 1 and malformed == "json":
                    self._chunk(b"data: {not json\n\n")
                if number == 1 and malformed == "drop":
                    self.connection.shutdown(socket.SHUT_RDWR)
                    self.close_connection = True
                    return
                if malformed == "no-done" and event == "[DONE]":
                    continue
                if number and owner.behaviour.chunk_delay:
                    time.sleep(owner.behaviour.chunk_delay)
                self._chunk(f"data: {event}\n\n".encode())
                owner.streaming.set()
            self._chunk(b"")  # the last chunk of a chunked body
        except (BrokenPipeError, ConnectionResetError):
            owner.count("disconnected", into=self.counters)
            self.close_connection = True
            return
        owner.count("completed", into=self.counters)

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def _json(self, status: int, payload: dict) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _error(self, status: int, message: str) -> None:
        self._json(status, {"object": "error", "message": message, "type": "BadRequestError", "code": status})

    def _authorized(self) -> bool:
        key = self.owner.api_key
        return key is None or self.headers.get("Authorization") == f"Bearer {key}"


def _invalid(body: dict, model: str) -> tuple[int, str] | None:
    if body.get("model") != model:
        return 404, f"The model `{body.get('model')}` does not exist."
    if "suffix" in body:
        return 400, "suffix is not supported for this model"
    if not isinstance(body.get("prompt"), str) or not body["prompt"]:
        return 400, "prompt must be a non-empty string"
    n, max_tokens = body.get("n", 1), body.get("max_tokens", 16)
    if not isinstance(n, int) or not 1 <= n <= 16:
        return 400, "n must be 1..16"
    if not isinstance(max_tokens, int) or max_tokens < 1:
        return 400, "max_tokens must be >= 1"
    return None


def _watch_disconnect(connection: socket.socket, stop: threading.Event) -> None:
    """Set `stop` when the client closes its end (EOF) while the model runs."""
    while not stop.is_set():
        readable, _, _ = select.select([connection], [], [], 0.02)
        if readable:
            try:
                if connection.recv(1, socket.MSG_PEEK) == b"":
                    stop.set()
                    return
            except OSError:
                stop.set()
                return
            time.sleep(0.02)  # data, not EOF (a pipelined request): keep watching


def _pieces(text: str, count: int) -> list[str]:
    """`text` in `count` consecutive pieces (one per finished canvas)."""
    count = max(1, count)
    size = math.ceil(len(text) / count) if text else 0
    return [text[i * size:(i + 1) * size] for i in range(count)]


def _finish_reason(candidate, max_tokens: int) -> str:
    return "length" if candidate.tokens >= max_tokens else "stop"


def _logprobs(text: str, confidence: float, tokenizer) -> dict:
    ids = tokenizer(text, add_special_tokens=False)["input_ids"] if text else []
    value = math.log(max(confidence, 1e-12))
    return {"tokens": tokenizer.convert_ids_to_tokens(ids), "token_logprobs": [value] * len(ids),
            "top_logprobs": None, "text_offset": None}


def _stream_events(model: str, body: dict, result, tokenizer):
    max_tokens = body.get("max_tokens", 16)
    pieces = [_pieces(c.text, result.canvases) for c in result.candidates]
    base = {"id": "cmpl-tiny", "object": "text_completion", "created": int(time.time()), "model": model}
    for canvas in range(max(1, result.canvases)):
        for index, candidate in enumerate(result.candidates):
            last = canvas == len(pieces[index]) - 1
            choice = {"index": index, "text": pieces[index][canvas],
                      "finish_reason": _finish_reason(candidate, max_tokens) if last else None}
            if body.get("logprobs") is not None:
                choice["logprobs"] = _logprobs(pieces[index][canvas], candidate.confidence, tokenizer)
            yield json.dumps({**base, "choices": [choice]})
    if (body.get("stream_options") or {}).get("include_usage"):
        completion_tokens = sum(c.tokens for c in result.candidates)
        usage = {"prompt_tokens": result.prompt_tokens, "completion_tokens": completion_tokens,
                 "total_tokens": result.prompt_tokens + completion_tokens}
        yield json.dumps({**base, "choices": [], "usage": usage})
    yield "[DONE]"


def _completion(model: str, body: dict, result) -> dict:
    max_tokens = body.get("max_tokens", 16)
    choices = [{"index": i, "text": c.text, "logprobs": None, "finish_reason": _finish_reason(c, max_tokens)}
               for i, c in enumerate(result.candidates)]
    completion_tokens = sum(c.tokens for c in result.candidates)
    return {"id": "cmpl-tiny", "object": "text_completion", "created": int(time.time()), "model": model,
            "choices": choices, "usage": {"prompt_tokens": result.prompt_tokens,
                                          "completion_tokens": completion_tokens,
                                          "total_tokens": result.prompt_tokens + completion_tokens}}
