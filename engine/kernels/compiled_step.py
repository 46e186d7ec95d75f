"""The denoising loop with each step inside a CUDA graph (`--compile auto|on|off`).

Owns: the static prompt cache (a StaticCache per (candidates, length
bucket), the stable part of a prompt restored into it by copies), one captured
denoising step per (candidates, bucket, sliding-window state), the per-step
device inputs (canvas, self-conditioning logits, temperature, seed, masks) and
the loop around the replays: drafts copied out non-blocking into pinned host
memory, cancellation checked after every step, early stop, several canvases.
Knows transformers' DiffusionGemma pieces it drives (encoder, decoder, lm_head,
the decoder's static-cache mask and self-conditioning signal) and the sampler semantics (`fused_sampler`);
knows nothing of prompts as text, LSP or requests beyond plain arguments.

Why not transformers' own compiled path: `generate` compiles only when handed
a StaticCache, recompiles per prompt-length class, runs its sampler over fp32
logits with ~20 passes and syncs the host every step (`.cpu()`, `torch.all`).
Here one graph replay is the whole step: decoder forward, lm_head, and the
fused sampler (softcap, temperature, Gumbel-max sample, argmax, entropy,
confidence, acceptance, renoising, early-stop state) — no fp32 copy of the
logits and no host sync inside a step. The decoder forward is `fused_decoder`'s
(norms, rotary, cache append and router in fused kernels: 12 kernels a quantized
layer instead of ~150) wherever the model allows it; `fused=False` keeps
transformers' decoder (the A/B baseline, `bench step --fused on,off`).
Without CUDA (`capture=False`) the same step runs eagerly, which is how the
CPU tests exercise it (the fused kernels then need TRITON_INTERPRET=1).

Status: CPU-tested in eager mode (restore equivalence, the loop against
transformers' generate, fused and not); captured and timed on an H200 with
transformers' decoder (bench/RESULTS.md); the fused decoder has not yet run on a GPU.
A failure to capture the fused step at load retries with transformers' decoder;
a failure in capture or in a compiled request then makes the runtime fall back
to `generate` for good (denoising.py), so `auto` cannot take the product down.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import logging
from collections.abc import Callable, Iterator
from typing import Literal

import torch
from transformers.cache_utils import StaticCache

from ..errors import ModelLoadError
from ..model.cache_keyword import with_cache

# fused_sampler (and so triton) is imported where a step runs: a CPU-only install has no triton.

log = logging.getLogger(__name__)

CompileMode = Literal["auto", "on", "off"]
COMPILE_MODES: tuple[CompileMode, ...] = ("auto", "on", "off")
MIN_BUCKET = 512
"""Smallest cache length; buckets double from here, so at most ~8 graphs per batch size up to 64k tokens."""
SNAPSHOTS_KEPT = 4
"""Stable-part snapshots kept (one per recently edited document, roughly)."""
WARM_STEPS = 2
"""Eager runs on a side stream before a capture: lazy allocations and autotuning happen there, not in the graph."""
WARM_PROMPT_TOKENS = 1536
"""The load-time warm-up's prompt: past the real model's 1,024-token sliding window, in the 2,048 bucket."""
SOFTMAX_SLICES = 16
"""The self-conditioning softmax runs over the logits' rows in this many slices (`soft_embeddings`)."""


def compile_enabled(mode: str, device: torch.device) -> bool:
    """auto: on for CUDA; on: CUDA required (a clear error otherwise); off: never."""
    if mode not in COMPILE_MODES:
        raise ModelLoadError(f"--compile must be one of {', '.join(COMPILE_MODES)}, got {mode!r}")
    if mode == "on" and device.type != "cuda":
        raise ModelLoadError(f"--compile on needs a CUDA device, the model is on {device}")
    return mode != "off" and device.type == "cuda"


def bucket_for(tokens: int) -> int:
    """The smallest doubling of MIN_BUCKET that holds `tokens`."""
    bucket = MIN_BUCKET
    while bucket < tokens:
        bucket *= 2
    return bucket


@dataclasses.dataclass
class _Snapshot:
    """A StaticCache's state after a stable prefix, at batch 1 (copies, not views)."""

    ids: tuple[int, ...]
    keys: list[torch.Tensor]  # per layer [1, H, n or window, D]
    values: list[torch.Tensor]
    lengths: list[torch.Tensor]  # per layer cumulative_length (tensor)
    sliding_lengths: list[int | None]  # per layer cumulative_length_int (sliding layers)


