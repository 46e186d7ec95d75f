"""The fused quantized MoE and the dense dequant-GEMM, launched from torch.

Owns: when the Triton path applies (`fused_supported`), the routing metadata
(built on the device, sized for the worst case so every shape is static and
a CUDA graph can capture it; no host sync), tile sizes, the launches, and a
launch counter that `bench moe` reads. Knows nothing of modules or models:
`quantization` calls in with its packed buffers. The kernels themselves and
why they are ours are in `moe_kernels`.

One MoE layer is: a stable argsort of the routed experts, one alignment
kernel (histogram, block padding, scatter into sorted rows), one gate_up
launch (GELU-tanh * up fused, all experts), one down launch (routing weight
and the top-k sum fused as fp32 atomic adds), and a cast. No weight is ever
dequantized to memory. The atomic top-k sum makes the last bits of a CUDA
result depend on scheduling order (K = top_k adds per element, in fp32).

Tile sizes are fixed heuristics, not autotuned (no GPU was at hand when this
was written); `bench moe` and `bench quant` on a GPU are where to tune them.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools

import torch

from . import moe_kernels

_MIN_DOT = 16
"""tl.dot needs every tile dimension >= 16."""


@dataclasses.dataclass
class LaunchCount:
    """Triton launches made inside `count_launches()`; `inside` is true during one (its host copies are not ops)."""

    launches: int = 0
    inside: bool = False


_ACTIVE_COUNT: contextvars.ContextVar[LaunchCount | None] = contextvars.ContextVar(
    "dgemma_launch_count", default=None
)


@contextlib.contextmanager
def count_launches():
    """Count Triton launches in this context (the op count of `bench moe`)."""
    count = LaunchCount()
    token = _ACTIVE_COUNT.set(count)
    try:
        yield count
    finally:
        _ACTIVE_COUNT.reset(token)


def active_launch_count() -> LaunchCount | None:
    return _ACTIVE_COUNT.get()


def interpreting() -> bool:
    """True when the kernels were built for Triton's CPU interpreter (TRITON_INTERPRET=1 at import)."""
    return type(moe_kernels.dequant_gemm_kernel).__name__ == "InterpretedFunction"


def block_k_for(group: int) -> int | None:
    """Largest power-of-two K step <= 64 that divides the scale group (one scale per step), or None."""
    block = 64
    while block >= _MIN_DOT:
        if group % block == 0:
            return block
        block //= 2
    return None


def fused_supported(device: torch.device, mode: str, *groups: int) -> bool:
    """Whether the Triton kernels can run these weights on `device`.

    CUDA: always for int8/int4; fp8 needs sm_89+ (the e4m3 conversion Triton
    emits). CPU: only under the interpreter (tests and `bench moe`). Groups
    must allow a K step of at least 16.
    """
    if mode not in moe_kernels.MODE_CODES or any(block_k_for(g) is None for g in groups):
        return False
    if device.type == "cuda":
        if interpreting():
            return False
        return mode != "fp8" or _capability(device.index) >= (8, 9)
    return interpreting()


@functools.cache
def _capability(index: int | None) -> tuple[int, int]:
    # Asked on every forward (also while a CUDA graph is captured): ask the driver once.
    return torch.cuda.get_device_capability(index)


@dataclasses.dataclass(frozen=True)
class Routing:
    """Pairs (token, slot) sorted by expert in rows padded to BLOCK_M per expert; all on the device."""

    sorted_pairs: torch.Tensor  # [max_rows] int32; num_pairs marks padding
    block_experts: torch.Tensor  # [max_blocks] int32; num_experts past the rows in use
    rows_used: torch.Tensor  # [1] int32
    block_m: int
    num_pairs: int


def _next_power_of_2(value: int) -> int:
    return 1 << max(0, value - 1).bit_length()


