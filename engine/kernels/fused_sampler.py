"""One pass over the denoiser's logits per step: temperature, sample, argmax, entropy, confidence.

Owns the sampling half of a denoising step for the compiled path
(`compiled_step`): a Triton kernel that reads each canvas position's logits
`[V]` once, in chunks, and returns everything the step needs, plus the small
`[B, L]` torch ops of the entropy-bound acceptance and the renoising. Knows
transformers' DiffusionGemma sampler semantics and matches them
(LinearTemperatureScheduleLogitsProcessor, EntropyBoundSampler.accept_canvas
/ renoise_canvas, our per-position confidence = top probability of the raw
logits); knows nothing of models, caches or requests.

Why a kernel: transformers' step makes ~20 passes over `[B, 256, 262144]`
logits (processor copy, fp32 softmax, multinomial, argmax, Categorical's
normalised copy and entropy, our fp32 confidence copy) — ~0.3 GB each at
batch 1, more than the int4 weights a step reads. Here: one read of the
logits and one bf16 write of the temperature-scaled logits that the next step
takes as self-conditioning. Sampling is Gumbel-max with Philox noise keyed by
a per-step seed on the device (same distribution as `torch.multinomial` of
the softmax, a different random stream). The temperature and the seed live
in device tensors so a captured CUDA graph replays with new values.
Runs on CPU under TRITON_INTERPRET=1 (the tests).
"""

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl


