"""Triton kernels for quantized weights: routing alignment, and the first-generation dequantizing GEMM.

Owns device code only: `align_routing_kernel` (the product's routing: histogram,
block padding and the scatter into expert-grouped rows, one program, no sort,
no host sync) and `dequant_gemm_kernel`, the first-generation expert GEMM, kept so
`bench moe` can time it against its successor (`expert_kernels`) on the same
card: it reads `quant_formats.legacy_layout` (int4 as two's-complement nibble
pairs `[E, N, K/2]`, scales `[E, N, K/g]`), unpacks in fp32 per element
(~20 instructions a weight: 1.745 ms a full-size int4 layer on an H200, 18x
its floor), and is no longer on the product path. When to launch either is `fused_moe`.

Why our own kernels: no library covers the GPUs this product runs on with
int4 group scales (REFERENCE.md, "Fused kernels"): torch's grouped GEMM is fast
only on sm_90/sm_100 and `_scaled_grouped_mm` raises elsewhere, flashinfer's
fused MoE skips sm_89 and GELU-tanh gates on sm_120, torchao's MoE is a
prototype, bitsandbytes and transformers' own int4-free path dequantize one
expert at a time. The design follows vLLM's `fused_moe` (sorted, block-padded
token->expert rows; one launch for all experts), written here from that idea.

The kernels run on CPU tensors under `TRITON_INTERPRET=1` (the tests do); the
decorators read that variable when this module is imported.
"""

from __future__ import annotations

import triton
import triton.language as tl

MODE_CODES = {"int8": 0, "int4": 1, "fp8": 2}
"""The `MODE` constexpr of `dequant_gemm_kernel` for each packed mode."""


@triton.jit
def align_routing_kernel(
    flat_experts_ptr,  # [P] int64: expert of each (token, slot) pair, P = T * top_k
    sorted_pairs_ptr,  # out [MAX_ROWS] int32: pair id of each padded row; P marks padding
    block_experts_ptr,  # out [MAX_BLOCKS] int32: expert of each BLOCK_M rows; E past the last used block
    rows_used_ptr,  # out [1] int32: rows in use (sum of the block-padded counts)
    scratch_ptr,  # [3 * E_P2] int32: per-expert first row, padded end and rank counter
    num_pairs,
    num_experts,
    max_rows,
    max_blocks,
    BLOCK_M: tl.constexpr,
    P_P2: tl.constexpr,
    E_P2: tl.constexpr,
    ROWS_P2: tl.constexpr,
    BLOCKS_P2: tl.constexpr,
):
    """One program: histogram, block padding and the scatter into expert-grouped rows; no sort, no host sync.

    A pair's row is its expert's first padded row plus its rank among that expert's pairs, which an atomic
    counter per expert hands out. The order of one expert's pairs among its rows is the order the atomics
    land in (the pairs' order on CPU): no kernel reads it. A row's result depends only on its pair, and a
    token's top-k sum (the down launch's atomics) has at most one pair per expert."""
    pairs = tl.arange(0, P_P2)
    valid = pairs < num_pairs
    # Invalid lanes count in bin `num_experts`, which is then zeroed: no masked histogram needed.
    experts = tl.load(flat_experts_ptr + pairs, mask=valid, other=num_experts).to(tl.int32)
    bins = tl.arange(0, E_P2)
    counts = tl.histogram(experts, E_P2)
    counts = tl.where(bins < num_experts, counts, 0)
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    padded_end = tl.cumsum(padded, 0)
    tl.store(scratch_ptr + bins, padded_end - padded)
    tl.store(scratch_ptr + E_P2 + bins, padded_end)
    tl.store(scratch_ptr + 2 * E_P2 + bins, tl.zeros([E_P2], dtype=tl.int32))
    tl.store(rows_used_ptr, tl.sum(padded, 0))
    rows = tl.arange(0, ROWS_P2)
    tl.store(sorted_pairs_ptr + rows, tl.zeros([ROWS_P2], dtype=tl.int32) + num_pairs, mask=rows < max_rows)
    tl.debug_barrier()  # the scratch and the padding fill must land before they are read or overwritten

    rank = tl.atomic_add(scratch_ptr + 2 * E_P2 + experts, 1, mask=valid)
    destination = tl.load(scratch_ptr + experts, mask=valid, other=0) + rank
    tl.store(sorted_pairs_ptr + destination, pairs, mask=valid)

    # A block belongs to the expert whose padded range holds its first row, i.e. to
    # the count of experts that end at or before it (empty ones included).
    blocks = tl.arange(0, BLOCKS_P2)
    block_start = blocks * BLOCK_M
    owner = tl.zeros([BLOCKS_P2], dtype=tl.int32)
    for expert in range(0, num_experts):
        end = tl.load(scratch_ptr + E_P2 + expert)
        owner += (end <= block_start).to(tl.int32)
    tl.store(block_experts_ptr + blocks, owner, mask=blocks < max_blocks)


