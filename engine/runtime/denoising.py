"""The denoising runtime: one loaded model turning DenoiseRequests into raw candidates.

Runs transformers' own DiffusionGemma generate path; around it this module adds
what an editor needs: the prompt cache (stable part restored, tail encoded),
B candidates from one batched call, a draft callback after every denoising step,
cancellation checked at every step (raising inside the streamer aborts generate
and leaves the model usable), rewrites as a partial renoise of the selection
(rewriting.py: the schedule, the starting canvases, the kept tokens), and a
per-token confidence. Not thread-safe: InfillService serialises calls. Knows torch and
transformers; knows nothing of LSP or syntax.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator

import torch
from transformers import LogitsProcessor, LogitsProcessorList
from transformers.cache_utils import DynamicCache
from transformers.generation.streamers import BaseStreamer
from transformers.models.diffusion_gemma.generation_diffusion_gemma import EntropyBoundSamplerConfig

from ..api import DenoiseRequest, DenoiseResult, Draft, GenerationSettings, RawCandidate, Timings
from ..errors import BadRequestError, CancelledError
from ..kernels.compiled_step import CompiledDenoiser, compile_enabled
from ..model.cache_keyword import with_cache
from ..model.prompting import PromptBuilder, PromptIds
from ..weights.loading import load_model_and_tokenizer
from ..weights.memory_plan import default_prompt_cache_bytes
from .prompt_cache import PromptCache
from .rewriting import (
    KEEP_MODES,
    PinKeptTokens,
    SelectionCanvases,
    SelectionSampler,
    rewrite_schedule,
    turn_end_id,
)

MAX_CANDIDATES = 16
CONTROL_CHARACTERS = dict.fromkeys([*range(0x00, 0x09), 0x0B, 0x0C, *range(0x0E, 0x20), 0x7F])
"""C0 controls but tab/newline/CR: never code, and editors draw them badly (Neovim cuts virtual text at NUL)."""
DISABLED_EARLY_STOP = 1e-9
"""confidence_threshold that no canvas meets: None silently becomes 0.005 and 0.0 crashes (REFERENCE.md)."""
COMPILE_ENV = "DGEMMA_LSP_COMPILE"
"""--compile auto|on|off as set by the CLI (inherited by a daemon it spawns)."""

log = logging.getLogger(__name__)


class _Abort(Exception):
    """Raised inside the streamer to stop generate at a step boundary."""


class ConfidenceRecorder(LogitsProcessor):
    """Keeps the top-token probability of every canvas position at the latest step.

    Runs first in the processor list, so it sees the model's logits before the
    temperature schedule: the confidence does not depend on the step's temperature.
    """

    def __init__(self) -> None:
        self.latest: torch.Tensor | None = None  # [B, L]

    def __call__(self, input_ids: torch.LongTensor, scores: torch.Tensor, cur_step) -> torch.Tensor:
        # scores: [B, L, V]; max prob = exp(max logit - logsumexp) without a full softmax copy
        scores32 = scores.float()
        self.latest = torch.exp(scores32.max(dim=-1).values - torch.logsumexp(scores32, dim=-1))
        return scores


class DraftStreamer(BaseStreamer):
    """Receives generate's canvases: finished ones via put, the argmax canvas of each step via put_draft."""

    def __init__(
        self,
        decode_answer: Callable[[list[int]], str],
        recorder: ConfidenceRecorder,
        on_draft: Callable[[Draft], None] | None,
        cancel: threading.Event | None,
    ) -> None:
        self.decode_answer = decode_answer
        self.recorder = recorder
        self.on_draft = on_draft
        self.cancel = cancel
        self.steps = 0
        self.finished_rows: list[int] = []  # row 0's ids of finished canvases
        self.canvas_confidences: list[torch.Tensor] = []  # one [B, L] per finished canvas
        self._seen_prompt = False

    def put(self, value: torch.Tensor) -> None:
        if not self._seen_prompt:  # generate's first put is the prompt itself
            self._seen_prompt = True
            return
        self.finished_rows.extend(value[0].tolist())
        self.canvas_confidences.append(self.recorder.latest.cpu())

    def put_draft(self, value: torch.Tensor) -> None:
        # value: [B, L] argmax canvas after this step
        self.steps += 1
        if self.cancel is not None and self.cancel.is_set():
            raise _Abort
        if self.on_draft is not None:
            text = self.decode_answer(self.finished_rows + value[0].tolist())
            self.on_draft(Draft(step=self.steps, text=text))

    def end(self) -> None:
        pass


