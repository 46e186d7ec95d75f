"""The engine on a vLLM server: the `EngineClient` Protocol over its OpenAI-compatible API.

`VllmEngineClient` sends the prompt our own `PromptLayout` lays out (the same
text `PromptBuilder` encodes in process, the served model's chat template
included, see template.py) to `POST {url}/completions` with `model`, `prompt`,
`max_tokens`, `n` (= candidates), `stream`, `logprobs` (confidence, where
returned) and `add_special_tokens: false` (the template already carries
<bos>). The answer streams as server-sent events; cancelling the awaiting task
leaves the `async with` of the stream, which closes the connection, and vLLM
aborts a request whose client went away. One HTTP/1.1 connection pool per
client (httpx2: the async client huggingface_hub already brings, with
server-sent events built in, so neither HTTP nor SSE is written here).

What the API cannot do for DiffusionGemma, and what happens instead:
- drafts: denoising steps stream nothing, only finished canvases. No draft is
  ever sent; the ready status says why, once.
- rewrite: no starting canvas can be passed, so the rewrite is asked for in
  the prompt alone: the rewrite instruction carrying the selection's text
  (`PromptLayout.text(..., original=)`); `strength` is ignored, logged once.
  A next edit (a rewrite of the edit window with `recent_edits`) goes the same
  way, its diffs in the prompt too: the model sees the window and the edits but
  starts from noise, so how often it reproduces the window ("no edit") is the
  served model's alone.
- steps, entropy bound, temperatures, early stop are server-wide
  (`--diffusion-config`): per-request values are ignored with a log line.
  `seed` is passed through.

Faults (server down, timeouts, 4xx/5xx, malformed streams) fail the request
with a one-line reason (the server turns that into empty items) and set the
status to `error` with it. Faults that say the server or its configuration is
unwell start a bounded exponential backoff: requests inside the window fail at
once without touching the server, and one recovery task probes `GET
{url}/models` at the end of each window until it answers, then the status is
`ready` again. A rejected request (400/413/422) is that request's problem and
starts no backoff. Nothing is ever retried in a loop that could hammer a
shared server.

Knows asyncio, httpx2, msgspec and the engine's public types; knows nothing of
LSP. Never imports torch or transformers.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import time
from dataclasses import dataclass
from typing import Literal
from urllib.parse import urlsplit

import httpx2
import msgspec

from .. import errors
from ..api import DenoiseRequest, DenoiseResult, EngineStatus, RawCandidate, Timings
from ..client import DraftListener, EngineUnavailableError, StatusListener
from ..model.folders import DEFAULT_MODEL_ID
from ..model.prompting import PromptLayout
from .template import TOKENIZER_FILES, load_layout

log = logging.getLogger(__name__)

DEFAULT_URL = "http://127.0.0.1:8000/v1"
API_KEY_ENV = "DGEMMA_LSP_API_KEY"
DEFAULT_MAX_TOKENS = 256
"""One canvas of the released checkpoint: what `max_tokens` is when the settings leave it open."""
LOGPROBS = 1
"""The sampled token's logprob (plus its top-1): enough for a mean-probability confidence."""
REQUEST_REJECTED = (400, 413, 422)
"""Statuses that reject one request (its prompt or knobs), not the server: no backoff."""
NO_DRAFTS = "no drafts: the API streams only finished canvases"


FaultKind = Literal[
    "unreachable", "timeout", "connection-lost", "http-status", "rejected", "not-a-stream",
    "malformed-event", "incomplete-stream", "error-mid-stream", "not-our-model",
]
"""What went wrong with a request, for code that must tell faults apart without reading messages:
no connection; no answer in time; the connection broke mid-answer; an HTTP error status; a
status that rejects the request itself (REQUEST_REJECTED); an answer that is not an event
stream; an event that is not a completion chunk; a stream that ended before every candidate
finished; an error the server sent mid-stream; a server that does not serve our model."""


class RemoteEngineError(errors.EngineError):
    """The server answered, but not with a usable completion (a rejected request); `fault` says how."""

    def __init__(self, reason: str, fault: FaultKind) -> None:
        super().__init__(reason)
        self.fault: FaultKind = fault