@triton.jit
def _weight_tile(ptrs, n_mask, nibble_shift, MODE: tl.constexpr, dtype):
    """The `[BLOCK_K, BLOCK_N]` tile of unscaled weight values at `ptrs`, in `dtype` (exact for every mode).

    int4 `ptrs` point at each element's byte (two rows of K share one) and
    `nibble_shift` picks its half. Through fp32 first: exact either way, and
    Triton's interpreter mangles a direct int -> bf16 conversion.
    """
    raw = tl.load(ptrs, mask=n_mask, other=0)
    if MODE == 1:  # int4: element 2i in the low nibble, 2i+1 in the high one
        nibble = (raw.to(tl.int32) >> nibble_shift) & 0xF
        values = (nibble - ((nibble & 0x8) << 1)).to(tl.float32)  # sign-extend 8..15 -> -8..-1
    elif MODE == 2:  # fp8 e4m3fn bits stored as uint8
        values = raw.to(tl.float8e4nv, bitcast=True).to(tl.float32)
    else:  # int8
        values = raw.to(tl.float32)
    return values.to(dtype)


@triton.jit
def dequant_gemm_kernel(
    a_ptr,  # activations [A rows, K]
    w_ptr,  # packed weights [E, N (x2 when GATED), K or K/2]
    s_ptr,  # scales [E, N (x2), K / GROUP]
    out_ptr,  # [out rows, N]: dtype of the result, fp32 when ROUTE_WEIGHTED (atomic sums)
    sorted_pairs_ptr,  # ROUTED: [MAX_ROWS] int32 pair per padded row
    block_experts_ptr,  # ROUTED: [MAX_BLOCKS] int32 expert per row block
    rows_used_ptr,  # ROUTED: [1] int32
    route_weights_ptr,  # ROUTE_WEIGHTED: [P] routing weight per pair
    num_rows,  # ROUTED: pairs P; dense: rows of a
    N,
    K,
    a_row_div,  # a row = pair // a_row_div (gate_up reads token = pair // top_k; down reads pair)
    out_row_div,  # out row = pair // out_row_div (down sums the top_k pairs of a token into one row)
    stride_am,
    stride_ak,
    stride_we,
    stride_wn,
    stride_wk,
    stride_se,
    stride_sn,
    stride_sg,
    stride_om,
    stride_on,
    GROUP: tl.constexpr,
    MODE: tl.constexpr,
    ROUTED: tl.constexpr,
    GATED: tl.constexpr,
    ROUTE_WEIGHTED: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    DOT_FP32: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """out = a @ dequant(w[expert]).T per row block, with the MoE prologue/epilogue when routed.

    GATED: w holds [gate; up] stacked along N (N is the gate's width); the output
    is gelu_tanh(a @ gate.T) * (a @ up.T), the DiffusionGemma expert activation.
    ROUTE_WEIGHTED: each row is scaled by its pair's routing weight and added
    atomically into its token's row: the top-k sum happens in the epilogue.
    DOT_FP32: both dot operands in fp32 (set only under the interpreter).
    """
    pid = tl.program_id(0)
    n_blocks = tl.cdiv(N, BLOCK_N)
    pid_m = pid // n_blocks
    pid_n = pid % n_blocks
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    if ROUTED:
        # The grid is sized for the worst case; blocks past the rows in use leave at once.
        if pid_m * BLOCK_M >= tl.load(rows_used_ptr):
            return
        expert = tl.load(block_experts_ptr + pid_m).to(tl.int64)
        pairs = tl.load(sorted_pairs_ptr + rows)
        row_valid = pairs < num_rows
        a_rows = pairs // a_row_div
        out_rows = pairs // out_row_div
    else:
        expert = 0
        pairs = rows
        row_valid = rows < num_rows
        a_rows = rows
        out_rows = rows
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_valid = offs_n < N
    offs_k = tl.arange(0, BLOCK_K)
    # Pointers are built once and advanced per K step (integer math stays out of the loop).
    a_ptrs = a_ptr + a_rows[:, None] * stride_am + offs_k[None, :] * stride_ak  # [BLOCK_M, BLOCK_K]
    if MODE == 1:
        k_offsets = (offs_k[:, None] // 2) * stride_wk  # each element's byte
        k_step = (BLOCK_K // 2) * stride_wk
    else:
        k_offsets = offs_k[:, None] * stride_wk
        k_step = BLOCK_K * stride_wk
    nibble_shift = (offs_k[:, None] % 2) * 4  # [BLOCK_K, 1]; read only for int4
    w_ptrs = w_ptr + expert * stride_we + offs_n[None, :] * stride_wn + k_offsets  # [BLOCK_K, BLOCK_N]
    s_ptrs = s_ptr + expert * stride_se + offs_n * stride_sn  # [BLOCK_N]
    up_w_offset = N * stride_wn  # GATED: the up rows follow the N gate rows
    up_s_offset = N * stride_sn
    n_mask = n_valid[None, :]
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        a = tl.load(a_ptrs, mask=row_valid[:, None], other=0.0)
        if DOT_FP32:  # the interpreter's bf16 dot is wrong; bf16 products are exact in fp32 anyway
            a = a.to(tl.float32)
        group_offset = (k0 // GROUP) * stride_sg  # BLOCK_K divides GROUP: one scale per column per step
        w = _weight_tile(w_ptrs, n_mask, nibble_shift, MODE, a.dtype)
        scale = tl.load(s_ptrs + group_offset, mask=n_valid, other=0.0).to(tl.float32)
        acc += tl.dot(a, w, input_precision=DOT_PRECISION) * scale[None, :]
        if GATED:
            w_up = _weight_tile(w_ptrs + up_w_offset, n_mask, nibble_shift, MODE, a.dtype)
            scale_up = tl.load(s_ptrs + up_s_offset + group_offset, mask=n_valid, other=0.0).to(tl.float32)
            acc_up += tl.dot(a, w_up, input_precision=DOT_PRECISION) * scale_up[None, :]
        a_ptrs += BLOCK_K * stride_ak
        w_ptrs += k_step
    if GATED:
        # gelu_tanh(x) = x * (1 + tanh(z)) / 2 = x * sigmoid(2z), z = sqrt(2/pi) * (x + 0.044715 x^3)
        inner = 0.7978845608028654 * (acc + 0.044715 * acc * acc * acc)
        acc = acc * tl.sigmoid(2.0 * inner) * acc_up
    out_mask = row_valid[:, None] & n_valid[None, :]
    out_ptrs = out_ptr + out_rows[:, None] * stride_om + offs_n[None, :] * stride_on
    if ROUTE_WEIGHTED:
        route = tl.load(route_weights_ptr + pairs, mask=row_valid, other=0.0).to(tl.float32)
        tl.atomic_add(out_ptrs, acc * route[:, None], mask=out_mask)
    else:
        tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=out_mask)