class DenoisingRuntime:
    """A resident model with its tokenizer, prompt builder and prompt cache."""

    def __init__(self, model, tokenizer, device: str) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.device = torch.device(device)
        self.prompts = PromptBuilder(tokenizer)
        self.prompt_cache = PromptCache(default_prompt_cache_bytes(str(self.device)))
        self.canvas_length: int = model.config.canvas_length
        self.vocab_size: int = model.config.text_config.vocab_size
        config = model.generation_config
        eos = config.eos_token_id if config.eos_token_id is not None else tokenizer.eos_token_id
        self.eos_ids: set[int] = set(eos if isinstance(eos, list) else [eos])
        # A rewrite's canvas ends the way the chat template ends a model turn (`<turn|>`);
        # an answer ends there too, whether or not the generation config lists it.
        self.turn_end_id: int | None = turn_end_id(tokenizer)
        if self.turn_end_id is not None:
            self.eos_ids.add(self.turn_end_id)
        self.pad_id: int = config.pad_token_id if config.pad_token_id is not None else tokenizer.pad_token_id
        self.default_steps: int = config.max_denoising_steps or 48
        self.memory_bytes: int = _resident_bytes(model)
        """Bytes of the model's parameters and buffers; fixed once loaded (status reads it often)."""
        self.compiled: CompiledDenoiser | None = None
        """Denoising steps as CUDA graph replays (compiled_step.py); None: transformers' generate."""

    @property
    def context_tokens(self) -> int | None:
        """The most context the model reads well (EngineStatus.context_tokens); None: no limit."""
        return self.prompts.layout.context_tokens

    @classmethod
    def load(cls, spec: str, *, device=None, dtype=None, quantization="none", allow_download=False, compile=None,
             progress=None, cpu_threads: int | None = None):
        """`progress(done, total)` runs after each checkpoint shard (loading.load_model_and_tokenizer);
        `cpu_threads` sets torch's intra-op threads for this process (None: leave torch's default)."""
        if cpu_threads is not None:
            torch.set_num_threads(cpu_threads)
        model, tokenizer, device = load_model_and_tokenizer(
            spec, device=device, dtype=dtype, quantization=quantization, allow_download=allow_download,
            progress=progress,
        )
        runtime = cls(model, tokenizer, device)
        if compile_enabled(compile or os.environ.get(COMPILE_ENV, "auto"), runtime.device):
            # The fused decoder kernels first; if they fail on this card, the step with transformers' decoder.
            for fused in (None, False):
                runtime.compiled = CompiledDenoiser(model, capture=True, eos_ids=runtime.eos_ids,
                                                    pad_id=runtime.pad_id, fused=fused)  # fmt: skip
                try:  # capture while the engine says "loading", not in the user's first request
                    runtime.compiled.warm_up()
                    break
                except Exception:
                    unfused = runtime.compiled.fused is None
                    log.exception("capturing the denoising step (fused decoder: %s) failed", not unfused)
                    runtime.compiled.clear()
                    runtime.compiled = None
                    if unfused:
                        break
            if runtime.compiled is None:
                log.warning("no captured denoising step; transformers' generate serves instead")
        return runtime

    def set_prompt_cache_budget(self, max_bytes: int | None) -> None:
        """Bound the prompt cache's snapshots to `max_bytes`; None sizes it from the memory free now."""
        self.prompt_cache.resize(max_bytes if max_bytes is not None else default_prompt_cache_bytes(str(self.device)))

    @property
    def device_name(self) -> str:
        return str(self.device)

    def close(self) -> None:
        self.prompt_cache.clear()
        if self.compiled is not None:
            self.compiled.clear()
        del self.model
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    # -- one request -----------------------------------------------------------

    @torch.no_grad()
    def run(
        self,
        request: DenoiseRequest,
        on_draft: Callable[[Draft], None] | None = None,
        cancel: threading.Event | None = None,
    ) -> DenoiseResult:
        started = time.perf_counter()
        settings = request.settings
        _validate(settings, request)
        batch = settings.candidates
        steps = settings.steps or self.default_steps
        rewriting = request.selection is not None
        original = request.selection if rewriting and request.rewrite_keep != "canvas" else None
        prompt = self.prompts.build(request.context, rewrite=rewriting, original=original, layout=settings.prompt_layout,
                                    edits=request.recent_edits if rewriting else None)
        if self.compiled is not None and not rewriting:
            result = self._run_compiled(request, prompt, steps, started, on_draft, cancel)
            if result is not None:
                return result
        cache, cached_tokens = self._encode_prompt(prompt, request.cache_key, batch)
        prompt_ms = (time.perf_counter() - started) * 1000

        seed = settings.seed if settings.seed is not None else int.from_bytes(os.urandom(4), "little")
        torch.manual_seed(seed)
        extra: dict = {**_temperature_overrides(settings)}
        max_tokens = settings.max_tokens or self.canvas_length
        recorder = ConfidenceRecorder()
        processors = LogitsProcessorList([recorder])
        sampler = None
        if rewriting:
            steps, sampler, rewrite_extra = self._rewrite_setup(request, steps, batch, processors)
            extra.update(rewrite_extra)
            max_tokens = max(settings.max_tokens or 0, sampler.canvases.count * self.canvas_length)

        streamer = DraftStreamer(self._decode_answer, recorder, on_draft, cancel)
        last_token = torch.tensor([prompt.tail[-1:]] * batch, device=self.device)  # [B, 1]
        denoise_started = time.perf_counter()
        if cancel is not None and cancel.is_set():
            raise CancelledError("request cancelled before denoising")
        try:
            with self._sampler(sampler):
                output = self.model.generate(
                    last_token,
                    **with_cache(cache),
                    streamer=streamer,
                    logits_processor=processors,
                    max_new_tokens=max_tokens,
                    max_denoising_steps=steps,
                    sampler_config=EntropyBoundSamplerConfig(entropy_bound=self._entropy_bound(settings)),
                    **({} if settings.early_stop else {"confidence_threshold": DISABLED_EARLY_STOP}),
                    **extra,
                )
        except _Abort:
            raise CancelledError(f"request cancelled after {streamer.steps} denoising steps") from None
        except ValueError as error:  # generation_config.validate() rejecting a knob combination
            raise BadRequestError(f"invalid generation settings: {error}") from None
        denoise_ms = (time.perf_counter() - denoise_started) * 1000

        answers = output.sequences[:, 1:].tolist()  # [B, canvases * L]; input was the one tail token
        confidences = torch.cat(streamer.canvas_confidences, dim=-1)  # [B, canvases * L]
        candidates = [self._candidate(row, confidences[index]) for index, row in enumerate(answers)]
        total_ms = (time.perf_counter() - started) * 1000
        return DenoiseResult(
            candidates=candidates,
            steps=streamer.steps,
            tokens_per_forward=float(output.tokens_per_forward.float().mean()),
            drafts=streamer.steps,
            canvases=len(streamer.canvas_confidences),
            prompt_tokens=len(prompt.all),
            cached_prompt_tokens=cached_tokens,
            timings_ms=Timings(prompt=prompt_ms, denoise=denoise_ms, total=total_ms),
        )

    # -- pieces ----------------------------------------------------------------

    def _encode_prompt(self, prompt: PromptIds, cache_key: str | None, batch: int):
        """Encoder cache holding every prompt id but the last (generate encodes that one)."""
        stable = prompt.stable or prompt.tail[:1]
        rest = prompt.tail[:-1] if prompt.stable else prompt.tail[1:-1]
        cache, cached_tokens = self.prompt_cache.checkout(cache_key, stable, self._encode_fresh)
        if rest:
            self._encode_into(cache, rest)
        if batch > 1:
            cache.batch_repeat_interleave(batch)
        return cache, cached_tokens

    def _encode_fresh(self, ids: list[int]) -> DynamicCache:
        cache = DynamicCache(config=self.model.config.get_text_config(decoder=True))
        self._encode_into(cache, ids)
        return cache

    def _encode_into(self, cache: DynamicCache, ids: list[int]) -> None:
        input_ids = torch.tensor([ids], device=self.device)  # [1, T]
        self.model.model.encoder(input_ids=input_ids, **with_cache(cache))

    def _rewrite_setup(self, request: DenoiseRequest, full_steps: int, batch: int, processors):
        """Steps, sampler and generate kwargs of a rewrite: start at time `strength` (rewriting.py)."""
        config = self.model.generation_config
        t_max = request.settings.t_max or config.t_max or 0.8
        t_min = request.settings.t_min or config.t_min or 0.4
        schedule = rewrite_schedule(request.strength, full_steps, t_max, t_min)
        end_id = self.turn_end_id if self.turn_end_id is not None else min(self.eos_ids)
        ids = self.tokenizer(request.selection, add_special_tokens=False)["input_ids"]
        canvases = SelectionCanvases(
            ids, end_id, self.pad_id, self.canvas_length, self.vocab_size, request.strength, batch, self.device
        )
        if request.rewrite_keep != "prompt":
            # generate's input is one token: input_ids' length at the first canvas is 1.
            processors.append(PinKeptTokens(canvases, prompt_length=1, end_ids=sorted(self.eos_ids)))
        sampler = SelectionSampler(canvases, self._entropy_bound(request.settings), self.vocab_size, schedule.steps)
        extra = {"t_max": schedule.t_start, "t_min": t_min, "eos_token_id": sorted(self.eos_ids),
                 "pad_token_id": self.pad_id}
        return schedule.steps, sampler, extra

    @contextlib.contextmanager
    def _sampler(self, sampler) -> Iterator[None]:
        """Hand generate our sampler: `_prepare_sampler` is the one hook it offers (no sampler= argument)."""
        if sampler is None:
            yield
            return
        self.model._prepare_sampler = lambda generation_config: sampler
        try:
            yield
        finally:
            del self.model._prepare_sampler

    def _answer_length(self, ids: list[int]) -> int:
        for position, token in enumerate(ids):
            if token in self.eos_ids:
                return position
        return len(ids)

    def _decode_answer(self, ids: list[int]) -> str:
        ids = ids[: self._answer_length(ids)]
        text = self.tokenizer.decode([t for t in ids if t != self.pad_id], skip_special_tokens=True)
        return text.translate(CONTROL_CHARACTERS)

    def _candidate(self, ids: list[int], confidences: torch.Tensor) -> RawCandidate:
        length = self._answer_length(ids)
        # The EOS position counts too: stopping there was also the model's decision.
        decided = confidences[: min(length + 1, len(confidences))]
        return RawCandidate(
            text=self._decode_answer(ids),
            confidence=float(decided.mean()) if len(decided) else 0.0,
            tokens=length,
        )

    def _run_compiled(self, request, prompt: PromptIds, steps: int, started: float, on_draft, cancel):
        """The request on CUDA graphs; None after a failure there (then generate serves it, and all later ones)."""
        settings, config = request.settings, self.model.generation_config
        seed = settings.seed if settings.seed is not None else int.from_bytes(os.urandom(4), "little")

        def on_step(step: int, ids: list[int]) -> None:
            if cancel is not None and cancel.is_set():
                raise _Abort
            if on_draft is not None:
                on_draft(Draft(step=step, text=self._decode_answer(ids)))

        denoise_started = time.perf_counter()
        try:
            output = self.compiled.denoise(
                stable=prompt.stable, tail=prompt.tail, cache_key=request.cache_key,
                batch=settings.candidates, steps=steps, max_tokens=settings.max_tokens or self.canvas_length,
                entropy_bound=self._entropy_bound(settings),
                t_min=float(settings.t_min or config.t_min), t_max=float(settings.t_max or config.t_max),
                confidence_threshold=config.confidence_threshold if settings.early_stop else None,
                seed=seed, on_step=on_step,
            )  # fmt: skip
        except _Abort:
            raise CancelledError("request cancelled during compiled denoising") from None
        except Exception:
            log.exception("compiled denoising failed; transformers' generate serves from now on")
            self.compiled = None
            return None
        now = time.perf_counter()
        candidates = [self._candidate(row, output.confidences[i]) for i, row in enumerate(output.answers)]
        return DenoiseResult(
            candidates=candidates,
            steps=output.steps,
            tokens_per_forward=sum(c.tokens for c in candidates) / len(candidates) / max(output.steps, 1),
            drafts=output.steps,
            canvases=output.canvases,
            prompt_tokens=len(prompt.all),
            cached_prompt_tokens=output.cached_tokens,
            timings_ms=Timings(prompt=(denoise_started - started) * 1000, denoise=(now - denoise_started) * 1000,
                               total=(now - started) * 1000),  # fmt: skip
        )

    def _entropy_bound(self, settings: GenerationSettings) -> float:
        sampler = self.model.generation_config.sampler_config
        return float(settings.entropy_bound or getattr(sampler, "entropy_bound", None) or 0.1)


