"""InfillService: the model-owning half of the engine, as the server sees it.

One object per process owns the model (loaded lazily, once), its prompt caches
and a lock that serialises denoising. `denoise` is blocking: callers run it in
a worker thread so their event loop stays free. A cancelled request stops
within one denoising step (CancelledError) and the next request is served
normally. The resident-engine daemon exposes exactly these methods over a socket.

Load failures: whatever goes wrong while the runtime is set up (a missing file,
a tokenizer without a chat template, a bug) leaves the state `error` with the
reason, never `loading`. A later `load` retries once the backoff has passed
(5 s, doubling to 5 min while it keeps failing; before that it re-raises the
same error at once); `reload` retries now (the `dgemma.reloadModel` command).
"""

from __future__ import annotations

import functools
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from ..api import DenoiseRequest, DenoiseResult, Draft, EngineStatus
from ..errors import CancelledError, EngineError, ModelLoadError

DraftCallback = Callable[[Draft], None]
FIRST_RETRY_S = 5.0
"""Seconds after a failed load before a request may try again; doubles per failure."""
LONGEST_RETRY_S = 300.0
CPU_THREADS_ENV = "DGEMMA_LSP_CPU_THREADS"
ENGINE_NICE_ENV = "DGEMMA_LSP_ENGINE_NICE"
CPU_ENGINE_NICE = 10
"""The nice value of the thread that denoises on the CPU, unless $DGEMMA_LSP_ENGINE_NICE says otherwise."""

log = logging.getLogger(__name__)


def serving_cpu_threads() -> int:
    """Torch CPU threads for an engine that serves an editor: $DGEMMA_LSP_CPU_THREADS, else all
    cores but one.

    The spare core is the editor's and the language server's. Torch's default (every core)
    leaves its OpenMP threads spinning on all of them between operations, so on a small
    machine each hop of a keystroke (editor -> server -> engine and back) waits for a core.
    On the 2-core development machine one thread denoises the tiny model as fast as two
    (bench/RESULTS.md).
    """
    threads = _whole_number_from_env(CPU_THREADS_ENV, "a number of threads, at least 1", 1)
    return max(1, (os.cpu_count() or 2) - 1) if threads is None else threads


def serving_engine_nice() -> int:
    """The nice value for the thread that denoises when the model runs on the CPU, for an engine
    that serves an editor: $DGEMMA_LSP_ENGINE_NICE (0-19, 0: leave it), else CPU_ENGINE_NICE.

    On the CPU that thread computes without pause while a request runs, on cores the editor,
    the language server and the engine's own event loop share. At the same priority, a thread of
    theirs woken onto its core can wait for the scheduler's next tick (4 ms here) while another
    core sits idle: a kernel trace (`perf sched`) of `bench latency` shows exactly that, the loop
    run 4.3 ms after its wake-up with a core idle the whole time; with the thread niced, the
    latency threads' waits over 2 ms fell from 58 to 22 over five pairs of runs. Niced, it gives
    way when the woken thread arrives, once it has run the slice it was given (~1.5 ms on 2
    cores), instead of at the tick. On a GPU the thread mostly waits for the device, and a
    background build must not starve its kernel launches: there the priority is left alone.
    """
    nice = _whole_number_from_env(ENGINE_NICE_ENV, "a nice value from 0 to 19", 0, 19)
    return CPU_ENGINE_NICE if nice is None else nice


def _whole_number_from_env(name: str, what: str, lowest: int, highest: int | None = None) -> int | None:
    """$name as a whole number in [lowest, highest]; None when unset or blank; EngineError naming
    the variable otherwise."""
    chosen = os.environ.get(name, "").strip()
    if not chosen:
        return None
    try:
        number = int(chosen)
    except ValueError:
        raise EngineError(f"{name} must be {what}, got {chosen!r}") from None
    if number < lowest or (highest is not None and number > highest):
        raise EngineError(f"{name} must be {what}, got {number}")
    return number


def serving_service(model: str, *, device: str | None, dtype: str | None, quantization: str) -> InfillService:
    """The InfillService of an engine that serves an editor (the daemon's, or `--engine inprocess`):
    torch threads from `serving_cpu_threads`, the denoising thread niced by `serving_engine_nice`."""
    return InfillService(model, device=device, dtype=dtype, quantization=quantization,
                         cpu_threads=serving_cpu_threads(), engine_nice=serving_engine_nice())