class RemoteUnavailableError(EngineUnavailableError):
    """The server is unwell (a backoff started): what the server answers with empty items; `fault` says how."""

    def __init__(self, reason: str, fault: FaultKind) -> None:
        super().__init__(reason)
        self.fault: FaultKind = fault


@dataclass(frozen=True)
class Timeouts:
    """Seconds the client waits; `read` is between two chunks of a stream, `total` is one whole request."""

    connect: float = 5.0
    read: float = 30.0
    write: float = 10.0
    pool: float = 10.0
    total: float = 120.0


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff after a fault: `first` seconds, doubling, never more than `most`."""

    first: float = 1.0
    most: float = 30.0

    def delay(self, failures: int) -> float:
        return min(self.most, self.first * 2 ** max(0, failures - 1))


class _Fault(Exception):
    """A failed request, classified: `backoff` when the server (not the request) is unwell."""

    def __init__(self, reason: str, kind: FaultKind, *, backoff: bool, retry_after: float | None = None) -> None:
        super().__init__(reason)
        self.reason, self.kind, self.backoff, self.retry_after = reason, kind, backoff, retry_after


# -- the stream's chunks (only the fields read here; unknown fields are ignored) ------------------


class _Logprobs(msgspec.Struct):
    tokens: list[str] = []
    token_logprobs: list[float | None] = []


class _Choice(msgspec.Struct):
    index: int = 0
    text: str = ""
    logprobs: _Logprobs | None = None
    finish_reason: str | None = None


class _PromptDetails(msgspec.Struct):
    cached_tokens: int | None = None


class _Usage(msgspec.Struct):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    prompt_tokens_details: _PromptDetails | None = None


class _Chunk(msgspec.Struct):
    choices: list[_Choice] = []
    usage: _Usage | None = None
    error: dict | str | None = None


class _Model(msgspec.Struct):
    id: str
    root: str | None = None
    """vLLM's model card: the checkpoint a `--served-model-name` alias serves."""


class _ModelList(msgspec.Struct):
    data: list[_Model]


_decode_chunk = msgspec.json.Decoder(_Chunk).decode
_decode_models = msgspec.json.Decoder(_ModelList).decode