def _resident_bytes(model) -> int:
    storages = {}  # tied weights share a storage: count each once
    for tensor in list(model.parameters()) + list(model.buffers()):
        storages[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
    return sum(storages.values())


def _temperature_overrides(settings: GenerationSettings) -> dict:
    overrides = {}
    if settings.t_max is not None:
        overrides["t_max"] = float(settings.t_max)
    if settings.t_min is not None:
        overrides["t_min"] = float(settings.t_min)
    return overrides


def _validate(settings: GenerationSettings, request: DenoiseRequest) -> None:
    problems = []
    if not 1 <= settings.candidates <= MAX_CANDIDATES:
        problems.append(f"candidates must be 1..{MAX_CANDIDATES}, got {settings.candidates}")
    if settings.steps is not None and settings.steps < 1:
        problems.append(f"steps must be >= 1, got {settings.steps}")
    if settings.max_tokens is not None and settings.max_tokens < 1:
        problems.append(f"maxTokens must be >= 1, got {settings.max_tokens}")
    if settings.entropy_bound is not None and settings.entropy_bound <= 0:
        problems.append(f"entropyBound must be > 0, got {settings.entropy_bound}")
    for name, value in (("tMax", settings.t_max), ("tMin", settings.t_min)):
        if value is not None and value <= 0:
            problems.append(f"{name} must be > 0, got {value}")
    if settings.t_max is not None and settings.t_min is not None and settings.t_max <= settings.t_min:
        problems.append("tMax must be greater than tMin")
    if request.selection is not None and not 0.0 < request.strength <= 1.0:
        problems.append(f"strength must be in (0, 1], got {request.strength}")
    if request.selection is not None and request.rewrite_keep not in KEEP_MODES:
        problems.append(f"rewrite_keep must be one of {', '.join(KEEP_MODES)}, got {request.rewrite_keep!r}")
    if problems:
        raise BadRequestError("; ".join(problems))
