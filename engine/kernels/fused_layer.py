"""Fused kernels for everything in a DiffusionGemma decoder layer outside the experts and the projections.

Owns the Triton kernels (and their `dgemma::*` custom ops) that `fused_decoder` chains into a
denoising step: the sandwich norms with their residual adds and the layer scalar (two launches a
layer; each may also write its output as the next w8a8 GEMM's activation codes), the q / k / v head norms with the rotary embedding written straight into attention's layout,
the attention's key/value buffer built from the static cache, GELU-tanh x up, the router (its small
projection, softmax, top-k, renormalisation and per-expert scale in one launch), and, at the step's
edges, the embedding + self-conditioning input and the row softmax of the self-conditioning logits.
Knows the arithmetic of transformers' DiffusionGemma modules (5.24) and nothing of caches, graphs or
requests.

Numerics: each kernel computes in fp32 and rounds to the activations' dtype at exactly the points
where transformers' eager code produces a tensor of that dtype (after each RMSNorm, each add, each
product with a bf16 weight, the rotary's two products and their sum, the router's scores), so a bf16
step differs from transformers' only by the order of fp32 reductions (a norm's mean, a softmax's
sum, the router projection's dot products). Each kernel is tested against an fp32 reference in
Triton's interpreter on CPU (tests/engine/test_fused_layer.py).

Why our own kernels and not a library's: Liger-Kernel (BSD-2, pure Triton, read at 0.8.5) has one
RMSNorm per launch and a pre-norm `residual + x -> norm` fused add; Gemma 4's layer is post-norm
(norm the branch, then add it to the residual, then three norms of the sum, and at the layer's end two
branch norms, their sum, a norm, the residual add, the layer scalar and the next layer's input norm).
With Liger those are ~8 launches and the adds apart; here 2. Its kernels also launch from Python with
no custom op around them, so fake tensors (`make dryrun`) and operator counters could not see them,
and the GPU machine would need its wheel carried over. Plain `tl.*` only, no inline assembly or
architecture switches: the same kernels run on sm_89 (RTX 4090), sm_90 and sm_120 (RTX 5090).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .expert_kernels import ACTIVATION_CODES
from .rounding import cast_to, quantized_activations, round_to

# -- helpers inside kernels -------------------------------------------------------------------------


@triton.jit
def _inv_rms(x, n, eps):
    """transformers' DiffusionGemmaRMSNorm scale: (mean(x^2) + eps) ** -0.5, x fp32 with masked lanes 0.
    IEEE division and square root (`*_rn`): Triton's plain `/` and `sqrt` are approximate on a GPU."""
    mean = tl.div_rn(tl.sum(x * x, 0), tl.full([], n, tl.float32))
    return tl.div_rn(1.0, tl.sqrt_rn(mean + eps))


@triton.jit
def _gelu_tanh(x):
    """0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))) in torch's order of operations (its 1 + tanh
    loses the low bits of small negative inputs; so does this), tanh(z) = 2 sigmoid(2z) - 1."""
    inner = 0.7978845608028654 * (x + 0.044715 * x * x * x)
    # clamped where tanh is +-1 in fp32 anyway (no exp overflow)
    return 0.5 * x * (1.0 + (2.0 * tl.sigmoid(tl.minimum(tl.maximum(2.0 * inner, -40.0), 40.0)) - 1.0))