class StaticPromptCache:
    """Live StaticCaches per (batch, bucket) and snapshots of stable prefixes restored into them by copy."""

    def __init__(self, model) -> None:
        self.model = model
        self.text_config = model.config.get_text_config(decoder=True)
        self.live: dict[tuple[int, int], StaticCache] = {}
        self.snapshots: collections.OrderedDict[tuple[str | None, int], _Snapshot] = collections.OrderedDict()

    def checkout(self, key: str | None, stable: list[int], batch: int, bucket: int) -> tuple[StaticCache, int]:
        """The live cache of (batch, bucket) holding `stable`; returns it and how many ids were reused."""
        snapshot = self.snapshots.get((key, bucket))
        reused = len(stable) if snapshot is not None and snapshot.ids == tuple(stable) else 0
        if not reused:
            snapshot = self._snapshot(stable, bucket)
            self.snapshots[(key, bucket)] = snapshot
            while len(self.snapshots) > SNAPSHOTS_KEPT:
                self.snapshots.popitem(last=False)
        self.snapshots.move_to_end((key, bucket))
        live = self.live.get((batch, bucket))
        if live is None:
            live = self.live[(batch, bucket)] = StaticCache(config=self.text_config, max_cache_len=bucket)
        restore(live, snapshot, batch)
        return live, reused

    def _snapshot(self, stable: list[int], bucket: int) -> _Snapshot:
        scratch = StaticCache(config=self.text_config, max_cache_len=bucket)
        device = self.model.device
        self.model.model.encoder(input_ids=torch.tensor([stable], device=device), **with_cache(scratch))
        return take_snapshot(scratch, stable)

    def clear(self) -> None:
        self.live.clear()
        self.snapshots.clear()


def take_snapshot(cache: StaticCache, ids: list[int]) -> _Snapshot:
    """Copy what a restore needs: full layers up to the prefix length, sliding layers whole."""
    keys, values, lengths, sliding = [], [], [], []
    for layer in cache.layers:
        if layer.is_sliding:
            keys.append(layer.keys.clone())
            values.append(layer.values.clone())
            sliding.append(layer.cumulative_length_int)
        else:
            keys.append(layer.keys[:, :, : len(ids)].clone())
            values.append(layer.values[:, :, : len(ids)].clone())
            sliding.append(None)
        lengths.append(layer.cumulative_length.clone())
    return _Snapshot(tuple(ids), keys, values, lengths, sliding)


def restore(cache: StaticCache, snapshot: _Snapshot, batch: int) -> None:
    """Put `snapshot` into `cache` in place (its tensors keep their addresses: captured graphs read them)."""
    for index, layer in enumerate(cache.layers):
        keys, values = snapshot.keys[index], snapshot.values[index]
        if not layer.is_initialized:
            # lazy_initialization reads only shapes, dtype and device from its arguments.
            layer.lazy_initialization(keys.expand(batch, -1, -1, -1), values.expand(batch, -1, -1, -1))
        span = keys.shape[2]
        layer.keys[:, :, :span].copy_(keys)  # broadcasts the batch-1 snapshot over the candidates
        layer.values[:, :, :span].copy_(values)
        layer.cumulative_length.copy_(snapshot.lengths[index])
        if snapshot.sliding_lengths[index] is not None:
            layer.cumulative_length_int = snapshot.sliding_lengths[index]


