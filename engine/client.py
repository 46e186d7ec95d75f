"""The engine as the language server sees it: a small async interface.

`EngineClient` is what the server talks to; `InProcessEngineClient` wraps an
`InfillService` in this process (blocking denoise on a worker thread), and a
daemon-backed client can implement the same Protocol. Cancellation is asyncio
cancellation: cancelling the task awaiting `denoise` sets the request's
`threading.Event`, the engine stops within one denoising step, and `denoise`
re-raises CancelledError only after the worker has let go of the model — so a
cancelled request never overlaps the next one. A model that failed to load is
tried again by the first request after the service's backoff, or at once by
`reload` (the `dgemma.reloadModel` command).

Knows the engine's public types and service; knows nothing of LSP. Never
imports torch (the service does, lazily, when it loads the model).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable
from typing import Protocol

import msgspec

from . import errors
from .api import DenoiseRequest, DenoiseResult, Draft, EngineStatus

log = logging.getLogger(__name__)

StatusListener = Callable[[EngineStatus], None]
DraftListener = Callable[[Draft], None]


class EngineUnavailableError(Exception):
    """The model is not loaded and will not be without user action (it failed to load)."""


class EngineClient(Protocol):
    async def start(self) -> None:
        """Kick off model loading in the background; progress is reported to status listeners."""

    def status(self) -> EngineStatus:
        """The engine's state now."""

    def on_status(self, listener: StatusListener) -> None:
        """Call `listener` on the event loop whenever the status changes."""

    async def denoise(self, request: DenoiseRequest, on_draft: DraftListener | None = None) -> DenoiseResult:
        """Denoise `request`; `on_draft` runs on the event loop after every step.

        Without `on_draft` no draft is made at all: the engine skips decoding the canvas at
        every step (a tokenizer pass over 256 tokens per step), and a daemon streams nothing.

        Raises EngineUnavailableError when the model failed to load, engine
        errors for bad requests, asyncio.CancelledError when cancelled.
        """

    async def reload(self) -> EngineStatus:
        """Load the model again now (after a failed load, or to pick up changed files); the status after."""

    async def close(self) -> None:
        """Stop all work and release the engine."""

    def forget(self, document: str) -> None:
        """The document (a prompt cache key, its URI) was closed: free what the engine keeps for it."""

    def set_prompt_cache_budget(self, max_bytes: int | None) -> None:
        """Bound the engine's prompt cache to `max_bytes`; None lets the engine size it from free memory."""