@triton.jit
def _store_codes(values, codes_ptr, scales_ptr, row, hidden, BLOCK: tl.constexpr, KIND: tl.constexpr,
                 CODES_BLOCK: tl.constexpr, FP32_MATH: tl.constexpr):  # fmt: skip
    """A row as it was stored (`values`: fp32 [BLOCK], padding lanes 0) as the w8a8 / w4a8 launch that reads it
    takes it, when KIND (`ACTIVATION_CODES`) asks: per CODES_BLOCK inputs the codes and fp32 scale that
    `activation_codes_kernel` would write, with the same function, bit for bit (`fused_moe.ActivationCodes`)."""
    if KIND != 0:
        groups: tl.constexpr = BLOCK // CODES_BLOCK
        codes, scales = quantized_activations(tl.reshape(values, [groups, CODES_BLOCK]), KIND, False, FP32_MATH)
        if KIND == 2:
            codes = codes.to(tl.uint8, bitcast=True)
        cols = tl.arange(0, BLOCK)
        tl.store(codes_ptr + row * hidden + cols, tl.reshape(codes, [BLOCK]), mask=cols < hidden)
        ids = tl.arange(0, groups)
        tl.store(scales_ptr + row * (hidden // CODES_BLOCK) + ids, scales, mask=ids < hidden // CODES_BLOCK)


# -- the layer's norms ---------------------------------------------------------------------------------


@triton.jit
def post_attention_kernel(
    attn_ptr,  # [T, H] o_proj output
    residual_ptr,  # [T, H] the layer's input
    w_post_ptr,  # [H] post_attention_layernorm
    w_mlp_ptr,  # [H] pre_feedforward_layernorm
    w_experts_ptr,  # [H] pre_feedforward_layernorm_2
    router_scale_ptr,  # [H] router.scale
    hidden_out_ptr,  # out [T, H] residual + norm(attn): the rest of the layer's residual
    mlp_in_ptr,  # out [T, H] the dense MLP's input
    experts_in_ptr,  # out [T, H] the experts' input
    router_in_ptr,  # out [T, H] the router projection's input
    mlp_codes_ptr,  # out, MLP_CODES: [T, H] the dense MLP's input as its launch's activation codes
    mlp_scales_ptr,  # out, MLP_CODES: [T, H / MLP_CODES_BLOCK] fp32
    experts_codes_ptr,  # out, EXPERTS_CODES: the experts' input as their gate_up's codes
    experts_scales_ptr,
    hidden,
    eps,
    router_root,  # hidden ** -0.5
    BLOCK: tl.constexpr,
    MLP_CODES: tl.constexpr,  # ACTIVATION_CODES of the dense MLP's launch, 0: none
    MLP_CODES_BLOCK: tl.constexpr,
    EXPERTS_CODES: tl.constexpr,
    EXPERTS_CODES_BLOCK: tl.constexpr,
    FP32_MATH: tl.constexpr,  # the interpreter's e4m3 rounding (expert_kernels)
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    valid = cols < hidden
    dtype = attn_ptr.dtype.element_ty
    offsets = row * hidden + cols
    attn = tl.load(attn_ptr + offsets, mask=valid, other=0.0).to(tl.float32)
    weight = tl.load(w_post_ptr + cols, mask=valid, other=0.0).to(tl.float32)
    branch = round_to(attn * _inv_rms(attn, hidden, eps) * weight, dtype)
    residual = tl.load(residual_ptr + offsets, mask=valid, other=0.0).to(tl.float32)
    state = round_to(residual + branch, dtype)
    tl.store(hidden_out_ptr + offsets, state.to(dtype), mask=valid)
    normed = state * _inv_rms(state, hidden, eps)
    weight = tl.load(w_mlp_ptr + cols, mask=valid, other=0.0).to(tl.float32)
    mlp_in = round_to(normed * weight, dtype)
    tl.store(mlp_in_ptr + offsets, mlp_in.to(dtype), mask=valid)
    _store_codes(mlp_in, mlp_codes_ptr, mlp_scales_ptr, row, hidden, BLOCK, MLP_CODES, MLP_CODES_BLOCK, FP32_MATH)
    weight = tl.load(w_experts_ptr + cols, mask=valid, other=0.0).to(tl.float32)
    experts_in = round_to(normed * weight, dtype)
    tl.store(experts_in_ptr + offsets, experts_in.to(dtype), mask=valid)
    _store_codes(experts_in, experts_codes_ptr, experts_scales_ptr, row, hidden, BLOCK, EXPERTS_CODES,
                 EXPERTS_CODES_BLOCK, FP32_MATH)  # fmt: skip
    # The router: norm without a weight, then * scale, then * hidden ** -0.5, each a tensor in transformers.
    scale = tl.load(router_scale_ptr + cols, mask=valid, other=0.0).to(tl.float32)
    routed = round_to(round_to(round_to(normed, dtype) * scale, dtype) * router_root, dtype)
    tl.store(router_in_ptr + offsets, cast_to(routed, dtype), mask=valid)


@triton.jit
def post_ffn_kernel(
    mlp_ptr,  # [T, H] dense MLP output
    experts_ptr,  # [T, H] experts output, or its fp32 top-k sums (rounded here as their cast would round them)
    residual_ptr,  # [T, H] the residual after attention
    w_mlp_ptr,  # [H] post_feedforward_layernorm_1
    w_experts_ptr,  # [H] post_feedforward_layernorm_2
    w_sum_ptr,  # [H] post_feedforward_layernorm
    layer_scalar_ptr,  # [1] layer_scalar
    w_next_ptr,  # [H] the next layer's input_layernorm, or the decoder's final norm
    hidden_out_ptr,  # out [T, H] the layer's output
    next_in_ptr,  # out [T, H] norm(output) * w_next
    next_codes_ptr,  # out, CODES: next_in as the next layer's q/k/v launch's activation codes
    next_scales_ptr,  # out, CODES: [T, H / CODES_BLOCK] fp32
    hidden,
    eps,
    BLOCK: tl.constexpr,
    CLEAR_EXPERTS: tl.constexpr,  # zero the experts' row once read (the fused decoder's sums buffer, reused a layer on)
    CODES: tl.constexpr,  # ACTIVATION_CODES of the next launch, 0: none
    CODES_BLOCK: tl.constexpr,
    FP32_MATH: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    valid = cols < hidden
    dtype = residual_ptr.dtype.element_ty
    offsets = row * hidden + cols
    x = tl.load(mlp_ptr + offsets, mask=valid, other=0.0).to(tl.float32)
    weight = tl.load(w_mlp_ptr + cols, mask=valid, other=0.0).to(tl.float32)
    dense = round_to(x * _inv_rms(x, hidden, eps) * weight, dtype)
    x = round_to(tl.load(experts_ptr + offsets, mask=valid, other=0.0).to(tl.float32), dtype)
    if CLEAR_EXPERTS:  # this program alone reads the row, and it has it in registers
        tl.store(experts_ptr + offsets, tl.zeros([BLOCK], dtype=experts_ptr.dtype.element_ty), mask=valid)
    weight = tl.load(w_experts_ptr + cols, mask=valid, other=0.0).to(tl.float32)
    routed = round_to(x * _inv_rms(x, hidden, eps) * weight, dtype)
    both = round_to(dense + routed, dtype)
    weight = tl.load(w_sum_ptr + cols, mask=valid, other=0.0).to(tl.float32)
    branch = round_to(both * _inv_rms(both, hidden, eps) * weight, dtype)
    residual = tl.load(residual_ptr + offsets, mask=valid, other=0.0).to(tl.float32)
    state = round_to(residual + branch, dtype)
    state = round_to(state * tl.load(layer_scalar_ptr).to(tl.float32), dtype)
    tl.store(hidden_out_ptr + offsets, state.to(dtype), mask=valid)
    weight = tl.load(w_next_ptr + cols, mask=valid, other=0.0).to(tl.float32)
    next_in = round_to(state * _inv_rms(state, hidden, eps) * weight, dtype)
    tl.store(next_in_ptr + offsets, next_in.to(dtype), mask=valid)
    _store_codes(next_in, next_codes_ptr, next_scales_ptr, row, hidden, BLOCK, CODES, CODES_BLOCK, FP32_MATH)


@triton.jit
def step_input_kernel(
    ids_ptr,  # [T] canvas token ids
    embed_ptr,  # [V, H] the embedding table
    signal_ptr,  # [T, H] the self-conditioning MLP's output
    w_in_ptr,  # [H] the first layer's input_layernorm
    hidden_out_ptr,  # out [T, H] post_norm(embed * scale + signal): the first layer's residual
    first_in_ptr,  # out [T, H] input_layernorm of it
    first_codes_ptr,  # out, CODES: first_in as the first layer's q/k/v launch's activation codes
    first_scales_ptr,  # out, CODES: [T, H / CODES_BLOCK] fp32
    hidden,
    embed_scale,  # sqrt(hidden) as the embedding's dtype holds it
    eps,
    BLOCK: tl.constexpr,
    CODES: tl.constexpr,  # ACTIVATION_CODES of the first layer's q/k/v launch, 0: none
    CODES_BLOCK: tl.constexpr,
    FP32_MATH: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    valid = cols < hidden
    dtype = signal_ptr.dtype.element_ty
    token = tl.load(ids_ptr + row).to(tl.int64)
    embedded = round_to(tl.load(embed_ptr + token * hidden + cols, mask=valid, other=0.0).to(tl.float32) * embed_scale,
                      dtype)  # fmt: skip
    signal = tl.load(signal_ptr + row * hidden + cols, mask=valid, other=0.0).to(tl.float32)
    combined = round_to(embedded + signal, dtype)
    state = round_to(combined * _inv_rms(combined, hidden, eps), dtype)  # post_norm has no weight
    tl.store(hidden_out_ptr + row * hidden + cols, state.to(dtype), mask=valid)
    weight = tl.load(w_in_ptr + cols, mask=valid, other=0.0).to(tl.float32)
    first_in = round_to(state * _inv_rms(state, hidden, eps) * weight, dtype)
    tl.store(first_in_ptr + row * hidden + cols, first_in.to(dtype), mask=valid)
    _store_codes(first_in, first_codes_ptr, first_scales_ptr, row, hidden, BLOCK, CODES, CODES_BLOCK, FP32_MATH)


@triton.jit
def signal_norm_kernel(
    soft_ptr,  # [T, H] softmax(logits) @ embed: the soft embeddings before their scale
    mask_ptr,  # [B] bool: self-conditioning on for that row
    weight_ptr,  # [H] self_conditioning.pre_norm
    out_ptr,  # out [T, H] pre_norm(soft * embed_scale * mask)
    codes_ptr,  # out, CODES: out as the self-conditioning MLP's launch's activation codes
    scales_ptr,  # out, CODES: [T, H / CODES_BLOCK] fp32
    hidden,
    rows_per_batch,
    embed_scale,
    eps,
    BLOCK: tl.constexpr,
    CODES: tl.constexpr,  # ACTIVATION_CODES of that launch, 0: none
    CODES_BLOCK: tl.constexpr,
    FP32_MATH: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    valid = cols < hidden
    dtype = soft_ptr.dtype.element_ty
    on = tl.load(mask_ptr + row // rows_per_batch).to(tl.float32)
    soft = round_to(tl.load(soft_ptr + row * hidden + cols, mask=valid, other=0.0).to(tl.float32) * embed_scale, dtype)
    soft = soft * on  # * 1 or * 0: exact
    weight = tl.load(weight_ptr + cols, mask=valid, other=0.0).to(tl.float32)
    normed = round_to(soft * _inv_rms(soft, hidden, eps) * weight, dtype)
    tl.store(out_ptr + row * hidden + cols, normed.to(dtype), mask=valid)
    _store_codes(normed, codes_ptr, scales_ptr, row, hidden, BLOCK, CODES, CODES_BLOCK, FP32_MATH)


# -- attention's inputs ------------------------------------------------------------------------------


@triton.jit
def _heads_norm_rope(x_ptr, heads, weight_ptr, cos_ptr, sin_ptr, position, eps, dtype: tl.constexpr,
                     D: tl.constexpr, HEADS: tl.constexpr, HAS_WEIGHT: tl.constexpr, ROPE: tl.constexpr):  # fmt: skip
    """A token's `heads` heads `[heads, D]` at x_ptr: RMSNorm per head (times the weight), then
    x * cos + rotate_half(x) * sin, with transformers' roundings (the norm, each product, their sum);
    the two halves `[HEADS, D / 2]`, fp32."""
    rows = tl.arange(0, HEADS)
    half = tl.arange(0, D // 2)
    valid = (rows < heads)[:, None]
    offsets = rows[:, None] * D + half[None, :]
    first = tl.load(x_ptr + offsets, mask=valid, other=0.0).to(tl.float32)
    second = tl.load(x_ptr + D // 2 + offsets, mask=valid, other=0.0).to(tl.float32)
    total = tl.sum(first * first, 1) + tl.sum(second * second, 1)
    scale = tl.div_rn(tl.full([HEADS], 1.0, tl.float32), tl.sqrt_rn(tl.div_rn(total, tl.full([HEADS], D, tl.float32)) + eps))
    first = first * scale[:, None]
    second = second * scale[:, None]
    if HAS_WEIGHT:
        first = first * tl.load(weight_ptr + half).to(tl.float32)[None, :]
        second = second * tl.load(weight_ptr + D // 2 + half).to(tl.float32)[None, :]
    first = round_to(first, dtype)
    second = round_to(second, dtype)
    if ROPE:  # rotate_half(x) = cat(-x2, x1)
        cos_first = tl.load(cos_ptr + position * D + half).to(tl.float32)[None, :]
        cos_second = tl.load(cos_ptr + position * D + D // 2 + half).to(tl.float32)[None, :]
        sin_first = tl.load(sin_ptr + position * D + half).to(tl.float32)[None, :]
        sin_second = tl.load(sin_ptr + position * D + D // 2 + half).to(tl.float32)[None, :]
        rotated_first = round_to(first * cos_first, dtype) + round_to(-second * sin_first, dtype)
        second = round_to(round_to(second * cos_second, dtype) + round_to(first * sin_second, dtype), dtype)
        first = round_to(rotated_first, dtype)
    return first, second


@triton.jit
def _store_heads(out_ptr, row_stride, heads, first, second, D: tl.constexpr, HEADS: tl.constexpr):
    """Head h's two halves to out_ptr + h * row_stride."""
    rows = tl.arange(0, HEADS)
    half = tl.arange(0, D // 2)
    valid = (rows < heads)[:, None]
    offsets = rows[:, None].to(tl.int64) * row_stride + half[None, :]
    tl.store(out_ptr + offsets, first.to(out_ptr.dtype.element_ty), mask=valid)
    tl.store(out_ptr + D // 2 + offsets, second.to(out_ptr.dtype.element_ty), mask=valid)


@triton.jit
def _copy_cache_rows(source, target, rows, cached, positions, canvas_start, canvas_end, D: tl.constexpr):
    """Rows [0, M) of a cache head to the attention buffer, zeros after, the canvas's rows left alone."""
    cols = tl.arange(0, D)
    offsets = rows[:, None].to(tl.int64) * D + cols[None, :]
    tile = tl.load(source + offsets, mask=(rows < cached)[:, None], other=0.0)
    outside_canvas = (rows < canvas_start) | (rows >= canvas_end)
    tl.store(target + offsets, tile, mask=((rows < positions) & outside_canvas)[:, None])


@triton.jit
def attention_inputs_kernel(
    q_ptr,  # [T, Hq * D] q_proj output
    k_ptr,  # [T, Hkv * D] k_proj output
    v_ptr,  # [T, Hkv * D] v_proj output (k_proj's again on full-attention layers)
    q_weight_ptr,  # [D] q_norm
    k_weight_ptr,  # [D] k_norm (v_norm has no weight)
    cos_ptr,  # [L, D] the canvas positions' rotary tables, the activations' dtype
    sin_ptr,
    cache_keys_ptr,  # [B, Hkv, M, D] the static cache layer, contiguous
    cache_values_ptr,
    q_out_ptr,  # out [B, Hq, L, D]
    keys_out_ptr,  # out [B, Hkv * REPEAT, M + L, D]
    values_out_ptr,
    offset_ptr,  # [] int64: the layer's cumulative_length, where the canvas goes
    stride_q,
    stride_k,
    stride_v,
    tokens,
    heads,
    kv_heads,
    length,  # L
    cached,  # M
    eps,
    D: tl.constexpr,
    REPEAT: tl.constexpr,
    BLOCK_P: tl.constexpr,
    HEADS: tl.constexpr,
    KV_HEADS: tl.constexpr,
):
    """transformers' q / k / v head norms, rotary embedding and `append_to_cache` in one launch.

    The first `tokens` programs each do one token's heads (HEADS, KV_HEADS: their counts rounded up to
    powers of two): q into `q_out`; k and v into the canvas rows [offset, offset + L) of each of their REPEAT query heads' key/value rows (what
    `repeat_kv` would copy). The other programs copy BLOCK_P cache rows of one head into rows [0, M),
    zeros into [M, M + L), and leave the canvas rows to the first kind: no two programs write one row.
    """
    pid = tl.program_id(0).to(tl.int64)
    dtype = q_out_ptr.dtype.element_ty
    positions = cached + length
    offset = tl.load(offset_ptr)
    if pid < tokens:
        token = pid
        position = token % length
        batch = token // length
        first, second = _heads_norm_rope(q_ptr + token * stride_q, heads, q_weight_ptr, cos_ptr, sin_ptr, position,
                                         eps, dtype, D, HEADS, True, True)  # fmt: skip
        # query head h of this token: q_out[batch, h, position]
        _store_heads(q_out_ptr + (batch * heads * length + position) * D, length * D, heads, first, second, D, HEADS)
        first, second = _heads_norm_rope(k_ptr + token * stride_k, kv_heads, k_weight_ptr, cos_ptr, sin_ptr,
                                         position, eps, dtype, D, KV_HEADS, True, True)  # fmt: skip
        values_first, values_second = _heads_norm_rope(v_ptr + token * stride_v, kv_heads, k_weight_ptr, cos_ptr,
                                                       sin_ptr, position, eps, dtype, D, KV_HEADS, False, False)  # fmt: skip
        for copy in range(REPEAT):  # key/value head h serves query heads h * REPEAT + copy
            start = ((batch * kv_heads * REPEAT + copy) * positions + offset + position) * D
            _store_heads(keys_out_ptr + start, REPEAT * positions * D, kv_heads, first, second, D, KV_HEADS)
            _store_heads(values_out_ptr + start, REPEAT * positions * D, kv_heads, values_first, values_second, D,
                         KV_HEADS)  # fmt: skip
    else:
        item = pid - tokens
        blocks = tl.cdiv(positions, BLOCK_P)
        block = item % blocks
        out_head = (item // blocks) // 2  # b * Hkv * REPEAT + h * REPEAT + r
        source_head = out_head // REPEAT  # b * Hkv + h
        rows = block * BLOCK_P + tl.arange(0, BLOCK_P)
        if (item // blocks) % 2 == 0:
            _copy_cache_rows(cache_keys_ptr + source_head * cached * D, keys_out_ptr + out_head * positions * D,
                             rows, cached, positions, offset, offset + length, D)  # fmt: skip
        else:
            _copy_cache_rows(cache_values_ptr + source_head * cached * D, values_out_ptr + out_head * positions * D,
                             rows, cached, positions, offset, offset + length, D)  # fmt: skip


# -- the feed-forward and the router ---------------------------------------------------------------------


@triton.jit
def gelu_mul_kernel(gate_ptr, up_ptr, out_ptr, count, BLOCK: tl.constexpr):
    """act_fn(gate) * up, each a tensor in transformers' MLP."""
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    valid = offsets < count
    dtype = out_ptr.dtype.element_ty
    gate = tl.load(gate_ptr + offsets, mask=valid, other=0.0).to(tl.float32)
    up = tl.load(up_ptr + offsets, mask=valid, other=0.0).to(tl.float32)
    tl.store(out_ptr + offsets, cast_to(round_to(_gelu_tanh(gate), dtype) * up, dtype), mask=valid)


@triton.jit
def route_kernel(
    x_ptr,  # [T, H] the router projection's input (post_attention's router_in)
    proj_ptr,  # [E, H] router.proj.weight, the input's dtype
    expert_scale_ptr,  # [E] router.per_expert_scale
    weights_out_ptr,  # out [T, K] fp32
    index_out_ptr,  # out [T, K] int64
    rows,
    hidden,
    experts,
    K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_E: tl.constexpr,  # experts rounded up to a power of two >= 16 (tl.dot's least width)
    DOT_PRECISION: tl.constexpr,  # "ieee" for fp32 inputs (a GPU's default is tf32)
    DOT_FP32: tl.constexpr,  # operands in fp32 (the interpreter's bf16 dot is wrong; bf16 products are exact in fp32)
):
    """transformers' DiffusionGemmaTextRouter from its projection on, for BLOCK_M rows: the weight is read once
    per BLOCK_M rows, and the scores never leave the program."""
    row_ids = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_valid = row_ids < rows
    ids = tl.arange(0, BLOCK_E)
    valid = ids < experts
    dtype = x_ptr.dtype.element_ty
    scores = tl.zeros([BLOCK_M, BLOCK_E], dtype=tl.float32)
    for start in range(0, hidden, BLOCK_H):
        cols = start + tl.arange(0, BLOCK_H)
        col_valid = cols < hidden
        x = tl.load(x_ptr + row_ids[:, None] * hidden + cols[None, :], mask=row_valid[:, None] & col_valid[None, :],
                    other=0.0)  # fmt: skip  # [BLOCK_M, BLOCK_H]
        w = tl.load(proj_ptr + ids[None, :].to(tl.int64) * hidden + cols[:, None],
                    mask=valid[None, :] & col_valid[:, None], other=0.0)  # fmt: skip  # [BLOCK_H, BLOCK_E]: weight^T
        if DOT_FP32:
            x, w = x.to(tl.float32), w.to(tl.float32)
        scores = tl.dot(x, w, scores, input_precision=DOT_PRECISION)
    # router.proj's output is a tensor of the input's dtype (the GEMM's fp32 sums rounded once): the softmax's input
    scores = tl.where(valid[None, :], round_to(scores, dtype), -float("inf"))
    weights = tl.exp(scores - tl.max(scores, 1)[:, None])
    probabilities = tl.div_rn(weights, tl.sum(weights, 1)[:, None])  # softmax in fp32, as transformers' router
    slots = tl.arange(0, K)[None, :]
    chosen = tl.zeros([BLOCK_M, K], dtype=tl.float32)
    chosen_ids = tl.zeros([BLOCK_M, K], dtype=tl.int32)
    remaining = tl.where(valid[None, :], probabilities, -1.0)
    # Top-k, largest first; among equal probabilities the lowest id first: the experts CUDA's torch.topk picks
    # (of values tied at the k-th it keeps the first seen), in one fixed order where it leaves ties unordered.
    for slot in range(K):
        best, best_id = tl.max(remaining, 1, return_indices=True, return_indices_tie_break_left=True)
        chosen = tl.where(slots == slot, best[:, None], chosen)
        chosen_ids = tl.where(slots == slot, best_id[:, None], chosen_ids)
        remaining = tl.where(ids[None, :] == best_id[:, None], -1.0, remaining)
    chosen = tl.div_rn(chosen, tl.sum(chosen, 1)[:, None])
    chosen = chosen * tl.load(expert_scale_ptr + chosen_ids).to(tl.float32)
    offsets = row_ids[:, None] * K + slots
    tl.store(weights_out_ptr + offsets, chosen, mask=row_valid[:, None])
    tl.store(index_out_ptr + offsets, chosen_ids.to(tl.int64), mask=row_valid[:, None])


@triton.jit
def softmax_rows_kernel(logits_ptr, out_ptr, vocab, BLOCK_V: tl.constexpr):
    """softmax(row, fp32) stored in out's dtype: two passes over the row (max and sum, then write)."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_V)
    running_max = tl.full([], -float("inf"), tl.float32)
    running_sum = tl.full([], 0.0, tl.float32)
    for start in range(0, vocab, BLOCK_V):
        ids = start + cols
        x = tl.load(logits_ptr + row * vocab + ids, mask=ids < vocab, other=-float("inf")).to(tl.float32)
        new_max = tl.maximum(running_max, tl.max(x, 0))
        running_sum = running_sum * tl.exp(running_max - new_max) + tl.sum(tl.exp(x - new_max), 0)
        running_max = new_max
    for start in range(0, vocab, BLOCK_V):
        ids = start + cols
        valid = ids < vocab
        x = tl.load(logits_ptr + row * vocab + ids, mask=valid, other=-float("inf")).to(tl.float32)
        tl.store(out_ptr + row * vocab + ids, cast_to(tl.div_rn(tl.exp(x - running_max), running_sum), out_ptr.dtype.element_ty),
                 mask=valid)  # fmt: skip


# -- the launches as torch operators (fake tensors, torch.compile and the dry run see one op each) --------


def _interpreting() -> bool:
    """True when the kernels were built for Triton's CPU interpreter (TRITON_INTERPRET=1 at import)."""
    return type(attention_inputs_kernel).__name__ == "InterpretedFunction"


def _block(width: int) -> int:
    return triton.next_power_of_2(width)


def _warps(block: int) -> int:
    return 4 if block <= 1024 else 8 if block <= 4096 else 16


# The norm launches below also write their output as the next GEMM's activation codes when the caller passes
# (codes `[T, H]`, scales `[T, H / block]`) buffers (`fused_moe.CodesLayout.empty`): int8, or e4m3 bytes as
# uint8, the kind and the block read from their dtype and shape. The w8a8 / w4a8 launch reading them then has no
# `activation_codes` launch before it (`launch_settings(activation_codes=True)`; kernels/fused_decoder.py).


@torch.library.custom_op("dgemma::post_attention",
                         mutates_args=("mlp_codes", "mlp_scales", "experts_codes", "experts_scales"))  # fmt: skip
def post_attention(
    attn: torch.Tensor, residual: torch.Tensor, w_post: torch.Tensor, w_mlp: torch.Tensor,
    w_experts: torch.Tensor, router_scale: torch.Tensor, eps: float, router_root: float,
    mlp_codes: torch.Tensor | None = None, mlp_scales: torch.Tensor | None = None,
    experts_codes: torch.Tensor | None = None, experts_scales: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """(residual + post_norm(attn), and of that: pre_ff_norm, pre_ff_norm_2, the router's input), each `[T, H]`;
    the second and third also as codes into `mlp_*` / `experts_*` when given."""
    outs = _like(residual, 4)
    rows, hidden = residual.shape
    block = _block(hidden)
    mlp_codes, mlp_scales, mlp_kind, mlp_block = _codes_outputs(mlp_codes, mlp_scales, residual)
    experts_codes, experts_scales, experts_kind, experts_block = _codes_outputs(experts_codes, experts_scales, residual)
    post_attention_kernel[(rows,)](attn, residual, w_post, w_mlp, w_experts, router_scale, *outs, mlp_codes,
                                   mlp_scales, experts_codes, experts_scales, hidden, eps, router_root, BLOCK=block,
                                   MLP_CODES=mlp_kind, MLP_CODES_BLOCK=mlp_block, EXPERTS_CODES=experts_kind,
                                   EXPERTS_CODES_BLOCK=experts_block, FP32_MATH=_interpreting(),
                                   num_warps=_warps(block))  # fmt: skip
    return outs


@post_attention.register_fake
def _(attn, residual, w_post, w_mlp, w_experts, router_scale, eps, router_root, mlp_codes=None, mlp_scales=None,
      experts_codes=None, experts_scales=None):  # fmt: skip
    return _like(residual, 4)


@torch.library.custom_op("dgemma::post_ffn", mutates_args=("experts", "next_codes", "next_scales"))
def post_ffn(
    mlp: torch.Tensor, experts: torch.Tensor, residual: torch.Tensor, w_mlp: torch.Tensor, w_experts: torch.Tensor,
    w_sum: torch.Tensor, layer_scalar: torch.Tensor, w_next: torch.Tensor, eps: float, clear_experts: bool = False,
    next_codes: torch.Tensor | None = None, next_scales: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """(the layer's output `[T, H]`, the next norm of it `[T, H]`, also as codes into `next_*` when given).
    `experts` may be the experts' fp32 top-k sums (rounded here as their cast would); `clear_experts` zeroes them
    once read, for the next layer's sums."""
    outs = _like(residual, 2)
    rows, hidden = residual.shape
    block = _block(hidden)
    next_codes, next_scales, kind, codes_block = _codes_outputs(next_codes, next_scales, residual)
    post_ffn_kernel[(rows,)](mlp, experts, residual, w_mlp, w_experts, w_sum, layer_scalar, w_next, *outs, next_codes,
                             next_scales, hidden, eps, BLOCK=block, CLEAR_EXPERTS=clear_experts, CODES=kind,
                             CODES_BLOCK=codes_block, FP32_MATH=_interpreting(), num_warps=_warps(block))  # fmt: skip
    return outs


@post_ffn.register_fake
def _(mlp, experts, residual, w_mlp, w_experts, w_sum, layer_scalar, w_next, eps, clear_experts=False,
      next_codes=None, next_scales=None):  # fmt: skip
    return _like(residual, 2)


@torch.library.custom_op("dgemma::step_input", mutates_args=("first_codes", "first_scales"))
def step_input(
    ids: torch.Tensor, embed: torch.Tensor, signal: torch.Tensor, w_in: torch.Tensor, embed_scale: float, eps: float,
    first_codes: torch.Tensor | None = None, first_scales: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """(post_norm(embed(ids) * scale + signal), the first layer's input norm of it), each `[T, H]`; the second also
    as codes into `first_*` when given."""
    outs = _like(signal, 2)
    rows, hidden = signal.shape
    block = _block(hidden)
    first_codes, first_scales, kind, codes_block = _codes_outputs(first_codes, first_scales, signal)
    step_input_kernel[(rows,)](ids, embed, signal, w_in, *outs, first_codes, first_scales, hidden, embed_scale, eps,
                               BLOCK=block, CODES=kind, CODES_BLOCK=codes_block, FP32_MATH=_interpreting(),
                               num_warps=_warps(block))  # fmt: skip
    return outs


@step_input.register_fake
def _(ids, embed, signal, w_in, embed_scale, eps, first_codes=None, first_scales=None):
    return _like(signal, 2)


@torch.library.custom_op("dgemma::signal_norm", mutates_args=("codes", "scales"))
def signal_norm(
    soft: torch.Tensor, mask: torch.Tensor, weight: torch.Tensor, rows_per_batch: int, embed_scale: float, eps: float,
    codes: torch.Tensor | None = None, scales: torch.Tensor | None = None,
) -> torch.Tensor:  # fmt: skip
    """pre_norm(soft * embed_scale * mask[row // rows_per_batch]) `[T, H]`, also as codes into `codes` / `scales`
    when given."""
    (out,) = _like(soft, 1)
    rows, hidden = soft.shape
    block = _block(hidden)
    codes, scales, kind, codes_block = _codes_outputs(codes, scales, soft)
    signal_norm_kernel[(rows,)](soft, mask, weight, out, codes, scales, hidden, rows_per_batch, embed_scale, eps,
                                BLOCK=block, CODES=kind, CODES_BLOCK=codes_block, FP32_MATH=_interpreting(),
                                num_warps=_warps(block))  # fmt: skip
    return out


@signal_norm.register_fake
def _(soft, mask, weight, rows_per_batch, embed_scale, eps, codes=None, scales=None):
    return _like(soft, 1)[0]


def _codes_outputs(codes: torch.Tensor | None, scales: torch.Tensor | None, rows: torch.Tensor):
    """(codes pointer, scales pointer, KIND, CODES_BLOCK) of a norm launch's optional codes outputs for `rows`
    `[T, H]`; where there are none, `rows` stands in for the pointers the kernel never follows."""
    if codes is None:
        assert scales is None, "codes and scales go together"
        return rows, rows, 0, 64
    tokens, hidden = rows.shape
    assert codes.shape == (tokens, hidden) and codes.is_contiguous() and scales.is_contiguous(), "codes [T, H]"
    assert codes.dtype in (torch.int8, torch.uint8) and scales.dtype == torch.float32, "int8 / e4m3 bytes, fp32 scales"
    assert scales.shape[0] == tokens and hidden % scales.shape[1] == 0, "a scale a row per block of inputs"
    codes_block = hidden // scales.shape[1]
    assert _block(hidden) >= codes_block and codes_block & (codes_block - 1) == 0, "power-of-two blocks in a row"
    return codes, scales, ACTIVATION_CODES["fp8" if codes.dtype == torch.uint8 else "int8"], codes_block


@torch.library.custom_op("dgemma::attention_inputs", mutates_args=())
def attention_inputs(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor,
    cos: torch.Tensor, sin: torch.Tensor, cache_keys: torch.Tensor, cache_values: torch.Tensor,
    offset: torch.Tensor, length: int, eps: float, grouped: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """transformers' decoder attention before SDPA, for q `[T, Hq * D]`, k and v `[T, Hkv * D]`:
    (queries `[B, Hq, L, D]`, keys and values `[B, Hq, M + L, D]`): the cache layer `[B, Hkv, M, D]`
    with each head repeated Hq / Hkv times, the canvas's normed (and, for keys, rotated) heads at rows
    `offset` + [0, L), zeros after M elsewhere. `grouped`: keys and values `[B, Hkv, M + L, D]`, each
    key/value head once (for SDPA over each group's queries folded into one sequence: `fused_decoder`)."""
    batch, kv_heads, cached, dim = cache_keys.shape
    assert cache_keys.is_contiguous() and cache_values.is_contiguous(), "the static cache's layout"
    assert q.stride(-1) == 1 and k.stride(-1) == 1 and v.stride(-1) == 1, "heads are read contiguously"
    heads = q.shape[-1] // dim
    out_heads = kv_heads if grouped else heads
    queries, keys, values = _attention_tensors(q, cache_keys, length, heads, out_heads)
    tokens = q.shape[0]
    # Interpreted, each program costs milliseconds of Python whatever its size: few, large copies on CPU.
    block_p = 256 if _interpreting() else 16
    copies = batch * out_heads * 2 * triton.cdiv(cached + length, block_p)
    attention_inputs_kernel[(tokens + copies,)](
        q, k, v, q_weight, k_weight, cos, sin, cache_keys, cache_values, queries, keys, values, offset,
        q.stride(0), k.stride(0), v.stride(0), tokens, heads, kv_heads, length, cached, eps,
        D=dim, REPEAT=out_heads // kv_heads, BLOCK_P=block_p, HEADS=_block(heads), KV_HEADS=_block(kv_heads),
        num_warps=4 if dim * heads <= 4096 else 8,
    )  # fmt: skip
    return queries, keys, values


@attention_inputs.register_fake
def _(q, k, v, q_weight, k_weight, cos, sin, cache_keys, cache_values, offset, length, eps, grouped=False):
    heads = q.shape[-1] // cache_keys.shape[-1]
    return _attention_tensors(q, cache_keys, length, heads, cache_keys.shape[1] if grouped else heads)


def _attention_tensors(q: torch.Tensor, cache_keys: torch.Tensor, length: int, heads: int, out_heads: int):
    batch, _, cached, dim = cache_keys.shape
    shape = (batch, out_heads, cached + length, dim)
    return q.new_empty((batch, heads, length, dim)), cache_keys.new_empty(shape), cache_keys.new_empty(shape)


@torch.library.custom_op("dgemma::gelu_mul", mutates_args=())
def gelu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """gelu_tanh(gate) * up, `[T, I]`."""
    assert gate.is_contiguous() and up.is_contiguous() and gate.shape == up.shape, "elementwise over one layout"
    out = torch.empty_like(gate)
    block = 1024
    gelu_mul_kernel[(triton.cdiv(gate.numel(), block),)](gate, up, out, gate.numel(), BLOCK=block)
    return out


@gelu_mul.register_fake
def _(gate, up):
    return torch.empty_like(gate)


@torch.library.custom_op("dgemma::route", mutates_args=())
def route(
    x: torch.Tensor, proj_weight: torch.Tensor, expert_scale: torch.Tensor, top_k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' DiffusionGemmaTextRouter from its projection (`router.proj`, a Linear without bias, weight
    `[E, H]`) on, for x `[T, H]`: (weights `[T, K]` fp32, experts `[T, K]` int64), in one launch."""
    assert x.is_contiguous() and proj_weight.is_contiguous(), "rows of one layout"
    assert proj_weight.dtype == x.dtype, "router.proj's weight in the input's dtype, as nn.Linear needs"
    rows, hidden = x.shape
    experts = proj_weight.shape[0]
    assert top_k & (top_k - 1) == 0 and top_k <= experts, "tl.arange needs a power-of-two top_k, of the experts"
    weights, index = _routes(x, top_k)
    block_m = 16  # the weight (720 KB at full size) is read once per 16 rows; 16 is tl.dot's least M
    interpreting = _interpreting()
    route_kernel[(triton.cdiv(rows, block_m),)](
        x, proj_weight, expert_scale, weights, index, rows, hidden, experts, K=top_k, BLOCK_M=block_m,
        BLOCK_H=64, BLOCK_E=max(16, _block(experts)),
        DOT_PRECISION="ieee" if x.dtype == torch.float32 or interpreting else "tf32", DOT_FP32=interpreting,
    )  # fmt: skip
    return weights, index


@route.register_fake
def _(x, proj_weight, expert_scale, top_k):
    return _routes(x, top_k)


def _routes(x: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    rows = x.shape[0]
    return (x.new_empty((rows, top_k), dtype=torch.float32), x.new_empty((rows, top_k), dtype=torch.int64))


@torch.library.custom_op("dgemma::softmax_rows", mutates_args=("out",))
def softmax_rows(logits: torch.Tensor, out: torch.Tensor) -> None:
    """out = softmax(logits, dim=-1, dtype=float32) in out's dtype; logits `[R, V]` contiguous."""
    assert logits.is_contiguous() and out.is_contiguous() and out.shape == logits.shape, "rows of one layout"
    block = min(4096, _block(logits.shape[-1]))
    softmax_rows_kernel[(logits.shape[0],)](logits, out, logits.shape[-1], BLOCK_V=block, num_warps=_warps(block))


@softmax_rows.register_fake
def _(logits, out):
    return None


def _like(tensor: torch.Tensor, count: int) -> tuple[torch.Tensor, ...]:
    return tuple(torch.empty_like(tensor) for _ in range(count))