class VllmEngineClient:
    """An EngineClient whose model is served by vLLM (or any server of the same API subset)."""

    def __init__(
        self,
        url: str = DEFAULT_URL,
        model: str = DEFAULT_MODEL_ID,
        *,
        tokenizer: str | None = None,
        api_key: str | None = None,
        timeouts: Timeouts = Timeouts(),
        backoff: Backoff = Backoff(),
        max_connections: int = 8,
    ) -> None:
        self.url = url.rstrip("/")
        self.model = model
        self.tokenizer = tokenizer
        """Where the chat template is (a folder or a Hugging Face id); None: --model, else the server's `root`."""
        self._api_key = api_key
        self._timeouts = timeouts
        self._backoff = backoff
        self._max_connections = max_connections
        self._http: httpx2.AsyncClient | None = None
        self._layout: PromptLayout | None = None
        self._connecting: asyncio.Task | None = None
        self._recovery: asyncio.Task | None = None
        self._listeners: list[StatusListener] = []
        self._state = "idle"
        self._message = ""
        self._ready_message = f"vLLM at {self.url}; {NO_DRAFTS}"
        self._failures = 0
        self._fault_epoch = 0
        self._retry_at = 0.0
        self._busy = 0
        self._last_latency_ms: float | None = None
        self._ignored_logged: dict | None = None
        self._rewrite_logged = False
        self._closed = False

    @classmethod
    def from_args(cls, args) -> VllmEngineClient:
        """From `--engine-url` and `--model`; the key from $DGEMMA_LSP_API_KEY (never a flag: argv is public)."""
        return cls(args.engine_url, args.model, tokenizer=getattr(args, "tokenizer", None),
                   api_key=os.environ.get(API_KEY_ENV) or None)

    # -- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> None:
        if self._connecting is not None:
            return
        headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}
        t = self._timeouts
        self._http = httpx2.AsyncClient(
            base_url=self.url + "/",
            headers=headers,
            timeout=httpx2.Timeout(connect=t.connect, read=t.read, write=t.write, pool=t.pool),
            limits=httpx2.Limits(
                max_connections=self._max_connections, max_keepalive_connections=self._max_connections
            ),
        )
        self._state = "loading"
        self._connecting = asyncio.create_task(self._connect(), name="dgemma-vllm-connect")
        self._publish()

    async def _connect(self) -> None:
        # Local problems (a URL that is no URL, no chat template) no server can fix: no probing.
        if urlsplit(self.url).scheme not in ("http", "https") or not urlsplit(self.url).netloc:
            self._set("error", f"--engine-url must be an http:// or https:// URL, got {self.url!r}")
            return
        try:
            self._layout, source = await self._find_layout()
        except errors.EngineError as error:
            self._set("error", str(error))
            return
        except Exception as error:  # noqa: BLE001 - e.g. a template jinja cannot render: say so, never crash
            self._set("error", f"cannot lay out prompts for {self.model}: {type(error).__name__}: {error}")
            return
        log.info("vLLM engine at %s, model %s, chat template from %s; %s", self.url, self.model, source, NO_DRAFTS)
        await self._probe_and_settle()

    async def _find_layout(self) -> tuple[PromptLayout, str]:
        """The chat template: from --tokenizer; else from --model; else from the model's `root` on the server.

        A team's vLLM usually serves the checkpoint under its own name (`--served-model-name`),
        which no tokenizer files here are named after; its `GET /models` card names the
        checkpoint as `root`, and those files may well be in the local Hugging Face cache.
        """
        if self.tokenizer is not None:
            try:
                return await asyncio.to_thread(load_layout, self.tokenizer)
            except errors.ModelNotFoundError as error:
                raise errors.ModelNotFoundError(f"--tokenizer {self.tokenizer}: {error}") from None
        try:
            return await asyncio.to_thread(load_layout, self.model)
        except errors.ModelNotFoundError as error:
            not_here = error
        root, why = await self._served_root()
        if root is not None and root != self.model:
            try:
                layout, source = await asyncio.to_thread(load_layout, root)
            except errors.ModelNotFoundError:
                why = f"nor for its root '{root}' (from {self.url}/models)"
            else:
                log.info("%s is served from %s: its chat template comes from there", self.model, root)
                return layout, source
        raise errors.ModelNotFoundError(
            f"no chat template for '{self.model}': no tokenizer files for it on this machine, {why}; "
            f"pass --tokenizer with a folder holding {', '.join(TOKENIZER_FILES[:2])} (or a Hugging Face id "
            f"whose tokenizer files are cached: `hf download ID {' '.join(TOKENIZER_FILES)}`)"
        ) from not_here

    async def _served_root(self) -> tuple[str | None, str]:
        """(the served model's `root` from GET /models, or None and why not)."""
        assert self._http is not None
        try:
            response = await self._http.get("models")
            if response.status_code != 200:
                return None, f"and {self.url}/models answered HTTP {response.status_code}"
            cards = _decode_models(response.content).data
        except (httpx2.HTTPError, msgspec.DecodeError) as error:
            return None, f"and {self.url}/models could not be read ({type(error).__name__}: {error})"
        card = next((card for card in cards if card.id == self.model), None)
        if card is None:
            return None, f"and {self.url} serves no model named so"
        if not card.root or card.root == self.model:
            return None, f"and {self.url}/models names no other checkpoint as its root"
        return card.root, ""

    async def close(self) -> None:
        self._closed = True
        for task in (self._connecting, self._recovery):
            if task is not None and not task.done():
                task.cancel()
        if self._http is not None:
            await self._http.aclose()

    async def reload(self) -> EngineStatus:
        """Ask the server now, whatever the backoff says (`dgemma.reloadModel`): one probe, never a loop."""
        if self._connecting is None:
            await self.start()
        assert self._connecting is not None
        if self._connecting.done() and self._layout is None:  # a local problem at start: lay out again
            self._connecting = asyncio.create_task(self._connect(), name="dgemma-vllm-connect")
        if not self._connecting.done():
            await asyncio.shield(self._connecting)
            return self.status()
        await self._probe_and_settle()
        return self.status()

    def forget(self, document: str) -> None:
        """Nothing to free here: vLLM's automatic prefix caching evicts on its own."""

    def set_prompt_cache_budget(self, max_bytes: int | None) -> None:
        """The server's prefix cache is sized by vLLM (`--gpu-memory-utilization`), not per editor."""

    # -- status -------------------------------------------------------------------------------

    def status(self) -> EngineStatus:
        state = "busy" if self._busy and self._state == "ready" else self._state
        return EngineStatus(
            state=state,
            model=self.model,
            device=f"remote {self.url}",
            message=self._message,
            last_latency_ms=self._last_latency_ms,
            # The served model's own limit, from its tokenizer files: the server cuts contexts to it.
            context_tokens=self._layout.context_tokens if self._layout is not None else None,
        )

    def on_status(self, listener: StatusListener) -> None:
        self._listeners.append(listener)

    def _publish(self) -> None:
        status = self.status()
        for listener in list(self._listeners):
            try:
                listener(status)
            except Exception:
                log.exception("status listener failed")

    def _set(self, state: str, message: str) -> None:
        if (state, message) != (self._state, self._message):
            self._state, self._message = state, message
            self._publish()

    # -- faults and recovery ------------------------------------------------------------------

    def _fault(self, fault: _Fault, epoch: int) -> None:
        """Record a fault seen by work started at `epoch`; concurrent failures count once."""
        if self._state != "error" or self._message != fault.reason:
            log.warning("vLLM engine: %s", fault.reason)
        if fault.backoff and epoch == self._fault_epoch:
            self._fault_epoch += 1
            self._failures += 1
            delay = self._backoff.delay(self._failures)
            if fault.retry_after is not None:
                delay = min(self._backoff.most, max(delay, fault.retry_after))
            self._retry_at = time.monotonic() + delay
            if self._recovery is None or self._recovery.done():
                self._recovery = asyncio.create_task(self._recover(), name="dgemma-vllm-recover")
        self._set("error", fault.reason)

    def _recovered(self) -> None:
        self._failures, self._retry_at = 0, 0.0
        self._fault_epoch += 1
        self._set("ready", self._ready_message)

    async def _recover(self) -> None:
        """Probe the server once at the end of each backoff window until it answers."""
        while not self._closed and self._failures:
            await asyncio.sleep(max(0.0, self._retry_at - time.monotonic()))
            if not self._failures:  # a request got through meanwhile
                return
            if await self._probe_and_settle():
                log.info("vLLM engine at %s answers again", self.url)

    async def _probe_and_settle(self) -> bool:
        """Probe once: `ready` when the server answers, a recorded fault (and backoff) when not."""
        epoch = self._fault_epoch
        try:
            await self._probe()
        except _Fault as fault:
            self._fault(fault, epoch)
            return False
        self._recovered()
        return True

    async def _probe(self) -> None:
        """GET /models: the server is up, the key is accepted and our model is served."""
        assert self._http is not None
        try:
            response = await self._http.get("models")
        except httpx2.HTTPError as error:
            raise _transport_fault(self.url, error) from None
        if response.status_code != 200:
            raise _status_fault(response, response.text, self.url, self.model)
        try:
            served = [m.id for m in _decode_models(response.content).data]
        except msgspec.DecodeError as error:
            raise _Fault(f"{self.url}/models answered something other than a model list: {error}", "malformed-event",
                         backoff=True) from None
        if self.model not in served:
            raise _Fault(
                f"the server at {self.url} serves {', '.join(served) or 'no model'}, not {self.model}: "
                "pass --model with the served name",
                "not-our-model",
                backoff=True,
            )

    # -- work ---------------------------------------------------------------------------------

    async def denoise(self, request: DenoiseRequest, on_draft: DraftListener | None = None) -> DenoiseResult:
        """Denoise on the server; `on_draft` is never called (the API streams no steps)."""
        if self._closed:
            raise EngineUnavailableError("the engine is closed")
        if self._connecting is None:
            await self.start()
        assert self._connecting is not None
        await asyncio.shield(self._connecting)
        if self._layout is None:
            raise EngineUnavailableError(self._message)
        if self._failures and time.monotonic() < self._retry_at:
            wait = self._retry_at - time.monotonic()
            raise EngineUnavailableError(f"{self._message} (next try in {wait:.0f} s)")
        body = self._body(request)
        epoch = self._fault_epoch
        started = time.perf_counter()
        self._busy += 1
        self._publish()
        try:
            try:
                async with asyncio.timeout(self._timeouts.total):
                    result = await self._stream(body, request.settings.candidates)
            except TimeoutError:
                raise _Fault(f"{self.url} took longer than {self._timeouts.total:.0f} s", "timeout", backoff=True) from None
            except httpx2.SSEError as error:  # the answer is not an event stream (its content type)
                raise _Fault(f"malformed stream from {self.url}: {error}", "not-a-stream", backoff=True) from None
            except httpx2.TimeoutException:
                raise _Fault(f"{self.url} timed out (no answer within {self._timeouts.read:.0f} s)", "timeout",
                             backoff=True) from None
            except httpx2.HTTPError as error:  # transport failures, broken chunked bodies, decoding errors
                raise _transport_fault(self.url, error) from None
        except _Fault as fault:
            self._fault(fault, epoch)
            error_type = RemoteUnavailableError if fault.backoff else RemoteEngineError
            raise error_type(fault.reason, fault.kind) from None
        finally:
            self._busy -= 1
            self._publish()
        total_ms = (time.perf_counter() - started) * 1000
        self._last_latency_ms = total_ms
        if self._state != "ready":
            self._recovered()
        return msgspec.structs.replace(result, timings_ms=Timings(denoise=total_ms, total=total_ms))

    def _body(self, request: DenoiseRequest) -> dict:
        assert self._layout is not None
        settings = request.settings
        ignored = {
            name: value
            for name, value in (
                ("steps", settings.steps), ("entropyBound", settings.entropy_bound),
                ("tMax", settings.t_max), ("tMin", settings.t_min),
                ("earlyStop", None if settings.early_stop else False),
            )
            if value is not None
        }
        if ignored and ignored != self._ignored_logged:
            self._ignored_logged = ignored
            log.info("vLLM sets these server-wide (--diffusion-config); ignored per request: %s", ignored)
        rewrite = request.selection is not None
        if rewrite and not self._rewrite_logged:
            self._rewrite_logged = True
            log.info("rewrite over vLLM: no starting canvas can be passed; the selection goes in the "
                     "prompt instead and rewriteStrength (%s) is ignored", request.strength)
        body = {
            "model": self.model,
            "prompt": self._layout.text(request.context, rewrite=rewrite, original=request.selection,
                                       layout=request.settings.prompt_layout,
                                       edits=request.recent_edits if rewrite else None).all,
            "max_tokens": settings.max_tokens or DEFAULT_MAX_TOKENS,
            "n": settings.candidates,
            "stream": True,
            "stream_options": {"include_usage": True},
            "logprobs": LOGPROBS,
            "add_special_tokens": False,
        }
        if settings.seed is not None:
            body["seed"] = settings.seed
        return body

    async def _stream(self, body: dict, candidates: int) -> DenoiseResult:
        """POST the request and read its event stream to the end ([DONE], then the body's end)."""
        assert self._http is not None
        texts = [""] * candidates
        logprobs: list[list[float]] = [[] for _ in range(candidates)]
        finished: list[str | None] = [None] * candidates
        usage = _Usage()
        canvases = 0
        done = False
        async with self._http.sse("completions", method="POST", json=body) as source:
            response = source.response
            if response.status_code != 200:
                detail = (await response.aread()).decode("utf-8", "replace")
                raise _status_fault(response, detail, self.url, self.model)
            async for event in source:  # read past [DONE] to the body's end: the connection is reused
                if done:
                    continue
                if event.data == "[DONE]":
                    done = True
                    continue
                try:
                    chunk = _decode_chunk(event.data)
                except msgspec.DecodeError as error:
                    raise _Fault(f"malformed stream from {self.url}: {error}", "malformed-event", backoff=True) from None
                if chunk.error is not None:
                    raise _Fault(f"{self.url} failed mid-stream: {_error_text(chunk.error)}", "error-mid-stream",
                                 backoff=True)
                for choice in chunk.choices:
                    if not 0 <= choice.index < candidates:
                        raise _Fault(f"malformed stream from {self.url}: choice {choice.index} of {candidates}",
                                     "malformed-event", backoff=True)
                    texts[choice.index] += choice.text
                    if choice.index == 0 and choice.text:  # vLLM sends one chunk per finished canvas
                        canvases += 1
                    if choice.logprobs is not None:
                        logprobs[choice.index].extend(p for p in choice.logprobs.token_logprobs if p is not None)
                    finished[choice.index] = choice.finish_reason or finished[choice.index]
                if chunk.usage is not None:
                    usage = chunk.usage
        if not done or None in finished:
            raise _Fault(f"the stream from {self.url} ended before every candidate finished", "incomplete-stream",
                         backoff=True)
        details = usage.prompt_tokens_details
        return DenoiseResult(
            candidates=[_candidate(text, lps) for text, lps in zip(texts, logprobs, strict=True)],
            steps=0,
            tokens_per_forward=0.0,
            drafts=0,
            canvases=canvases,
            prompt_tokens=usage.prompt_tokens,
            cached_prompt_tokens=(details.cached_tokens or 0) if details else 0,
            timings_ms=Timings(),
        )