def lower_this_threads_priority(nice: int) -> None:
    """Raise the calling thread's nice value to `nice` (never lowers it). Linux only: there nice
    is per thread and the threads it starts (torch's) inherit it; elsewhere `setpriority` would
    change the whole process."""
    if nice <= 0 or not sys.platform.startswith("linux"):
        return
    thread = threading.get_native_id()
    try:
        if os.getpriority(os.PRIO_PROCESS, thread) < nice:
            os.setpriority(os.PRIO_PROCESS, thread, nice)
    except OSError as error:  # a sandbox that forbids it: the engine still works, only less politely
        log.warning("could not lower the denoising thread's priority: %s", error)


class InfillService:
    """Loads the model on first use and denoises requests one at a time."""

    def __init__(
        self,
        model: str = "tiny",
        *,
        device: str | None = None,
        dtype: str | None = None,
        quantization: str = "none",
        allow_download: bool = False,
        first_retry_s: float = FIRST_RETRY_S,
        cpu_threads: int | None = None,
        engine_nice: int = 0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.model_spec = model
        self._clock = clock
        """What the load backoff is measured with (a test passes a clock it moves itself)."""
        self._cpu_threads = cpu_threads
        """Torch intra-op threads once loaded (`serving_cpu_threads`); None: torch's default."""
        self._engine_nice = engine_nice
        """The nice value of the thread that denoises when the model is on the CPU
        (`serving_engine_nice`); 0: leave it."""
        self._device = device
        self._dtype = dtype
        self._quantization = quantization
        self._allow_download = allow_download
        self._runtime = None  # denoising.DenoisingRuntime, once loaded
        self._load_lock = threading.Lock()
        self._run_lock = threading.Lock()
        self._state = "idle"
        self._message = ""
        self._loads = 0
        self._last_latency_ms: float | None = None
        self._cancelled = 0
        self._progress: float | None = None
        self._prompt_cache_budget: int | None = None  # None: sized from free memory after the load
        self._pending_forgets: set[str] = set()
        self._budget_changed = False
        self.last_load_ms = 0.0
        self.on_change: Callable[[], Any] | None = None
        """Called (from the loading thread) when load progress moved; the owner republishes status."""
        self.on_load_progress: Callable[[int, int], Any] | None = None
        """Also called with (shards done, total) while loading: a CLI draws its bar from it."""
        self._first_retry_s = first_retry_s
        self._failure: EngineError | None = None  # the last load's error, while it stands
        self._failures = 0  # consecutive failed loads
        self._retry_at = 0.0  # the clock's time before which a load re-raises _failure

    # -- lifecycle -------------------------------------------------------------

    def load(self) -> float:
        """Load the model if it is not resident; returns the milliseconds it took (0 when resident).

        Raises ModelNotFoundError / ModelLoadError with a one-line message, whatever
        failed; the state is then `error`. Within the backoff after a failure the
        same error is raised again without trying; after it, the load is tried again.
        """
        with self._load_lock:
            if self._runtime is not None:
                return 0.0
            if self._failure is not None and self._clock() < self._retry_at:
                raise self._failure
            from .denoising import DenoisingRuntime  # torch is imported only when a model is needed

            self._state, self._message, self._progress = "loading", "", None
            started = time.perf_counter()
            try:
                runtime = DenoisingRuntime.load(
                    self.model_spec,
                    device=self._device,
                    dtype=self._dtype,
                    quantization=self._quantization,
                    allow_download=self._allow_download,
                    progress=self._loaded_shards,
                    cpu_threads=self._cpu_threads,
                )
            except Exception as error:  # noqa: BLE001 - any failure of the set-up is a failed load
                raise self._failed(error) from None
            if self._prompt_cache_budget is not None:
                runtime.set_prompt_cache_budget(self._prompt_cache_budget)
            self._runtime = runtime
            self._progress, self._message = None, ""
            self._loads += 1
            self._failure, self._failures = None, 0
            self._state = "ready"
            self.last_load_ms = (time.perf_counter() - started) * 1000
            return self.last_load_ms

    def _loaded_shards(self, done: int, total: int) -> None:
        self._progress = done / total if total else None
        self._message = f"reading weights: {done}/{total} shards"
        if self.on_load_progress is not None:
            self.on_load_progress(done, total)
        if self.on_change is not None:
            self.on_change()

    def forget(self, document: str) -> None:
        """Drop the prompt-cache snapshot of a closed document (now, or right after the running request)."""
        self._pending_forgets.add(document)
        self._apply_cache_changes_if_idle()

    def set_prompt_cache_budget(self, max_bytes: int | None) -> None:
        """Bound the prompt cache to `max_bytes` (None: a share of the memory free after loading)."""
        self._prompt_cache_budget = max_bytes
        self._budget_changed = True
        self._apply_cache_changes_if_idle()

    def _apply_cache_changes_if_idle(self) -> None:
        # The cache is not thread-safe and a request may be reading it: never block the
        # caller's event loop on that request; it applies the changes when it finishes.
        if self._run_lock.acquire(blocking=False):
            try:
                self._apply_cache_changes()
            finally:
                self._run_lock.release()

    def _apply_cache_changes(self) -> None:
        """Pending forgets and budget change; called holding the run lock."""
        if self._runtime is None:
            self._pending_forgets.clear()  # nothing cached: a fresh load starts empty
            return
        while self._pending_forgets:
            self._runtime.prompt_cache.forget(self._pending_forgets.pop())
        if self._budget_changed:
            self._budget_changed = False
            self._runtime.set_prompt_cache_budget(self._prompt_cache_budget)

    def reload(self) -> float:
        """Load again now, whatever the backoff says; a resident model is dropped and loaded afresh."""
        self.unload()
        self.allow_retry()
        return self.load()

    def allow_retry(self) -> None:
        """Let the next load try at once, even within a failed load's backoff."""
        with self._load_lock:
            self._retry_at = 0.0

    def retry_due(self) -> bool:
        """True when the last load failed and its backoff has passed (a request would try again)."""
        return self._failure is not None and self._clock() >= self._retry_at

    def _failed(self, error: Exception) -> EngineError:
        if not isinstance(error, EngineError):
            # e.g. a tokenizer without a chat template: PromptBuilder raises ValueError.
            first_line = (str(error).strip() or type(error).__name__).splitlines()[0][:300]
            error = ModelLoadError(f"could not set up model '{self.model_spec}': {first_line}")
        self._failures += 1
        backoff = min(LONGEST_RETRY_S, self._first_retry_s * 2 ** (self._failures - 1))
        self._failure, self._retry_at = error, self._clock() + backoff
        self._state, self._message, self._progress = "error", str(error), None
        return error

    def unload(self) -> None:
        """Drop the model and its caches (idle unload); the next request loads it again."""
        with self._load_lock, self._run_lock:
            if self._runtime is not None:
                self._runtime.close()
                self._runtime = None
                self._state = "unloaded"

    @property
    def loaded(self) -> bool:
        return self._runtime is not None

    def status(self) -> EngineStatus:
        runtime = self._runtime
        return EngineStatus(
            state=self._state,
            model=self.model_spec,
            device=runtime.device_name if runtime else "",
            message=self._message,
            loads=self._loads,
            memory_bytes=runtime.memory_bytes if runtime else 0,
            last_latency_ms=self._last_latency_ms,
            progress=self._progress if self._state == "loading" else None,
            prompt_cache_bytes=runtime.prompt_cache.bytes if runtime else 0,
            cancelled=self._cancelled,
            context_tokens=runtime.context_tokens if runtime else self._declared_context_tokens,
        )

    @functools.cached_property
    def _declared_context_tokens(self) -> int | None:
        """The limit the model's folder names, read once before its weights load: a request prepared while
        the model loads is then cut the way the model will read it."""
        from ..model.folders import declared_context_tokens

        return declared_context_tokens(self.model_spec)

    # -- work ------------------------------------------------------------------

    def denoise(
        self,
        request: DenoiseRequest,
        on_draft: DraftCallback | None = None,
        cancel: threading.Event | None = None,
    ) -> DenoiseResult:
        """Denoise one request, calling `on_draft` after every step.

        Raises CancelledError within one step of `cancel` being set, and
        BadRequestError for invalid settings.
        """
        load_ms = self.load()
        if self._engine_nice and self._runtime is not None and self._runtime.device.type == "cpu":
            lower_this_threads_priority(self._engine_nice)  # one cheap syscall; each caller's thread
        with self._run_lock:
            self._state = "busy"
            try:
                result = self._runtime.run(request, on_draft=on_draft, cancel=cancel)
            except CancelledError:
                self._cancelled += 1  # the runtime stopped before its last step
                raise
            finally:
                self._state = "ready" if self._runtime is not None else self._state
                self._apply_cache_changes()
        if load_ms:
            result = _with_load_time(result, load_ms)
        self._last_latency_ms = result.timings_ms.total
        return result


def _with_load_time(result: DenoiseResult, load_ms: float) -> DenoiseResult:
    import msgspec

    timings = msgspec.structs.replace(
        result.timings_ms, load=load_ms, total=result.timings_ms.total + load_ms
    )
    return msgspec.structs.replace(result, timings_ms=timings)