def soft_embeddings(decoder, logits: torch.Tensor, mask: torch.Tensor | None,
                    slices: int = SOFTMAX_SLICES) -> torch.Tensor:  # fmt: skip
    """transformers' self-conditioning signal, the same values, with the fp32 softmax a slice of rows at a time.

    transformers (DiffusionGemmaDecoderModel.forward, 5.24) computes
    `matmul(logits.softmax(-1, dtype=float32).to(embed dtype), embed.weight) * embed_scale`, times the
    mask. On bf16 logits ATen's `softmax(dtype=float32)` first converts the whole input to fp32 (its
    fused half-to-float path is for fp16 only, on CUDA as here), so that line holds two fp32 copies of
    the `[B, L, V]` logits at once — 2.1 GB at 4 candidates, the dry run's peak on a 24 GB card.
    Here the bf16 probabilities are filled a slice of rows at a time (a softmax over the last dim is
    per row: the same values) and the matmul is transformers' own, over the whole tensor (the same GEMM).
    logits: [B, L, V]; mask: [B] bool or None; returns [B, L, H] in the embeddings' dtype.
    """
    embed = decoder.embed_tokens
    dtype = embed.weight.dtype
    rows = logits.reshape(-1, logits.shape[-1])  # [B*L, V], a view of the contiguous buffer
    probabilities = torch.empty(rows.shape, dtype=dtype, device=rows.device)  # [B*L, V]
    span = -(-rows.shape[0] // slices)
    for start in range(0, rows.shape[0], span):
        # copy_ into bf16 rounds as `.to(dtype)` does; the fp32 slices are 2 / slices of the logits' bytes.
        probabilities[start : start + span].copy_(rows[start : start + span].softmax(dim=-1, dtype=torch.float32))
    signal = torch.matmul(probabilities.view(logits.shape), embed.weight) * embed.embed_scale.to(dtype)
    if mask is not None:
        signal = signal * mask.to(signal.dtype)[:, None, None]
    return signal


@contextlib.contextmanager
def self_conditioning_signal(decoder, signal: torch.Tensor) -> Iterator[None]:
    """The decoder's self-conditioning block gets `signal` instead of the zeros transformers passes it
    when called without self-conditioning logits (`self.self_conditioning(inputs_embeds, zeros)`)."""

    def replace(module, args):
        assert len(args) == 2, "DiffusionGemmaSelfConditioning is called as (inputs_embeds, signal)"
        return args[0], signal

    handle = decoder.self_conditioning.register_forward_pre_hook(replace)
    try:
        yield
    finally:
        handle.remove()


@dataclasses.dataclass
class _StepBuffers:
    """The device tensors one captured step reads and writes; refilled before each replay."""

    canvas: torch.Tensor  # [B, L] int64, replaced by the next canvas
    self_conditioning: torch.Tensor  # [B, L, V] model dtype: the last step's tempered logits
    self_conditioning_on: torch.Tensor  # [B] bool: False on the first step (no self-conditioning yet)
    positions: torch.Tensor  # [1, L] int32
    inv_temperature: torch.Tensor  # [1] fp32
    seed: torch.Tensor  # [1] int64
    entropy_bound: torch.Tensor  # [] fp32
    confidence_threshold: torch.Tensor  # [] fp32; early stop when the mean entropy is below it
    masks: dict  # the decoder's attention masks (tensors copied in per canvas)
    rotary: dict  # layer type -> (cos, sin) [L, D] of the canvas positions (fused decoder; set per canvas)
    argmax: torch.Tensor  # out [B, L] int64: the draft
    confidence: torch.Tensor  # out [B, L] fp32
    finished: torch.Tensor  # [B] bool: stable and confident (early stop), sticky within a canvas


@dataclasses.dataclass
class DenoiseOutput:
    """The compiled loop's result, in the shapes `DenoisingRuntime` builds candidates from."""

    answers: list[list[int]]  # [B, canvases * L]
    confidences: torch.Tensor  # [B, canvases * L] on the CPU
    steps: int
    canvases: int
    cached_tokens: int


class CompiledDenoiser:
    """Denoising steps as graph replays (or eager calls of the same step without CUDA)."""

    def __init__(self, model, *, capture: bool, eos_ids: set[int], pad_id: int, fused: bool | None = None) -> None:
        """`fused`: the decoder's non-expert work and the step's tail in fused kernels (`fused_decoder`);
        None: wherever the model allows it; False: transformers' decoder and torch ops (the A/B baseline)."""
        from .fused_decoder import FusedDecoder, unsupported

        self.model = model
        self.capture = capture
        reason = unsupported(model)
        if fused and reason is not None:
            raise ModelLoadError(f"the fused decoder cannot run this model: {reason}")
        self.fused = FusedDecoder(model) if (fused is None and reason is None) or fused else None
        self.eos_ids = eos_ids
        self.pad_id = pad_id
        self.device = model.device
        self.canvas_length: int = model.config.canvas_length
        self.vocab: int = model.config.text_config.vocab_size
        self.softcap: float = float(model.config.text_config.final_logit_softcapping or 0.0)
        self.prompt_cache = StaticPromptCache(model)
        self.graphs: dict[tuple, tuple[_StepBuffers, Callable[[], None]]] = {}
        # One memory pool for every captured step: they never run at once, and a pool per
        # graph would hold a [B, L, V] logits' worth of activations per (batch, bucket).
        self.pool = torch.cuda.graph_pool_handle() if capture else None
        self.host: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        """Per batch: pinned (draft [B, L], finished [B]) the steps are copied into (pinning costs ms; once)."""

    # -- the loop -------------------------------------------------------------

    @torch.no_grad()
    def denoise(
        self,
        *,
        stable: list[int],
        tail: list[int],
        cache_key: str | None,
        batch: int,
        steps: int,
        max_tokens: int,
        entropy_bound: float,
        t_min: float,
        t_max: float,
        confidence_threshold: float | None,
        seed: int,
        on_step: Callable[[int, list[int]], None],
        start: torch.Tensor | None = None,
    ) -> DenoiseOutput:
        """Denoise canvases after `stable + tail`; `on_step(step, row-0 ids so far)` may raise to cancel.

        `start` `[B, L]` replaces the first canvas's uniform noise (a rewrite's partly renoised selection).
        """
        from .fused_sampler import temperature

        if not stable:  # the snapshot needs at least one id
            stable, tail = tail[:1], tail[1:]
        canvases_wanted = -(-max_tokens // self.canvas_length)
        prompt_length = len(stable) + len(tail)
        bucket = bucket_for(prompt_length + canvases_wanted * self.canvas_length)
        cache, cached_tokens = self.prompt_cache.checkout(cache_key, stable, batch, bucket)
        generator = torch.Generator().manual_seed(seed)  # host seeds per step: reproducible by request seed
        answers: list[list[int]] = [[] for _ in range(batch)]
        confidences = []
        ids_so_far: list[int] = []
        step_count = 0
        new_ids = tail
        length = len(stable)
        for _ in range(canvases_wanted):
            if new_ids:
                ids = torch.tensor([new_ids] * batch, device=self.device)  # [B, T]
                self.model.model.encoder(input_ids=ids, **with_cache(cache))
                length += len(new_ids)
            buffers, step = self._step_for(cache, batch, bucket)
            self._start_canvas(buffers, cache, batch, length, entropy_bound, confidence_threshold, generator)
            if start is not None:
                buffers.canvas.copy_(start)
                start = None
            if batch not in self.host:
                self.host[batch] = (
                    torch.empty((batch, self.canvas_length), dtype=torch.int64, pin_memory=self.capture),
                    torch.empty((batch,), dtype=torch.bool, pin_memory=self.capture),
                )
            draft_host, finished_host = self.host[batch]
            for cur_step in range(steps, 0, -1):  # steps left, N .. 1, as transformers counts them
                buffers.inv_temperature.fill_(1.0 / temperature(cur_step, steps, t_min, t_max))
                buffers.seed.fill_(int(torch.randint(0, 2**62, (1,), generator=generator)))
                step()
                draft_host.copy_(buffers.argmax, non_blocking=True)
                finished_host.copy_(buffers.finished, non_blocking=True)
                if self.capture:
                    torch.cuda.current_stream(self.device).synchronize()
                buffers.self_conditioning_on.fill_(True)
                step_count += 1
                on_step(step_count, ids_so_far + draft_host[0].tolist())
                if confidence_threshold is not None and bool(finished_host.all()):
                    break
            canvas = buffers.argmax.clone()  # [B, L]: the emitted canvas is the argmax canvas
            # ... which the last step already copied out: no second device-to-host read per canvas.
            rows = draft_host.tolist()
            confidences.append(buffers.confidence.float().cpu())
            for row, answer in zip(rows, answers, strict=True):
                answer.extend(row)
            ids_so_far += rows[0]
            if all(any(token in self.eos_ids for token in row) for row in rows):
                break
            new_ids = None
            self.model.model.encoder(input_ids=canvas, **with_cache(cache))
            length += self.canvas_length
        return DenoiseOutput(
            answers=answers,
            confidences=torch.cat(confidences, dim=-1),
            steps=step_count,
            canvases=len(confidences),
            cached_tokens=cached_tokens,
        )

    def warm_up(self, *, prompt_tokens: int = WARM_PROMPT_TOKENS, batches: tuple[int, ...] = (1,)) -> None:
        """Compile the kernels and capture the steps a typical request needs, during loading.

        A dummy prompt of `prompt_tokens` ids; one step per batch size. Other
        (batch, bucket) classes are captured by their first request.
        """
        prompt = [self.pad_id + 1] * prompt_tokens
        for batch in batches:
            self.denoise(stable=prompt[:-1], tail=prompt[-1:], cache_key=None, batch=batch, steps=1,
                         max_tokens=self.canvas_length, entropy_bound=0.1, t_min=0.4, t_max=0.8,
                         confidence_threshold=None, seed=0, on_step=lambda step, ids: None)  # fmt: skip
        self.prompt_cache.snapshots.clear()  # the dummy prefix is nobody's document

    # -- one step -------------------------------------------------------------

    def _step_for(self, cache: StaticCache, batch: int, bucket: int):
        """The step for this shape class: captured once per (batch, bucket, sliding state), then replayed."""
        sliding_full = tuple(
            layer.cumulative_length_int >= layer.max_cache_len for layer in cache.layers if layer.is_sliding
        )
        key = (batch, bucket, sliding_full)
        if key not in self.graphs:
            buffers = self._new_buffers(cache, batch)
            run = self._eager_step(buffers, cache)
            self.graphs[key] = (buffers, self._capture(run) if self.capture else run)
        return self.graphs[key]

    def _new_buffers(self, cache: StaticCache, batch: int) -> _StepBuffers:
        device, length = self.device, self.canvas_length
        dtype = self.model.model.decoder.embed_tokens.weight.dtype
        canvas = torch.zeros((batch, length), dtype=torch.int64, device=device)
        masks = self._masks(cache, canvas, batch)
        return _StepBuffers(
            canvas=canvas,
            self_conditioning=torch.zeros((batch, length, self.vocab), dtype=dtype, device=device),
            self_conditioning_on=torch.zeros((batch,), dtype=torch.bool, device=device),
            positions=torch.zeros((1, length), dtype=torch.int32, device=device),
            inv_temperature=torch.ones(1, dtype=torch.float32, device=device),
            seed=torch.zeros(1, dtype=torch.int64, device=device),
            entropy_bound=torch.zeros((), dtype=torch.float32, device=device),
            confidence_threshold=torch.zeros((), dtype=torch.float32, device=device),
            masks={name: (m.clone() if isinstance(m, torch.Tensor) else m) for name, m in masks.items()},
            rotary=(
                {name: (cos.clone(), sin.clone()) for name, (cos, sin) in
                 self.fused.rotary(torch.zeros((1, length), dtype=torch.int32, device=device), dtype).items()}
                if self.fused is not None else {}
            ),  # fmt: skip
            argmax=torch.full((batch, length), -1, dtype=torch.int64, device=device),
            confidence=torch.zeros((batch, length), dtype=torch.float32, device=device),
            finished=torch.zeros((batch,), dtype=torch.bool, device=device),
        )

    def _masks(self, cache: StaticCache, canvas: torch.Tensor, batch: int) -> dict:
        length = cache.get_seq_length()
        decoder_mask = torch.ones((batch, int(length) + self.canvas_length), dtype=torch.bool, device=self.device)
        # Positional: transformers 5.24 renamed the cache argument (past_key_values -> cache).
        masks = self.model.model.decoder.create_diffusion_decoder_attention_mask(
            self.model.config, canvas.unsqueeze(-1), cache, decoder_mask,
        )
        masks = dict(masks) if masks is not None else {}
        return self.fused.attention_masks(masks) if self.fused is not None else masks  # folded once a canvas

    def _start_canvas(self, buffers, cache, batch, length, entropy_bound, confidence_threshold, generator) -> None:
        start = torch.randint(0, self.vocab, (batch, self.canvas_length), generator=generator)
        buffers.canvas.copy_(start)
        buffers.self_conditioning_on.fill_(False)
        buffers.positions.copy_(torch.arange(length, length + self.canvas_length, dtype=torch.int32)[None])
        buffers.entropy_bound.fill_(entropy_bound)
        # No early stop: a threshold no mean entropy is below.
        buffers.confidence_threshold.fill_(confidence_threshold if confidence_threshold is not None else -1.0)
        buffers.argmax.fill_(-1)
        buffers.finished.fill_(False)
        for name, mask in self._masks(cache, buffers.canvas, batch).items():
            if isinstance(mask, torch.Tensor):
                buffers.masks[name].copy_(mask)
        if self.fused is not None:
            dtype = self.model.model.decoder.embed_tokens.weight.dtype
            for name, (cos, sin) in self.fused.rotary(buffers.positions, dtype).items():
                buffers.rotary[name][0].copy_(cos)
                buffers.rotary[name][1].copy_(sin)

    def _eager_step(self, buffers: _StepBuffers, cache: StaticCache) -> Callable[[], None]:
        from .fused_sampler import accept_and_update, sample_logits

        model = self.model
        assert isinstance(model.lm_head, torch.nn.Linear) and model.lm_head.bias is None, "lm_head is a plain linear"
        lm_head = model.lm_head.weight  # [V, H], tied to the embeddings and never quantized

        decoder = model.model.decoder
        fused = self.fused

        def step() -> None:
            if fused is not None:
                hidden = fused.forward(buffers.canvas, buffers.self_conditioning, buffers.self_conditioning_on,
                                       cache, buffers.masks, buffers.rotary)  # fmt: skip
            else:
                # Last step's logits to soft embeddings here rather than in transformers' decoder (the same
                # values, a fraction of its memory: `soft_embeddings`), handed to its self-conditioning block.
                signal = soft_embeddings(decoder, buffers.self_conditioning, buffers.self_conditioning_on)
                with self_conditioning_signal(decoder, signal):
                    hidden = decoder(
                        decoder_input_ids=buffers.canvas,
                        decoder_attention_mask=buffers.masks or None,
                        **with_cache(cache),
                        decoder_position_ids=buffers.positions,
                    ).last_hidden_state
            # The logits go straight into the self-conditioning buffer (the decoder has read last step's
            # already) and the sampler rewrites them there, scaled: no second [B, L, V] tensor (0.5 GB
            # in bf16 at 4 candidates). The softcap happens in the sampler.
            flat_logits = buffers.self_conditioning.view(-1, self.vocab)  # [B*L, V]
            torch.mm(hidden.reshape(-1, hidden.shape[-1]), lm_head.t(), out=flat_logits)
            sampled = sample_logits(
                buffers.self_conditioning, buffers.inv_temperature, buffers.seed,
                scaled_out=buffers.self_conditioning, softcap=self.softcap,
            )  # fmt: skip
            if fused is not None:
                accept_and_update(
                    sampled, canvas=buffers.canvas, draft=buffers.argmax, confidence=buffers.confidence,
                    finished=buffers.finished, entropy_bound=buffers.entropy_bound,
                    confidence_threshold=buffers.confidence_threshold, seed=buffers.seed, vocab=self.vocab,
                )  # fmt: skip
                return
            frozen = buffers.finished[:, None]  # finished rows keep their canvas, as in transformers
            sorted_entropy, order = torch.sort(sampled.entropy, dim=-1)
            selected = torch.cumsum(sorted_entropy, dim=-1) - sorted_entropy <= buffers.entropy_bound
            accepted = torch.zeros_like(selected).scatter(-1, order, selected)
            noise = torch.randint(0, self.vocab, buffers.canvas.shape, device=buffers.canvas.device)
            following = torch.where(accepted, sampled.sample, noise)
            stable = (sampled.argmax == buffers.argmax).all(dim=-1)
            confident = sampled.entropy.mean(dim=-1) < buffers.confidence_threshold
            buffers.canvas.copy_(torch.where(frozen, buffers.canvas, following))
            buffers.argmax.copy_(torch.where(frozen, buffers.argmax, sampled.argmax))
            buffers.confidence.copy_(torch.where(frozen, buffers.confidence, sampled.confidence))
            buffers.finished.logical_or_(stable & confident)

        return step

    def _capture(self, run: Callable[[], None]) -> Callable[[], None]:
        """Warm `run` up on a side stream, capture it into a CUDA graph, return its replay."""
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _ in range(WARM_STEPS):
                run()
        torch.cuda.current_stream(self.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            run()
        log.info("captured a denoising step (%d graphs now)", len(self.graphs) + 1)
        return graph.replay

    def clear(self) -> None:
        self.graphs.clear()
        self.prompt_cache.clear()