class InProcessEngineClient:
    """Runs an InfillService in this process, one daemon worker thread per call."""

    def __init__(self, service) -> None:  # engine.service.InfillService (imported by the caller)
        self._service = service
        self._listeners: list[StatusListener] = []
        self._loaded: asyncio.Future[None] | None = None
        self._cancels: set[threading.Event] = set()
        self._load_error: BaseException | None = None
        self._busy = 0
        self._closed = False

    async def start(self) -> None:
        if self._loaded is not None:
            return
        loop = asyncio.get_running_loop()
        self._loaded = loop.create_future()
        # Load progress (shards read) reaches status listeners from the loading thread, as it was
        # then: read on a busy loop later, several shards would collapse into one report.
        self._service.on_change = lambda: loop.call_soon_threadsafe(self._publish, self.status())

        def load() -> None:
            error: BaseException | None = None
            try:
                self._service.load()
            except errors.EngineError as exc:
                error = exc
            except Exception as exc:  # a crash while loading must not kill the server
                log.exception("model failed to load")
                error = exc
            loop.call_soon_threadsafe(self._load_finished, error)

        # A daemon thread: exiting the server must not wait for a half-loaded model.
        threading.Thread(target=load, name="dgemma-load", daemon=True).start()
        self._publish()  # "loading" (status() reports it until the thread settles)

    def _load_finished(self, error: BaseException | None) -> None:
        assert self._loaded is not None
        if error is None:
            self._loaded.set_result(None)
        else:
            self._load_error = error
            self._loaded.set_exception(EngineUnavailableError(str(error)))
            self._loaded.exception()  # mark retrieved: awaiting it later re-raises
        self._publish()

    def status(self) -> EngineStatus:
        status = self._service.status()
        if self._loaded is not None and not self._loaded.done() and status.state in ("idle", "error", "unloaded"):
            status = msgspec.structs.replace(status, state="loading")
        if self._load_error is not None and status.state != "error":
            status = msgspec.structs.replace(status, state="error", message=str(self._load_error))
        if self._busy and status.state == "ready":
            status = msgspec.structs.replace(status, state="busy")
        return status

    def on_status(self, listener: StatusListener) -> None:
        self._listeners.append(listener)

    def _publish(self, status: EngineStatus | None = None) -> None:
        status = status or self.status()
        for listener in list(self._listeners):
            try:
                listener(status)
            except Exception:
                log.exception("status listener failed")

    async def denoise(self, request: DenoiseRequest, on_draft: DraftListener | None = None) -> DenoiseResult:
        if self._closed:
            raise EngineUnavailableError("the engine is closed")
        if self._loaded is not None and self._loaded.done() and self._load_error is not None:
            if self._service.retry_due():  # the backoff has passed: this request tries again
                self._loaded, self._load_error = None, None
        if self._loaded is None:
            await self.start()
        assert self._loaded is not None
        # Shielded: cancelling one waiting request must not cancel the shared load.
        await asyncio.shield(self._loaded)  # raises EngineUnavailableError if loading failed
        loop = asyncio.get_running_loop()
        done: asyncio.Future[DenoiseResult] = loop.create_future()
        cancel = threading.Event()

        def forward_draft(draft: Draft) -> None:
            if not cancel.is_set():
                loop.call_soon_threadsafe(_call_unless_cancelled, cancel, on_draft, draft)

        def work() -> None:
            try:
                result = self._service.denoise(request, forward_draft if on_draft is not None else None, cancel)
            except BaseException as exc:  # handed to the awaiting task, never lost
                loop.call_soon_threadsafe(_settle, done, None, exc)
            else:
                loop.call_soon_threadsafe(_settle, done, result, None)

        self._cancels.add(cancel)
        self._busy += 1
        self._publish()
        threading.Thread(target=work, name="dgemma-denoise", daemon=True).start()
        try:
            return await asyncio.shield(done)
        except asyncio.CancelledError:
            cancel.set()
            # Wait (briefly: one denoising step) for the worker to let go of the model,
            # so "cancelled" means "no work left running", even if cancelled again meanwhile.
            while not done.done():
                try:
                    await asyncio.shield(done)
                except asyncio.CancelledError:
                    continue
                except BaseException:
                    break
            if not done.cancelled() and done.exception() is None:
                log.debug("request cancelled after its last step; result dropped")
            raise
        finally:
            self._cancels.discard(cancel)
            self._busy -= 1
            self._publish()

    async def reload(self) -> EngineStatus:
        if self._closed:
            raise EngineUnavailableError("the engine is closed")
        if self._loaded is not None and not self._loaded.done():
            with contextlib.suppress(EngineUnavailableError):
                await asyncio.shield(self._loaded)  # one load at a time
        self._loaded, self._load_error = None, None
        loop = asyncio.get_running_loop()
        self._loaded = loop.create_future()
        self._publish()

        def reload() -> None:
            error: BaseException | None = None
            try:
                self._service.reload()
            except Exception as exc:  # noqa: BLE001 - reported as the status, never raised into the server
                error = exc
            loop.call_soon_threadsafe(self._load_finished, error)

        threading.Thread(target=reload, name="dgemma-reload", daemon=True).start()
        with contextlib.suppress(EngineUnavailableError):
            await asyncio.shield(self._loaded)
        return self.status()

    async def close(self) -> None:
        self._closed = True
        for cancel in list(self._cancels):
            cancel.set()

    def forget(self, document: str) -> None:
        self._service.forget(document)

    def set_prompt_cache_budget(self, max_bytes: int | None) -> None:
        self._service.set_prompt_cache_budget(max_bytes)


def _call_unless_cancelled(cancel: threading.Event, callback: DraftListener, draft: Draft) -> None:
    if not cancel.is_set():
        callback(draft)


def _settle(future: asyncio.Future, result, error: BaseException | None) -> None:
    if future.done():
        return
    if error is None:
        future.set_result(result)
    else:
        future.set_exception(error)