@triton.jit
def sample_logits_kernel(
    logits_ptr,  # [R, V] logits (lm_head output, or already softcapped with SOFTCAP 0), any float dtype
    scaled_ptr,  # out [R, V] logits / temperature in the self-conditioning dtype (WRITE_SCALED)
    inv_temperature_ptr,  # [1] fp32
    seed_ptr,  # [1] int64
    sample_ptr,  # out [R] int64: Gumbel-max sample of softmax(logits / T)
    argmax_ptr,  # out [R] int64
    entropy_ptr,  # out [R] fp32: entropy of softmax(logits / T)
    confidence_ptr,  # out [R] fp32: max softmax(logits), temperature 1
    vocab,
    stride_row,
    softcap,  # the model's final logit softcap: logits = tanh(x / cap) * cap when > 0
    APPLY_SOFTCAP: tl.constexpr,
    WRITE_SCALED: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    inv_t = tl.load(inv_temperature_ptr)
    seed = tl.load(seed_ptr)
    cols = tl.arange(0, BLOCK_V)
    # Running (online) reductions: raw max and sum for the confidence; scaled max, sum of
    # exp and sum of exp * value for the entropy; best raw value / Gumbel score and their ids.
    # Typed scalars: loop-carried values must keep one type when compiled.
    raw_max = tl.full([], -float("inf"), tl.float32)
    raw_sum = tl.full([], 0.0, tl.float32)
    scaled_max = tl.full([], -float("inf"), tl.float32)
    scaled_sum = tl.full([], 0.0, tl.float32)
    scaled_dot = tl.full([], 0.0, tl.float32)
    best_raw = tl.full([], -float("inf"), tl.float32)
    best_raw_id = tl.full([], 0, tl.int32)
    best_gumbel = tl.full([], -float("inf"), tl.float32)
    best_gumbel_id = tl.full([], 0, tl.int32)
    for start in range(0, vocab, BLOCK_V):
        ids = start + cols
        valid = ids < vocab
        x = tl.load(logits_ptr + row * stride_row + ids, mask=valid, other=0.0).to(tl.float32)
        if APPLY_SOFTCAP:  # tanh(z) = 2 sigmoid(2z) - 1; clamped where tanh is +-1 in fp32 anyway (no exp overflow)
            x = (2.0 * tl.sigmoid(tl.minimum(tl.maximum(2.0 * x / softcap, -40.0), 40.0)) - 1.0) * softcap
        x = tl.where(valid, x, -float("inf"))
        y = x * inv_t
        if WRITE_SCALED:
            tl.store(scaled_ptr + row * stride_row + ids, y.to(scaled_ptr.dtype.element_ty), mask=valid)

        chunk_max = tl.max(x, 0)
        new_raw_max = tl.maximum(raw_max, chunk_max)
        raw_sum = raw_sum * tl.exp(raw_max - new_raw_max) + tl.sum(tl.where(valid, tl.exp(x - new_raw_max), 0.0), 0)
        raw_max = new_raw_max

        chunk_scaled_max = tl.max(y, 0)
        new_scaled_max = tl.maximum(scaled_max, chunk_scaled_max)
        rescale = tl.exp(scaled_max - new_scaled_max)
        weights = tl.where(valid, tl.exp(y - new_scaled_max), 0.0)
        scaled_sum = scaled_sum * rescale + tl.sum(weights, 0)
        scaled_dot = scaled_dot * rescale + tl.sum(weights * tl.where(valid, y, 0.0), 0)
        scaled_max = new_scaled_max

        chunk_best, chunk_best_id = tl.max(x, 0, return_indices=True, return_indices_tie_break_left=True)
        take = chunk_best > best_raw  # strict: the first of equal maxima wins, as torch.argmax
        best_raw_id = tl.where(take, start + chunk_best_id, best_raw_id)
        best_raw = tl.where(take, chunk_best, best_raw)

        uniform = tl.rand(seed, row * vocab + ids)
        gumbel = -tl.log(-tl.log(tl.maximum(uniform, 1e-20)))
        score = tl.where(valid, y + gumbel, -float("inf"))
        chunk_score, chunk_score_id = tl.max(score, 0, return_indices=True, return_indices_tie_break_left=True)
        take = chunk_score > best_gumbel
        best_gumbel_id = tl.where(take, start + chunk_score_id, best_gumbel_id)
        best_gumbel = tl.where(take, chunk_score, best_gumbel)

    tl.store(sample_ptr + row, best_gumbel_id.to(tl.int64))
    tl.store(argmax_ptr + row, best_raw_id.to(tl.int64))
    # H = log Z - E[y] with Z = sum exp(y): (max + log sum) - dot / sum
    tl.store(entropy_ptr + row, scaled_max + tl.log(scaled_sum) - scaled_dot / scaled_sum)
    tl.store(confidence_ptr + row, 1.0 / raw_sum)  # exp(max - logsumexp) = 1 / sum exp(x - max)


@triton.jit
def accept_update_kernel(
    sample_ptr,  # [B, L] int64: this step's Gumbel-max sample
    argmax_ptr,  # [B, L] int64: this step's argmax
    entropy_ptr,  # [B, L] fp32
    confidence_ptr,  # [B, L] fp32
    canvas_ptr,  # in/out [B, L] int64: the canvas, replaced by the next one
    draft_ptr,  # in/out [B, L] int64: the last draft (argmax), replaced by this step's
    kept_confidence_ptr,  # in/out [B, L] fp32
    finished_ptr,  # in/out [B] bool: sticky within a canvas; a finished row keeps everything
    entropy_bound_ptr,  # [] fp32
    threshold_ptr,  # [] fp32: early stop when the mean entropy is below it
    seed_ptr,  # [1] int64: the step's seed (the sampler's; the noise takes another stream of it)
    length,
    vocab,
    BLOCK_L: tl.constexpr,
    BLOCK_J: tl.constexpr,
):
    """EntropyBoundSampler's acceptance and renoising and the step's bookkeeping, one row per program.

    A position is accepted when the entropies ranked below it (ties: the lower position first) sum to
    at most the bound: `cumsum(sorted) - sorted <= bound` without a sort. The others get a uniform
    token. A row whose draft did not change and whose mean entropy is under the threshold finishes.
    """
    row = tl.program_id(0).to(tl.int64)
    positions = tl.arange(0, BLOCK_L)
    valid = positions < length
    offsets = row * length + positions
    entropy = tl.load(entropy_ptr + offsets, mask=valid, other=float("inf"))
    before = tl.zeros([BLOCK_L], dtype=tl.float32)
    for start in range(0, length, BLOCK_J):
        others = start + tl.arange(0, BLOCK_J)
        other = tl.load(entropy_ptr + row * length + others, mask=others < length, other=float("inf"))
        ranked_lower = (other[None, :] < entropy[:, None]) | (
            (other[None, :] == entropy[:, None]) & (others[None, :] < positions[:, None])
        )
        before += tl.sum(tl.where(ranked_lower & (others < length)[None, :], other[None, :], 0.0), 1)
    accepted = before <= tl.load(entropy_bound_ptr)
    seed = tl.load(seed_ptr)
    noise = (tl.randint(seed + 1, offsets).to(tl.int64) & 0xFFFFFFFF) % vocab
    sample = tl.load(sample_ptr + offsets, mask=valid, other=0)
    following = tl.where(accepted, sample, noise)
    argmax = tl.load(argmax_ptr + offsets, mask=valid, other=0)
    draft = tl.load(draft_ptr + offsets, mask=valid, other=0)
    stable = tl.sum(tl.where(valid & (argmax != draft), 1, 0), 0) == 0
    mean_entropy = tl.div_rn(tl.sum(tl.where(valid, entropy, 0.0), 0), tl.full([], length, tl.float32))
    confident = mean_entropy < tl.load(threshold_ptr)
    finished = tl.load(finished_ptr + row) != 0
    if not finished:
        tl.store(canvas_ptr + offsets, following, mask=valid)
        tl.store(draft_ptr + offsets, argmax, mask=valid)
        tl.store(kept_confidence_ptr + offsets, tl.load(confidence_ptr + offsets, mask=valid, other=0.0), mask=valid)
        tl.store(finished_ptr + row, (stable & confident).to(tl.int1))


@dataclasses.dataclass(frozen=True)
class SampledLogits:
    """What one pass over `[B, L, V]` logits yields; every tensor `[B, L]` except `scaled`."""

    sample: torch.Tensor  # int64: the denoiser canvas
    argmax: torch.Tensor  # int64: the draft canvas
    entropy: torch.Tensor  # fp32, at the step's temperature
    confidence: torch.Tensor  # fp32, top probability at temperature 1
    scaled: torch.Tensor | None  # [B, L, V] logits / T: the next step's self-conditioning


def sample_logits(
    logits: torch.Tensor,
    inv_temperature: torch.Tensor,
    seed: torch.Tensor,
    *,
    scaled_out: torch.Tensor | None = None,
    softcap: float = 0.0,
    block_v: int | None = None,
) -> SampledLogits:
    """One kernel launch over `logits` `[B, L, V]`; `inv_temperature` `[1]` fp32 and `seed` `[1]` int64 on the device.

    `softcap` > 0 applies the model's final softcap in registers, so the lm_head
    output is read as is (transformers makes a fp32 copy and three passes for it).
    `scaled_out` may be `logits` itself (the compiled step does that): each
    position is read before the same program writes it back, scaled.
    """
    assert logits.stride(-1) == 1, "the kernel reads each row's vocabulary contiguously"
    batch, length, vocab = logits.shape
    if scaled_out is not None:
        assert scaled_out.shape == logits.shape and scaled_out.stride() == logits.stride(), "scaled_out mirrors logits"
    block_v = block_v or min(4096, triton.next_power_of_2(vocab))
    sample, argmax, entropy, confidence = torch.ops.dgemma.sample_logits(
        logits.reshape(batch * length, vocab), scaled_out, inv_temperature, seed, float(softcap or 0.0), block_v
    )
    shape = (batch, length)
    return SampledLogits(sample.view(shape), argmax.view(shape), entropy.view(shape), confidence.view(shape),
                         scaled_out)  # fmt: skip


# The launch as a torch custom op: FakeTensorMode (bench/dryrun.py), torch.compile and operator
# counters see one operator with known output shapes; the real implementation is the Triton launch.


@torch.library.custom_op("dgemma::sample_logits", mutates_args=("scaled_out",))
def _sample_logits_op(
    rows: torch.Tensor,
    scaled_out: torch.Tensor | None,
    inv_temperature: torch.Tensor,
    seed: torch.Tensor,
    softcap: float,
    block_v: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One launch of `sample_logits_kernel` over `rows` `[R, V]`: (sample, argmax, entropy, confidence), each `[R]`;
    writes rows / T into `scaled_out` (any shape with R * V elements laid out as rows) when given."""
    sample, argmax, entropy, confidence = _sampled_outputs(rows)
    sample_logits_kernel[(rows.shape[0],)](
        rows, scaled_out if scaled_out is not None else rows, inv_temperature, seed,
        sample, argmax, entropy, confidence, rows.shape[1], rows.stride(0), softcap or 1.0,
        APPLY_SOFTCAP=bool(softcap), WRITE_SCALED=scaled_out is not None, BLOCK_V=block_v,
    )  # fmt: skip
    return sample, argmax, entropy, confidence


@_sample_logits_op.register_fake
def _(rows, scaled_out, inv_temperature, seed, softcap, block_v):
    return _sampled_outputs(rows)


def _sampled_outputs(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    count = rows.shape[0]
    return (rows.new_empty(count, dtype=torch.int64), rows.new_empty(count, dtype=torch.int64),
            rows.new_empty(count, dtype=torch.float32), rows.new_empty(count, dtype=torch.float32))  # fmt: skip


def temperature(cur_step: int, steps: int, t_min: float, t_max: float) -> float:
    """transformers' linear schedule; `cur_step` counts the steps left (N .. 1)."""
    return t_min + (t_max - t_min) * (cur_step / steps)


def accept_and_renoise(
    current: torch.Tensor, sampled: SampledLogits, entropy_bound: float, vocab: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """EntropyBoundSampler's acceptance and renoising on `[B, L]` tensors: (next canvas, accepted mask).

    Accepts the lowest-entropy positions while their summed entropy minus the
    largest one stays within the bound; every other position gets a fresh
    uniform token.
    """
    sorted_entropy, order = torch.sort(sampled.entropy, dim=-1)  # [B, L]
    selected = torch.cumsum(sorted_entropy, dim=-1) - sorted_entropy <= entropy_bound
    accepted = torch.zeros_like(selected).scatter(-1, order, selected)
    noise = torch.randint(0, vocab, current.shape, device=current.device)
    return torch.where(accepted, sampled.sample, noise), accepted


def accept_and_update(
    sampled: SampledLogits, *, canvas: torch.Tensor, draft: torch.Tensor, confidence: torch.Tensor,
    finished: torch.Tensor, entropy_bound: torch.Tensor, confidence_threshold: torch.Tensor, seed: torch.Tensor,
    vocab: int,
) -> None:  # fmt: skip
    """One launch for what follows the sampler in a step, in place on the step's `[B, L]` buffers:
    `accept_and_renoise` (the next canvas), the draft and its confidences, and the sticky early-stop
    flag (`finished` `[B]`: draft unchanged and mean entropy under the threshold). Rows already
    finished keep everything, as transformers' sampler leaves finished rows alone."""
    torch.ops.dgemma.accept_update(sampled.sample, sampled.argmax, sampled.entropy, sampled.confidence, canvas,
                                   draft, confidence, finished, entropy_bound, confidence_threshold, seed, vocab)  # fmt: skip


@torch.library.custom_op(
    "dgemma::accept_update", mutates_args=("canvas", "draft", "kept_confidence", "finished")
)
def _accept_update_op(
    sample: torch.Tensor, argmax: torch.Tensor, entropy: torch.Tensor, confidence: torch.Tensor,
    canvas: torch.Tensor, draft: torch.Tensor, kept_confidence: torch.Tensor, finished: torch.Tensor,
    entropy_bound: torch.Tensor, threshold: torch.Tensor, seed: torch.Tensor, vocab: int,
) -> None:  # fmt: skip
    batch, length = canvas.shape
    for tensor in (sample, argmax, entropy, confidence, canvas, draft, kept_confidence):
        assert tensor.is_contiguous() and tensor.shape == (batch, length), "[B, L] buffers, contiguous"
    accept_update_kernel[(batch,)](
        sample, argmax, entropy, confidence, canvas, draft, kept_confidence, finished, entropy_bound, threshold,
        seed, length, vocab, BLOCK_L=triton.next_power_of_2(length), BLOCK_J=32,
    )  # fmt: skip


@_accept_update_op.register_fake
def _(sample, argmax, entropy, confidence, canvas, draft, kept_confidence, finished, entropy_bound, threshold, seed,
      vocab):  # fmt: skip
    return None