def _candidate(text: str, logprobs: list[float]) -> RawCandidate:
    # Mean probability of the sampled tokens: the nearest the API gets to the runtime's
    # mean top-token probability. Without logprobs the confidence is 0 and ranking rests on syntax.
    confidence = sum(math.exp(p) for p in logprobs) / len(logprobs) if logprobs else 0.0
    return RawCandidate(text=text, confidence=confidence, tokens=len(logprobs))


def _transport_fault(url: str, error: httpx2.HTTPError) -> _Fault:
    if isinstance(error, httpx2.TimeoutException):
        return _Fault(f"{url} timed out ({type(error).__name__})", "timeout", backoff=True)
    if isinstance(error, httpx2.ConnectError):
        return _Fault(f"cannot reach {url}: {error or 'connection refused'}", "unreachable", backoff=True)
    return _Fault(f"connection to {url} failed: {type(error).__name__} {error}".rstrip(), "connection-lost", backoff=True)


def _status_fault(response: httpx2.Response, detail: str, url: str, model: str) -> _Fault:
    code = response.status_code
    reason = f"{url} answered HTTP {code}: {_error_text(detail)}"
    if code in (401, 403):
        reason = f"{url} refused the API key (HTTP {code}): set ${API_KEY_ENV} to the server's key"
    elif code == 404:
        reason = f"{url} has no such endpoint or model (HTTP 404, model {model}): {_error_text(detail)}"
    retry_after = response.headers.get("retry-after", "")
    return _Fault(
        reason,
        "rejected" if code in REQUEST_REJECTED else "http-status",
        backoff=code not in REQUEST_REJECTED,
        retry_after=float(retry_after) if retry_after.isdigit() else None,
    )


def _error_text(detail) -> str:
    """The message of an OpenAI-style error body ({"error": {"message"}} or {"message"}), else the text."""
    if isinstance(detail, str):
        try:
            detail = msgspec.json.decode(detail)
        except msgspec.DecodeError:
            return detail.strip()[:200] or "no detail"
    if isinstance(detail, dict):
        inner = detail.get("error", detail)
        if isinstance(inner, dict):
            return str(inner.get("message") or inner)[:200]
        return str(inner)[:200]
    return str(detail)[:200]