def block_m_for(num_pairs: int, num_experts: int) -> int:
    """Rows per block: about the pairs an expert gets, so padding stays small (16 for a 256-token canvas, top-8)."""
    per_expert = num_pairs / num_experts
    return 16 if per_expert <= 24 else 32 if per_expert <= 48 else 64


def align_routing(top_k_index: torch.Tensor, num_experts: int, block_m: int) -> Routing:
    """Build the sorted, block-padded rows for `top_k_index` `[T, top_k]` without leaving the device."""
    num_pairs = top_k_index.numel()
    # Worst case: every used expert wastes block_m - 1 rows of padding.
    max_rows = -(-(num_pairs + min(num_experts, num_pairs) * (block_m - 1)) // block_m) * block_m
    max_blocks = max_rows // block_m
    flat = top_k_index.view(-1)  # [P]
    order = torch.argsort(flat, stable=True)  # [P]
    device = top_k_index.device
    e_p2 = _next_power_of_2(num_experts + 1)
    sorted_pairs = torch.empty(max_rows, dtype=torch.int32, device=device)
    block_experts = torch.empty(max_blocks, dtype=torch.int32, device=device)
    rows_used = torch.empty(1, dtype=torch.int32, device=device)
    scratch = torch.empty(2 * e_p2, dtype=torch.int32, device=device)
    _launch(
        moe_kernels.align_routing_kernel, (1,),
        flat, order, sorted_pairs, block_experts, rows_used, scratch,
        num_pairs, num_experts, max_rows, max_blocks,
        BLOCK_M=block_m, P_P2=_next_power_of_2(num_pairs), E_P2=e_p2,
        ROWS_P2=_next_power_of_2(max_rows), BLOCKS_P2=_next_power_of_2(max_blocks),
        num_warps=8 if not interpreting() else 4,
    )  # fmt: skip
    return Routing(sorted_pairs, block_experts, rows_used, block_m, num_pairs)


def fused_experts(
    hidden_states: torch.Tensor,
    top_k_index: torch.Tensor,
    top_k_weights: torch.Tensor,
    *,
    gate_up_data: torch.Tensor,
    gate_up_scales: torch.Tensor,
    down_data: torch.Tensor,
    down_scales: torch.Tensor,
    mode: str,
) -> torch.Tensor:
    """The DiffusionGemma experts forward on packed weights: `[T, H]` -> `[T, H]`.

    gate_up `[E, 2I, H(/2)]` with scales `[E, 2I, H/g]`; down `[E, H, I(/2)]`
    with scales `[E, H, I/g']`. Per pair: gelu_tanh(x @ gate.T) * (x @ up.T)
    @ down.T * routing weight, summed over the token's top_k pairs.
    """
    assert hidden_states.dim() == 2 and top_k_index.shape == top_k_weights.shape, (
        "expects [T, H] and [T, top_k]"
    )
    assert top_k_index.is_contiguous() and top_k_weights.is_contiguous(), (
        "routing tensors index as [T * top_k]"
    )
    tokens, hidden = hidden_states.shape
    top_k = top_k_index.shape[1]
    num_experts, two_inter, _ = gate_up_data.shape
    inter = two_inter // 2
    group_up = hidden // gate_up_scales.shape[-1]
    group_down = inter // down_scales.shape[-1]
    routing = align_routing(top_k_index, num_experts, block_m_for(tokens * top_k, num_experts))
    max_blocks = routing.block_experts.numel()
    intermediate = torch.empty(
        routing.num_pairs, inter, dtype=hidden_states.dtype, device=hidden_states.device
    )
    block_n = _block_n(inter)
    _launch_gemm(
        hidden_states, gate_up_data, gate_up_scales, intermediate, routing, top_k_weights,
        num_rows=routing.num_pairs, n=inter, k=hidden, a_row_div=top_k, out_row_div=1,
        grid=(max_blocks * -(-inter // block_n),), block_n=block_n, block_k=block_k_for(group_up),
        group=group_up, mode=mode, routed=True, gated=True, route_weighted=False,
    )  # fmt: skip
    output = torch.zeros(tokens, hidden, dtype=torch.float32, device=hidden_states.device)
    block_n = _block_n(hidden)
    _launch_gemm(
        intermediate, down_data, down_scales, output, routing, top_k_weights,
        num_rows=routing.num_pairs, n=hidden, k=inter, a_row_div=1, out_row_div=top_k,
        grid=(max_blocks * -(-hidden // block_n),), block_n=block_n, block_k=block_k_for(group_down),
        group=group_down, mode=mode, routed=True, gated=False, route_weighted=True,
    )  # fmt: skip
    return output.to(hidden_states.dtype)


def fused_linear(x: torch.Tensor, data: torch.Tensor, scales: torch.Tensor, mode: str) -> torch.Tensor:
    """`x @ dequantize(data, scales).T` for a packed `[N, K(/2)]` weight, without a dequantized copy."""
    in_features = x.shape[-1]
    out_features = data.shape[0]
    rows = x.reshape(-1, in_features)  # [M, K]
    group = in_features // scales.shape[-1]
    output = torch.empty(rows.shape[0], out_features, dtype=x.dtype, device=x.device)
    block_m = 16 if rows.shape[0] <= 16 else 64 if not interpreting() else 32
    block_n = _block_n(out_features)
    grid = (-(-rows.shape[0] // block_m) * -(-out_features // block_n),)
    _launch_gemm(
        rows, data.unsqueeze(0), scales.unsqueeze(0), output, None, None,
        num_rows=rows.shape[0], n=out_features, k=in_features, a_row_div=1, out_row_div=1,
        grid=grid, block_n=block_n, block_k=block_k_for(group), group=group, mode=mode,
        routed=False, gated=False, route_weighted=False, block_m=block_m,
    )  # fmt: skip
    return output.view(*x.shape[:-1], out_features)


def _block_n(n: int) -> int:
    # The interpreter's cost grows with program count and tile size alike; GPUs want wide tiles.
    if interpreting():
        return 32 if n >= 32 else _MIN_DOT
    return 128 if n >= 2048 else 64


def _launch_gemm(
    a, w, s, out, routing: Routing | None, route_weights, *, num_rows, n, k, a_row_div, out_row_div,
    grid, block_n, block_k, group, mode, routed, gated, route_weighted, block_m=None,
) -> None:  # fmt: skip
    assert block_k is not None and k % block_k == 0, f"K={k} with group {group} has no K step >= {_MIN_DOT}"
    dummy = out  # pointer arguments a dense launch never reads
    _launch(
        moe_kernels.dequant_gemm_kernel, grid,
        a, w, s, out,
        routing.sorted_pairs if routing else dummy,
        routing.block_experts if routing else dummy,
        routing.rows_used if routing else dummy,
        route_weights if route_weights is not None else dummy,
        num_rows, n, k, a_row_div, out_row_div,
        a.stride(0), a.stride(1), w.stride(0), w.stride(1), w.stride(2),
        s.stride(0), s.stride(1), s.stride(2), out.stride(0), out.stride(1),
        GROUP=group, MODE=moe_kernels.MODE_CODES[mode], ROUTED=routed, GATED=gated,
        ROUTE_WEIGHTED=route_weighted,
        DOT_PRECISION="ieee" if a.dtype == torch.float32 or interpreting() else "tf32",
        DOT_FP32=interpreting(),
        BLOCK_M=routing.block_m if routing else block_m, BLOCK_N=block_n, BLOCK_K=block_k,
        num_warps=4,
    )  # fmt: skip


def _launch(kernel, grid, *args, **kwargs) -> None:
    count = _ACTIVE_COUNT.get()
    if count is None:
        kernel[grid](*args, **kwargs)
        return
    count.launches += 1
    count.inside = True
    try:
        kernel[grid](*args, **kwargs)
    finally:
        count.inside = False
