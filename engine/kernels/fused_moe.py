"""The fused quantized MoE and the dense quantized linear, launched from torch.

Owns: when the Triton path applies (`fused_supported`), the routing metadata
(built on the device, sized for the worst case so every shape is static and
a CUDA graph can capture it; no host sync), which kernel variant and tile
sizes run (`LaunchSettings`), the launches, and a launch counter that
`bench moe` reads. Knows nothing of modules or models: `quantization` calls
in with its packed buffers. The kernels and why they are ours:
`expert_kernels` (the expert GEMM) and `moe_kernels` (routing alignment, and
the first-generation dequant GEMM kept for A/B timing).

One MoE layer is: one alignment kernel (histogram, block padding, each pair's
row from an atomic counter per expert: no sort), one gate_up launch (GELU-tanh
* up fused, all experts), one down launch (routing weight and the top-k sum
fused as fp32 atomic adds), a zero fill for those sums and a cast (in the fused
decoder's step neither: one buffer a step, which post_ffn rounds and clears;
`fused_experts`' `into`): 3 Triton launches, `count_launches` counts them. w8a8
quantizes activations inside the two GEMM launches: no extra launch (with
`launch_settings(activation_codes=True)`, opt-in, one `activation_codes` launch
before the gate_up rounds them once for all its programs instead, and the gate_up
stores the down's codes in place of its output: `expert_gemm_codes`; a caller
whose own launch wrote them, as the fused decoder's norms do, hands them in as
`ActivationCodes` and there is no extra launch). No
weight is ever dequantized to memory. The atomic top-k sum makes the last
bits of a CUDA result depend on scheduling order (top_k fp32 adds per element).

Floors of one layer of the full model (128 experts, top-8, hidden 2816,
width 704; every expert is read at a 256-token canvas), weights + scales
read once at the H200's measured 4.1 TB/s: bf16 0.371 ms (1,522 MB), fp8 /
int8 0.190 (777 MB), int4 0.097 (396 MB), affine int4 at group 32 0.116
(476 MB), a GGUF Q4_K_M as it loads (gate_up affine int4 with Q4_K's
two-level scales, down int8 with an fp16 scale per 32) 0.137 (563 MB). The GEMM work (2 x 2,048 pairs x 5.95 M MACs = 24.4 GFLOP) is
~0.03 ms of tensor-core time, so the layer is memory-bound if the unpacking
keeps up: the first-generation int4 kernel spent ~20 integer / fp32
instructions per weight (1.745 ms, 18.3x its floor); the magic-number unpack
compiles to ~1.5 per weight (`lop3` + `HFMA2.BF16_V2` on pairs, a shift per
code; bench/device/compile_kernels.py reads it from the cubin), and row
blocks of ~1.5x an expert's pairs read each expert's weights about once.
Predicted before any GPU run (2026-11-28, H200, 256 tokens): int4 0.15-0.25
ms, w8a8 0.25-0.30 ms, of which ~0.03 ms routing (argsort and align, as it
was then), zero fill and cast; at 1,024 tokens (64-row blocks, ~half
the experts read twice) +0.05-0.1 ms. Launches per layer: 3 Triton (align,
gate_up, down), the fp32 zero fill and the bf16 cast.

Tile sizes are heuristics (`launch_settings_for`, `block_m_for`, `dense_block_m`) checked for
registers on sm_89/90/120 ahead of time; `bench/device/moe_kernels.py sweep`
times the alternatives on a GPU.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
from typing import NamedTuple

import torch

from . import expert_kernels, moe_kernels

_MIN_DOT = 16
"""tl.dot needs every tile dimension >= 16."""
ACTIVATION_KINDS = ("none", "int8", "fp8")
"""What a GEMM does with its activations: none (bf16 in, w8a16 / w4a16) or quantize them per row in-kernel (w8a8)."""


class CodesLayout(NamedTuple):
    """How a w8a8 / w4a8 launch reads activations rounded ahead of it: their kind and inputs per scale (its K step)."""

    kind: str  # "int8" or "fp8"
    block_k: int

    def empty(self, like: torch.Tensor, rows: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Empty (codes `[rows, k]`, fp32 scales `[rows, k / block_k]`) on `like`'s device, for a producer to fill."""
        return _codes_output(like, self.kind, self.block_k, (rows, k))


class ActivationCodes(NamedTuple):
    """Activations rounded once for the w8a8 / w4a8 launches that read them: what `activation_codes` writes, or a
    producer in its epilogue (`fused_layer`'s norms, a gated GEMM's `codes_out`). `fused_linear` and
    `fused_experts` take them in place of the activations they stand for."""

    codes: torch.Tensor  # [R, K] int8, or e4m3 bytes as uint8
    scales: torch.Tensor  # [R, K / block_k] fp32
    dtype: torch.dtype  # the activations' own dtype: the GEMM's output's

    @property
    def layout(self) -> CodesLayout:
        return CodesLayout("fp8" if self.codes.dtype == torch.uint8 else "int8",
                           self.codes.shape[-1] // self.scales.shape[-1])  # fmt: skip

    @property
    def device(self) -> torch.device:
        return self.codes.device


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


@dataclasses.dataclass(frozen=True)
class LaunchSettings:
    """How one expert GEMM launch runs; None fields take `launch_settings_for`'s heuristic."""

    block_m: int | None = None
    """Routed rows per program (the expert GEMMs' row blocks; `block_m_for`)."""
    block_n: int | None = None
    """Output columns per program (weight rows per program)."""
    swap: bool | None = None
    """Tokens on the MMA's N side (the weight tile is the dot's first operand)."""
    asm: bool | None = None
    """int4: unpack with inline PTX (CUDA only) instead of Triton bit ops."""
    scale_weights: bool | None = None
    """Symmetric int4 under 16-bit activations, one scale per K-block: scale the weights as they are unpacked
    (default) rather than each group's partial sum (`expert_kernels`)."""
    activation_codes: bool | None = None
    """w8a8 / w4a8: round each GEMM's activations once, ahead of it (`ActivationCodes`: written by the launch that
    produces them, in the fused decoder's norms and gated GEMMs, else by an `activation_codes` launch), instead of
    in every program's K loop (default off: 30 more launches a step, o_proj's inputs, which a GPU has yet to time
    against the issue it saves)."""
    num_warps: int | None = None
    num_stages: int | None = None


_SETTINGS: contextvars.ContextVar[LaunchSettings | None] = contextvars.ContextVar(
    "dgemma_expert_launch", default=None
)


@contextlib.contextmanager
def launch_settings(**overrides):
    """Run the expert GEMMs in this context with some `LaunchSettings` fixed (A/B timing, sweeps, tests)."""
    token = _SETTINGS.set(dataclasses.replace(_SETTINGS.get() or LaunchSettings(), **overrides))
    try:
        yield
    finally:
        _SETTINGS.reset(token)


def launch_settings_for(n: int, block_m: int, crowded: bool = False, wide: bool = False) -> LaunchSettings:
    """The settings a launch uses: the context's overrides over the heuristic.

    Heuristic: tokens on the MMA's N side and 64 weight rows per program (one Hopper warpgroup's
    MMA M), and 4 warps: the weight tile is the MMA's first operand, unpacked in the registers of the
    warps that hold its rows (on sm_90 one warpgroup, 16 rows a warp; on sm_89 / sm_120 Triton lays 4
    warps 2 x 2 over a 64 x 32 tile, and 2 warps would issue only 16% fewer instructions a weight). An
    8-warp program adds warp columns over the tokens that unpack the tile again: 1.1-2.3x the K loop's
    instructions a weight (bench/device/compile_kernels.py, which reads the loop from the cubin). 8 warps
    only for `crowded` launches (affine int4's mins, 8-bit weights under 16-bit activations, gated launches
    reading activation codes) at 64-row blocks, where 4 warps spill on sm_89/90/120 (the last on sm_89). The interpreter's cost grows with tile size: tiny tiles
    there.

    `wide` launches (`expert_gemm_launch`: the experts' symmetric int4 under bf16 activations on sm_90) take 128
    weight rows a program, two warpgroup MMAs a K step: the loop's fixed part (barriers, wgmma fences, addresses,
    async copies) then covers twice the weights, 0.130 -> 0.101 (gate_up) and 0.167 -> 0.121 (down) warp
    instructions a weight at 256 tokens, with no spill (157 / 105 registers). The experts' launches there are
    issue-bound at 64 (H200 issue/read 1.16 / 1.44); the RTX cards' are not (0.17 / 0.20) and keep 64.
    """
    chosen = _SETTINGS.get() or LaunchSettings()
    block_n = (32 if n >= 32 else _MIN_DOT) if interpreting() else 128 if wide else 64
    return LaunchSettings(
        block_n=chosen.block_n or block_n,
        swap=True if chosen.swap is None else chosen.swap,
        asm=(not interpreting()) if chosen.asm is None else chosen.asm,
        scale_weights=True if chosen.scale_weights is None else chosen.scale_weights,
        activation_codes=bool(chosen.activation_codes),
        num_warps=chosen.num_warps or (8 if crowded and block_m >= 64 else 4),
        num_stages=chosen.num_stages,
    )


HOPPER_SMS = 132
"""Streaming multiprocessors of an H100 SXM or H200, the sm_90 cards a launch is sized for."""


def block_k_for(group: int) -> int | None:
    """The 8-bit K step: largest power of two <= 64 dividing the scale group (one weight scale per step), or None.

    Also w8a8's activation group (one activation scale per row per step). 128 spills at 64-row blocks
    on sm_89 / sm_120 (bench/device/compile_kernels.py).
    """
    block = 64
    while block >= _MIN_DOT:
        if group % block == 0:
            return block
        block //= 2
    return None


def fused_supported(device: torch.device, mode: str, *groups: int, in_features: tuple[int, ...] = ()) -> bool:
    """Whether the Triton kernels can run these weights on `device`.

    CUDA: always for int8/int4; fp8 needs sm_89+ (the e4m3 conversion Triton
    emits). CPU: only under the interpreter (tests and `bench moe`). Groups
    must allow a K step of at least 16; int4 needs K (`in_features`) in whole
    64-input tile blocks (every tensor of the real model has it).
    """
    if mode not in moe_kernels.MODE_CODES or any(block_k_for(g) is None for g in groups):
        return False
    if mode == "int4" and any(k % expert_kernels.INT4_BLOCK_K for k in in_features):
        return False
    if device.type == "cuda":
        if interpreting():
            return False
        return mode != "fp8" or _capability(device.index) >= (8, 9)
    return interpreting()


def w8a8_supported(device: torch.device, mode: str) -> bool:
    """Whether `mode`'s weights can meet quantized activations in the MMA: int8 everywhere (sm80+), fp8 on sm_89+."""
    if mode == "int8":
        return True
    if mode == "fp8":
        return device.type != "cuda" or _capability(device.index) >= (8, 9)
    return False


@functools.cache
def _capability(index: int | None) -> tuple[int, int]:
    # Asked on every forward (also while a CUDA graph is captured): ask the driver once.
    return torch.cuda.get_device_capability(index)


@dataclasses.dataclass(frozen=True)
class Routing:
    """Pairs (token, slot) grouped by expert in rows padded to BLOCK_M per expert; all on the device."""

    sorted_pairs: torch.Tensor  # [max_rows] int32; num_pairs marks padding
    block_experts: torch.Tensor  # [max_blocks] int32; num_experts past the rows in use
    rows_used: torch.Tensor  # [1] int32
    block_m: int
    num_pairs: int


def _next_power_of_2(value: int) -> int:
    return 1 << max(0, value - 1).bit_length()


def block_m_for(num_pairs: int, num_experts: int) -> int:
    """Rows per block: the power of two at or above 1.5x the pairs an expert gets on average (16 to 64).

    Every row block of an expert reads (and unpacks) all of that expert's weights, so an expert
    whose pairs spill into a second block costs twice its bytes: at a 256-token canvas (top-8 of
    128: 16 pairs an expert on average, ~45% of experts above 16) blocks of 16 would read ~1.45x
    the weights, blocks of 32 ~1.0x; the MMA work on padding rows is cheap next to the bytes.
    Capped at 64: 128-row blocks of the gated int4 launch spill on sm_90 (bench/device/compile_kernels.py),
    so 4 candidates (64 pairs an expert) still read about half the experts twice.
    """
    chosen = _block_m_override()
    if chosen:
        return chosen
    wanted = 1.5 * num_pairs / num_experts
    return min(64, max(_MIN_DOT, _next_power_of_2(int(wanted + 0.999))))


@torch.compiler.assume_constant_result
def _block_m_override() -> int | None:
    """`launch_settings(block_m=...)`, read outside torch.compile's trace (Dynamo cannot trace
    ContextVar.get): a constant of the compiled graph, so a sweep runs eagerly."""
    return (_SETTINGS.get() or LaunchSettings()).block_m


def align_routing(top_k_index: torch.Tensor, num_experts: int, block_m: int) -> Routing:
    """Build the expert-grouped, block-padded rows for `top_k_index` `[T, top_k]` without leaving the device."""
    num_pairs = top_k_index.numel()
    flat = top_k_index.view(-1)  # [P]
    sorted_pairs, block_experts, rows_used = torch.ops.dgemma.align_routing(flat, num_experts, block_m)
    return Routing(sorted_pairs, block_experts, rows_used, block_m, num_pairs)


def _routing_sizes(num_pairs: int, num_experts: int, block_m: int) -> tuple[int, int]:
    """(max_rows, max_blocks): every used expert wastes at most block_m - 1 rows of padding."""
    max_rows = -(-(num_pairs + min(num_experts, num_pairs) * (block_m - 1)) // block_m) * block_m
    return max_rows, max_rows // block_m


@torch.library.custom_op("dgemma::align_routing", mutates_args=())
def _align_routing_op(
    flat: torch.Tensor, num_experts: int, block_m: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One launch of `align_routing_kernel`: (sorted_pairs [max_rows], block_experts [max_blocks], rows_used [1])."""
    num_pairs = flat.numel()
    max_rows, max_blocks = _routing_sizes(num_pairs, num_experts, block_m)
    device = flat.device
    e_p2 = _next_power_of_2(num_experts + 1)
    sorted_pairs = torch.empty(max_rows, dtype=torch.int32, device=device)
    block_experts = torch.empty(max_blocks, dtype=torch.int32, device=device)
    rows_used = torch.empty(1, dtype=torch.int32, device=device)
    scratch = torch.empty(3 * e_p2, dtype=torch.int32, device=device)
    _launch(
        moe_kernels.align_routing_kernel, (1,),
        flat, sorted_pairs, block_experts, rows_used, scratch,
        num_pairs, num_experts, max_rows, max_blocks,
        BLOCK_M=block_m, P_P2=_next_power_of_2(num_pairs), E_P2=e_p2,
        ROWS_P2=_next_power_of_2(max_rows), BLOCKS_P2=_next_power_of_2(max_blocks),
        num_warps=8 if not interpreting() else 4,
    )  # fmt: skip
    return sorted_pairs, block_experts, rows_used


@_align_routing_op.register_fake
def _(flat, num_experts, block_m):
    max_rows, max_blocks = _routing_sizes(flat.numel(), num_experts, block_m)
    return (flat.new_empty(max_rows, dtype=torch.int32), flat.new_empty(max_blocks, dtype=torch.int32),
            flat.new_empty(1, dtype=torch.int32))  # fmt: skip


def fused_experts(
    hidden_states: torch.Tensor | ActivationCodes,
    top_k_index: torch.Tensor,
    top_k_weights: torch.Tensor,
    *,
    gate_up_data: torch.Tensor,
    gate_up_scales: torch.Tensor,
    down_data: torch.Tensor,
    down_scales: torch.Tensor,
    mode: str,
    gate_up_mins: torch.Tensor | None = None,
    down_mins: torch.Tensor | None = None,
    activations: str = "none",
    down_mode: str | None = None,
    down_activations: str | None = None,
    gate_up_super: tuple[torch.Tensor, torch.Tensor | None] | None = None,
    down_super: tuple[torch.Tensor, torch.Tensor | None] | None = None,
    into: torch.Tensor | None = None,
) -> torch.Tensor:
    """The DiffusionGemma experts forward on packed weights (`quant_formats` layouts): `[T, H]` -> `[T, H]`.

    gate_up `[E, 2I, H / v]` with scales `[E, H/g, 2I]`; down `[E, H, I / v]` with scales `[E, I/g', H]`
    (v = values per stored element). Per pair: gelu_tanh(x @ gate.T) * (x @ up.T) @ down.T * routing
    weight, summed over the token's top_k pairs. `mins` (int4 only) select the affine form;
    `activations` "int8" / "fp8" quantize them per row in the kernels (w8a8, the weights' own kind; "int8" also
    with symmetric int4 weights in groups of 64 or more: w4a8, opt-in, `expert_kernels`).
    `down_mode` / `down_activations` (default: `mode`, `activations`) where down is stored in another mode
    than gate_up (an imported GGUF: Q4_K gate_up as affine int4, Q5_0 / Q8_0 / Q6_K down as int8).
    `*_super`: (super scales, super mins or None) of two-level scales (`quant_formats`; GGUF Q4_K).
    `into`: an fp32 `[T, H]` buffer the top-k sums are added to, and returned, with neither the zero fill nor
    the cast to the activations' dtype (the fused decoder's: one buffer a step, which `fused_layer.post_ffn`
    reads, rounds as the cast would and leaves zeroed for the next layer: two kernels less a layer).
    `hidden_states` may be `ActivationCodes` in gate_up's `codes_layout` (the fused decoder's post_attention
    writes them): the gate_up reads them, no `activation_codes` launch.
    """
    dtype = hidden_states.dtype
    rows = hidden_states.codes if isinstance(hidden_states, ActivationCodes) else hidden_states
    assert rows.dim() == 2 and top_k_index.shape == top_k_weights.shape, "expects [T, H] and [T, top_k]"
    assert top_k_index.is_contiguous() and top_k_weights.is_contiguous(), (
        "routing tensors index as [T * top_k]"
    )
    tokens, hidden = rows.shape
    top_k = top_k_index.shape[1]
    num_experts, two_inter, _ = gate_up_data.shape
    inter = two_inter // 2
    routing = align_routing(top_k_index, num_experts, block_m_for(tokens * top_k, num_experts))
    pairs = routing.num_pairs
    down_mode = down_mode or mode
    down_activations = activations if down_activations is None else down_activations
    gate_up_kind, down_kind = weight_kind(mode, gate_up_mins), weight_kind(down_mode, down_mins)
    codes, code_scales = activation_codes_for(hidden_states, gate_up_kind, activations, gate_up_scales)
    gate_up_args = (codes, gate_up_data, gate_up_scales, gate_up_mins, routing.sorted_pairs, routing.block_experts,
                    routing.rows_used)  # fmt: skip
    gate_up_kwargs = dict(num_rows=pairs, out_rows=pairs, n=inter, a_row_div=top_k, block_m=routing.block_m,
                          weights=gate_up_kind, activations=activations,
                          ss=None if gate_up_super is None else gate_up_super[0],
                          sm=None if gate_up_super is None else gate_up_super[1], a_scales=code_scales)  # fmt: skip
    if down_activations != "none" and _activation_codes_on():  # the gate_up stores the down's codes itself
        codes, code_scales = torch.ops.dgemma.expert_gemm_codes(
            *gate_up_args, **gate_up_kwargs, codes=down_activations, out_dtype=dtype,
            codes_block=activation_block_k(down_kind, inter // down_scales.shape[-2]),
        )  # fmt: skip
    else:
        gate_up = torch.ops.dgemma.expert_gemm(
            *gate_up_args, None, **gate_up_kwargs, out_row_div=1, gated=True, out_dtype=dtype,
        )  # fmt: skip  # [P, I]: gelu_tanh(x @ gate.T) * (x @ up.T)
        codes, code_scales = gate_up, None
    down = dict(num_rows=pairs, n=hidden, a_row_div=1, out_row_div=top_k, block_m=routing.block_m,
                weights=down_kind, activations=down_activations,
                ss=None if down_super is None else down_super[0], sm=None if down_super is None else down_super[1],
                a_scales=code_scales)  # fmt: skip
    sums = rows.new_zeros((tokens, hidden), dtype=torch.float32) if into is None else into
    torch.ops.dgemma.expert_gemm_add(codes, down_data, down_scales, down_mins, routing.sorted_pairs,
                                     routing.block_experts, routing.rows_used, top_k_weights, sums,
                                     **down)  # fmt: skip  # [T, H] fp32: weighted top-k sums
    return into if into is not None else sums.to(dtype)


def fused_linear(
    x: torch.Tensor | ActivationCodes,
    data: torch.Tensor,
    scales: torch.Tensor,
    mode: str,
    *,
    mins: torch.Tensor | None = None,
    activations: str = "none",
    super_scales: torch.Tensor | None = None,
    super_mins: torch.Tensor | None = None,
    gated: bool = False,
    codes_out: CodesLayout | None = None,
) -> torch.Tensor | ActivationCodes:
    """`x @ dequantize(data, scales, mins, super_scales, super_mins).T` for a packed `[N, K / v]` weight, without a
    dequantized copy. `gated`: the weight is a gate `[N / 2, K]` over an up `[N / 2, K]` (the dense MLP's, stacked:
    `StackedLinears`), and the result `[..., N / 2]` is gelu_tanh(x @ gate.T) * (x @ up.T), in the experts'
    epilogue (fp32, one rounding). `x` may be `ActivationCodes` in this launch's `codes_layout` (read in place of
    rounding x); `codes_out` (gated only): return the result as `ActivationCodes` in the next launch's layout,
    rounded in the epilogue as `activation_codes` would round the output (`expert_gemm_codes`)."""
    dtype = x.dtype
    coded = isinstance(x, ActivationCodes)  # codes are `[M, K]` already
    rows = x if coded else x.reshape(-1, x.shape[-1])  # [M, K]
    lead = x.codes.shape[:-1] if coded else x.shape[:-1]
    num_rows = (x.codes if coded else rows).shape[0]
    out_features = data.shape[0] // 2 if gated else data.shape[0]
    weights = weight_kind(mode, mins)
    codes, code_scales = activation_codes_for(rows, weights, activations, scales)
    hopper = x.device.type == "cuda" and _capability(x.device.index) == (9, 0)
    most = hopper_dense_rows(weights, activations, code_scales is not None, dtype, super_scales is not None) if hopper else 0
    block_m = dense_block_m(num_rows, out_features, gated=gated, affine=mins is not None, hopper_rows=most)
    launch = dict(num_rows=num_rows, out_rows=num_rows, n=out_features, a_row_div=1, block_m=block_m,
                  weights=weights, activations=activations, ss=None if super_scales is None else super_scales.unsqueeze(0),
                  sm=None if super_mins is None else super_mins.unsqueeze(0), a_scales=code_scales)  # fmt: skip
    parts = (codes, data.unsqueeze(0), scales.unsqueeze(0), None if mins is None else mins.unsqueeze(0), None, None,
             None)  # fmt: skip
    if codes_out is not None:
        assert gated, "codes out: a gated launch's (the dense MLP's gate and up, for its down)"
        out_codes, out_scales = torch.ops.dgemma.expert_gemm_codes(*parts, **launch, codes=codes_out.kind,
                                                                   codes_block=codes_out.block_k, out_dtype=dtype)  # fmt: skip
        return ActivationCodes(out_codes, out_scales, dtype)
    output = torch.ops.dgemma.expert_gemm(*parts, None, **launch, out_row_div=1, gated=gated, out_dtype=dtype)
    return output.view(*lead, out_features)


def activation_block_k(weights: str, group: int) -> int:
    """Inputs per activation scale of a w8a8 / w4a8 launch: its K step (64 for int4 weights; `block_k_for`)."""
    return expert_kernels.INT4_BLOCK_K if weights in ("int4", "int4-affine") else block_k_for(group)


def codes_layout(weights: str, activations: str, group: int) -> CodesLayout | None:
    """The `ActivationCodes` a launch of `weights` in scale groups of `group` with `activations` reads, when
    `launch_settings(activation_codes=True)` has them rounded ahead of it; None when it rounds its own (or none)."""
    if activations == "none" or not _activation_codes_on():
        return None
    return CodesLayout(activations, activation_block_k(weights, group))


def activation_codes_for(
    x: torch.Tensor | ActivationCodes, weights: str, activations: str, scales: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """What a launch on `x` reads as its activations: (x, None), or with `launch_settings(activation_codes=True)`
    and 8-bit activations the codes and scales of `activation_codes` (`scales`: the weights', for their group);
    `ActivationCodes` a producer wrote as they are."""
    if isinstance(x, ActivationCodes):
        layout = codes_layout(weights, activations, x.codes.shape[-1] // scales.shape[-2])
        assert x.layout == layout, f"codes in {x.layout} for a launch that reads {layout}"
        return x.codes, x.scales
    layout = codes_layout(weights, activations, x.shape[-1] // scales.shape[-2])
    if layout is None:
        return x, None
    return torch.ops.dgemma.activation_codes(x, layout.kind, layout.block_k)


@torch.compiler.assume_constant_result
def _activation_codes_on() -> bool:
    """`launch_settings(activation_codes=...)`, read outside torch.compile's trace (as `_block_m_override`)."""
    return bool((_SETTINGS.get() or LaunchSettings()).activation_codes)


@torch.library.custom_op("dgemma::activation_codes", mutates_args=())
def _activation_codes_op(a: torch.Tensor, activations: str, block_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`[R, K]` activations -> (codes `[R, K]`: int8, or e4m3 bytes as uint8; fp32 scales `[R, K / block_k]`), as
    `quant_formats.quantize_activations(a, block_k, activations)` rounds them: one launch."""
    codes, scales = _codes_output(a, activations, block_k)
    rows, k = a.shape
    assert k % block_k == 0, f"K={k} is not whole steps of {block_k}"
    block_r = 16 if interpreting() else 32
    _launch(expert_kernels.activation_codes_kernel, (-(-rows // block_r), k // block_k), a, codes, scales, rows,
            a.stride(0), a.stride(1), codes.stride(0), scales.stride(0), ACTIVATIONS=expert_kernels.ACTIVATION_CODES[activations],
            FP32_MATH=interpreting(), BLOCK_R=block_r, BLOCK_K=block_k, num_warps=4)  # fmt: skip
    return codes, scales


@_activation_codes_op.register_fake
def _(a, activations, block_k):
    return _codes_output(a, activations, block_k)


def _codes_output(a: torch.Tensor, activations: str, block_k: int,
                  shape: tuple[int, int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """Empty (codes, scales) for `shape` (default a's) rows x inputs, on a's device."""
    rows, k = shape or a.shape
    code_dtype = torch.uint8 if activations == "fp8" else torch.int8
    return a.new_empty((rows, k), dtype=code_dtype), a.new_empty((rows, k // block_k), dtype=torch.float32)


def hopper_dense_rows(weights: str, activations: str, coded: bool, dtype: torch.dtype, two_level: bool) -> int:
    """The most rows a dense launch's block takes on sm_90 (`dense_block_m`), where one wgmma takes up to 256 token
    columns in one instruction, so a longer block unpacks each weight fewer times for about as long a K loop:
    256 for symmetric int4 under bf16 activations (its weights scaled as unpacked; q/k/v at 256 tokens 190 -> 180
    instructions an iteration, 4 -> 2 unpacks), 128 for 8-bit activations read as codes (`ActivationCodes`; fp8
    q/k/v at 256 tokens 0.189 x 4 -> 0.236 x 2 instructions a weight; 256 rows spill, the fp32 accumulator beside
    each K step's), 0 (no longer blocks) for the rest: activations rounded in the K loop cost per row, and the
    other int4 forms spill. bench/device/compile_kernels.py reads all of it from the cubin."""
    if weights == "int4" and activations == "none" and dtype == torch.bfloat16 and not two_level:
        return 256
    return 128 if coded else 0


def dense_block_m(rows: int, n: int, *, gated: bool = False, affine: bool = False, hopper_rows: int = 0) -> int:
    """Rows per program of a dense (unrouted) launch of `n` output columns. Each program unpacks its weight tile
    once for its rows, so at a 256-token canvas 64-row blocks unpack every weight 4 times, 32-row ones 8.

    64, or 32 for a gated launch of affine int4 (64 spills on sm_90 / sm_120 with Q4_K's two-level scales).
    `hopper_rows` (sm_90: `hopper_dense_rows`): up to that many rows (128 for a gated launch, whose two
    accumulators spill at 256) where the launch still has a program for each of an H100's or H200's 132 SMs, else
    the next size down where that holds. Not on sm_89 / sm_120, whose mma.sync count doubles with the rows
    (0.168 x 4 -> 0.392 x 2 instructions a weight), nor where the grid would leave SMs idle (the gated MLP and
    o_proj at 256 tokens)."""
    if rows <= 16:
        return 16
    if (gated and affine) or interpreting():
        return 32
    for block in (256, 128):
        if block > hopper_rows or (gated and block > 128):  # a gated 256-row block spills: two accumulators
            continue
        if rows >= block and -(-rows // block) * -(-n // launch_settings_for(n, block).block_n) >= HOPPER_SMS:
            return block
    return 64


def weight_kind(mode: str, mins: torch.Tensor | None) -> str:
    """The kernels' name for a packed projection's weights: its mode, or "int4-affine" where it has mins."""
    return "int4-affine" if mins is not None else mode


# A torch custom op per kernel launch: the launch is one operator to torch's dispatcher, so
# FakeTensorMode (the virtual-GPU dry run, bench/dryrun.py), torch.compile and operator
# counters see it, with its output's shape from the fake implementation below; the real
# implementation is the Triton launch, on CUDA or in the interpreter on CPU.


@torch.library.custom_op("dgemma::expert_gemm", mutates_args=())
def _expert_gemm_op(
    a: torch.Tensor,
    w: torch.Tensor,
    s: torch.Tensor,
    m: torch.Tensor | None,
    sorted_pairs: torch.Tensor | None,
    block_experts: torch.Tensor | None,
    rows_used: torch.Tensor | None,
    route_weights: torch.Tensor | None,
    num_rows: int,
    out_rows: int,
    n: int,
    a_row_div: int,
    out_row_div: int,
    block_m: int,
    weights: str,
    activations: str,
    gated: bool,
    ss: torch.Tensor | None = None,
    sm: torch.Tensor | None = None,
    a_scales: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """One launch of `expert_gemm_kernel`; routed when `sorted_pairs` is given, routing-weighted (fp32
    atomic top-k sums into `out_rows` rows) when `route_weights` is; two-level scales with `ss` (and `sm`,
    affine); `a` holds `activation_codes`' codes when `a_scales` is given. Returns out `[out_rows, n]`, in
    `out_dtype` (default a's)."""
    out = _gemm_output(a, out_rows, n, route_weights is not None, dtype=out_dtype)
    _run_expert_gemm(
        a, w, s, m, sorted_pairs, block_experts, rows_used, route_weights, out, num_rows=num_rows, n=n,
        a_row_div=a_row_div, out_row_div=out_row_div, block_m=block_m, weights=weights, activations=activations,
        gated=gated, super_scales=ss, super_mins=sm, a_scales=a_scales,
    )  # fmt: skip
    return out


_OUT_ROUNDING = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
"""`OUT_ROUND`: the dtype a launch's output would have been stored in, before its codes are taken."""


@torch.library.custom_op("dgemma::expert_gemm_codes", mutates_args=())
def _expert_gemm_codes_op(
    a: torch.Tensor,
    w: torch.Tensor,
    s: torch.Tensor,
    m: torch.Tensor | None,
    sorted_pairs: torch.Tensor | None,
    block_experts: torch.Tensor | None,
    rows_used: torch.Tensor | None,
    num_rows: int,
    out_rows: int,
    n: int,
    a_row_div: int,
    block_m: int,
    weights: str,
    activations: str,
    codes: str,
    codes_block: int,
    out_dtype: torch.dtype,
    ss: torch.Tensor | None = None,
    sm: torch.Tensor | None = None,
    a_scales: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A gated launch (the experts' gate_up, routed; the dense MLP's gate and up, unrouted: no `sorted_pairs`)
    storing its output as the down's activation codes: (codes
    `[out_rows, n]`, int8 or e4m3 bytes; fp32 scales `[out_rows, n / codes_block]`), what `activation_codes` makes of
    the `out_dtype` output `expert_gemm` would have returned, without that output or that launch."""
    out, out_scales = _codes_output(a, codes, codes_block, (out_rows, n))
    _run_expert_gemm(
        a, w, s, m, sorted_pairs, block_experts, rows_used, None, out, num_rows=num_rows, n=n, a_row_div=a_row_div,
        out_row_div=1, block_m=block_m, weights=weights, activations=activations, gated=True, super_scales=ss,
        super_mins=sm, a_scales=a_scales, out_scales=out_scales, out_dtype=out_dtype,
    )  # fmt: skip
    return out, out_scales


@_expert_gemm_codes_op.register_fake
def _(a, w, s, m, sorted_pairs, block_experts, rows_used, num_rows, out_rows, n, a_row_div, block_m, weights,
      activations, codes, codes_block, out_dtype, ss=None, sm=None, a_scales=None):  # fmt: skip
    return _codes_output(a, codes, codes_block, (out_rows, n))


def _run_expert_gemm(*args, **kwargs) -> None:
    """Launch `expert_gemm_kernel` as `expert_gemm_launch` lays the launch out (both ops' body)."""
    grid, launch_args, launch_kwargs = expert_gemm_launch(*args, **kwargs)
    _launch(expert_kernels.expert_gemm_kernel, grid, *launch_args, **launch_kwargs)


def expert_gemm_launch(a, w, s, m, sorted_pairs, block_experts, rows_used, route_weights, out, *, num_rows: int,
                       n: int, a_row_div: int, out_row_div: int, block_m: int, weights: str, activations: str,
                       gated: bool, super_scales=None, super_mins=None, a_scales=None, out_scales=None,
                       out_dtype: torch.dtype | None = None, hopper: bool | None = None) -> tuple[tuple[int], tuple, dict]:  # fmt: skip
    """(grid, arguments, keyword arguments) of one `expert_gemm_kernel` launch; reads only shapes and strides,
    so `bench/device/compile_kernels.py` builds the same launch from meta tensors to compile it ahead of time
    (`hopper`: whether it is for sm_90; default: whether `a` is on such a card)."""
    routed = sorted_pairs is not None
    route_weighted = route_weights is not None
    int4 = weights in ("int4", "int4-affine")
    w4a8 = weights == "int4" and activations == "int8"  # symmetric int4 codes are exact in int8
    assert activations in ACTIVATION_KINDS and (activations in ("none", weights) or w4a8), (
        f"{weights} weights cannot take {activations} activations"
    )
    assert (m is not None) == (weights == "int4-affine"), "mins go with affine int4 and only with it"
    assert m is None or m.stride() == s.stride(), "mins must be laid out as the scales"
    ss, sm = super_scales, super_mins
    assert (sm is not None) == (ss is not None and m is not None), "affine two-level scales have super mins, only they"
    assert ss is None or ss.stride(-1) == s.stride(-1), "super scales must have the scales' column stride"
    assert sm is None or sm.stride() == ss.stride(), "super mins must be laid out as the super scales"
    k = a.shape[1]
    group = k // s.shape[-2]
    super_group = 0 if ss is None else k // ss.shape[-2]
    assert super_group % group == 0, f"super groups of {super_group} inputs are not whole groups of {group}"
    if int4:
        block_k = expert_kernels.INT4_BLOCK_K
        assert k % block_k == 0 and group % _MIN_DOT == 0, f"int4 K={k} group {group}: needs K % 64, group % 16"
        assert super_group % block_k == 0, f"int4 super groups of {super_group} inputs are not whole K-blocks of 64"
        assert not w4a8 or group % block_k == 0, f"w4a8 takes a scale per K-block of 64: group {group} is finer"
    else:
        block_k = block_k_for(group)
        assert block_k is not None, f"K={k} with group {group} has no K step >= {_MIN_DOT}"
    coded = a_scales is not None
    assert not coded or (activations != "none" and a.dtype in (torch.int8, torch.uint8) and a_scales.dtype == torch.float32
                         and a_scales.shape == (a.shape[0], k // block_k)), (
        "activation codes: int8 / uint8 codes with fp32 scales, one a row per K step"
    )  # fmt: skip
    # The output as the next GEMM's codes: one scale a row per BLOCK_N columns, BLOCK_N that GEMM's K step.
    codes_out = out_scales is not None
    assert not codes_out or (gated and not route_weighted and out.dtype in (torch.int8, torch.uint8)
                             and out_scales.dtype == torch.float32 and out_scales.shape[0] == out.shape[0]
                             and n % out_scales.shape[1] == 0 and out_dtype in _OUT_ROUNDING), (
        "codes out: a gated launch's int8 / uint8 codes, fp32 scales per row per K step of the next GEMM"
    )  # fmt: skip
    crowded = weights == "int4-affine" or (activations == "none" and weights in ("int8", "fp8")) or (coded and gated)
    # The weights scaled as they are unpacked where one scale covers a K-block (expert_kernels' docstring).
    scaled = weights == "int4" and activations == "none" and ss is None and group % block_k == 0 \
        and s.dtype == torch.bfloat16
    settings = launch_settings_for(n, block_m, crowded)
    scale_weights = bool(settings.scale_weights) and scaled
    if hopper is None:
        hopper = a.device.type == "cuda" and _capability(a.device.index) == (9, 0)
    if scale_weights and hopper and routed and block_m <= 64:  # the experts' int4 on sm_90: 128 weight rows
        settings = launch_settings_for(n, block_m, crowded, wide=True)
    if codes_out:
        settings = dataclasses.replace(settings, block_n=n // out_scales.shape[1])
    assert settings.asm is False or not interpreting(), "the interpreter cannot run inline PTX"
    row_blocks = block_experts.numel() if routed else -(-num_rows // block_m)
    dummy = out  # pointer arguments a launch never reads
    extra = {} if settings.num_stages is None else {"num_stages": settings.num_stages}
    args = (
        a, w, s, m if m is not None else dummy, ss if ss is not None else dummy, sm if sm is not None else dummy, out,
        sorted_pairs if routed else dummy,
        block_experts if routed else dummy,
        rows_used if routed else dummy,
        route_weights if route_weighted else dummy,
        a_scales if coded else dummy,
        out_scales if codes_out else dummy,
        num_rows, n, k, a_row_div, out_row_div,
        a.stride(0), a.stride(1), w.stride(0), w.stride(1), w.stride(2),
        s.stride(0), s.stride(1), s.stride(2),
        ss.stride(0) if ss is not None else 0, ss.stride(1) if ss is not None else 0,
        out.stride(0), out.stride(1), a_scales.stride(0) if coded else 0, out_scales.stride(0) if codes_out else 0,
    )  # fmt: skip
    kwargs = dict(
        GROUP=group, SUPER=super_group, WEIGHTS=expert_kernels.WEIGHT_CODES[weights],
        ACTIVATIONS=expert_kernels.ACTIVATION_CODES[activations],
        ROUTED=routed, GATED=gated, ROUTE_WEIGHTED=route_weighted,
        SWAP=settings.swap, ASM=bool(settings.asm and int4), SCALE_WEIGHTS=scale_weights,
        ROUND_BF16=scale_weights and a.dtype == torch.bfloat16, CODED=coded,
        CODES_OUT=expert_kernels.ACTIVATION_CODES["fp8" if out.dtype == torch.uint8 else "int8"] if codes_out else 0,
        OUT_ROUND=_OUT_ROUNDING[out_dtype] if codes_out else 0, FP32_MATH=interpreting(),
        DOT_PRECISION="ieee" if a.dtype == torch.float32 or interpreting() else "tf32",
        BLOCK_M=block_m, BLOCK_N=settings.block_n, BLOCK_K=block_k,
        num_warps=settings.num_warps, **extra,
    )  # fmt: skip
    return (row_blocks * -(-n // settings.block_n),), args, kwargs


@_expert_gemm_op.register_fake
def _(a, w, s, m, sorted_pairs, block_experts, rows_used, route_weights, num_rows, out_rows, n, a_row_div,
      out_row_div, block_m, weights, activations, gated, ss=None, sm=None, a_scales=None, out_dtype=None):  # fmt: skip
    return _gemm_output(a, out_rows, n, route_weights is not None, fake=True, dtype=out_dtype)


@torch.library.custom_op("dgemma::expert_gemm_add", mutates_args=("out",))
def _expert_gemm_add_op(
    a: torch.Tensor,
    w: torch.Tensor,
    s: torch.Tensor,
    m: torch.Tensor | None,
    sorted_pairs: torch.Tensor,
    block_experts: torch.Tensor,
    rows_used: torch.Tensor,
    route_weights: torch.Tensor,
    out: torch.Tensor,
    num_rows: int,
    n: int,
    a_row_div: int,
    out_row_div: int,
    block_m: int,
    weights: str,
    activations: str,
    ss: torch.Tensor | None = None,
    sm: torch.Tensor | None = None,
    a_scales: torch.Tensor | None = None,
) -> None:
    """The routing-weighted launch of `expert_gemm_kernel` adding its fp32 top-k sums into the caller's `out`
    `[out rows, n]` (zeros, or sums to add to): no zero fill of its own (`fused_experts`' `into`)."""
    assert out.dtype == torch.float32 and out.is_contiguous(), "fp32 atomic sums into a contiguous buffer"
    _run_expert_gemm(
        a, w, s, m, sorted_pairs, block_experts, rows_used, route_weights, out, num_rows=num_rows, n=n,
        a_row_div=a_row_div, out_row_div=out_row_div, block_m=block_m, weights=weights, activations=activations,
        gated=False, super_scales=ss, super_mins=sm, a_scales=a_scales,
    )  # fmt: skip


@_expert_gemm_add_op.register_fake
def _(a, w, s, m, sorted_pairs, block_experts, rows_used, route_weights, out, num_rows, n, a_row_div, out_row_div,
      block_m, weights, activations, ss=None, sm=None, a_scales=None):  # fmt: skip
    return None


# -- the first-generation kernel (moe_kernels.dequant_gemm_kernel), kept for A/B timing -----------


def fused_experts_legacy(
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
    """`fused_experts` through the first-generation kernel, on weights in `quant_formats.legacy_layout`."""
    tokens, hidden = hidden_states.shape
    top_k = top_k_index.shape[1]
    num_experts, two_inter, _ = gate_up_data.shape
    routing = align_routing(top_k_index, num_experts, block_m_for(tokens * top_k, num_experts))
    pairs = routing.num_pairs
    intermediate = torch.ops.dgemma.dequant_gemm(
        hidden_states, gate_up_data, gate_up_scales, routing.sorted_pairs, routing.block_experts,
        routing.rows_used, None, num_rows=pairs, out_rows=pairs, n=two_inter // 2, a_row_div=top_k,
        out_row_div=1, block_m=routing.block_m, mode=mode, gated=True,
    )  # fmt: skip
    output = torch.ops.dgemma.dequant_gemm(
        intermediate, down_data, down_scales, routing.sorted_pairs, routing.block_experts,
        routing.rows_used, top_k_weights, num_rows=pairs, out_rows=tokens, n=hidden, a_row_div=1,
        out_row_div=top_k, block_m=routing.block_m, mode=mode, gated=False,
    )  # fmt: skip
    return output.to(hidden_states.dtype)


def _legacy_block_k(group: int) -> int | None:
    """The first-generation K step: largest power of two <= 64 dividing the group."""
    block = 64
    while block >= _MIN_DOT:
        if group % block == 0:
            return block
        block //= 2
    return None


def _legacy_block_n(n: int) -> int:
    if interpreting():
        return 32 if n >= 32 else _MIN_DOT
    return 128 if n >= 2048 else 64


@torch.library.custom_op("dgemma::dequant_gemm", mutates_args=())
def _dequant_gemm_op(
    a: torch.Tensor,
    w: torch.Tensor,
    s: torch.Tensor,
    sorted_pairs: torch.Tensor | None,
    block_experts: torch.Tensor | None,
    rows_used: torch.Tensor | None,
    route_weights: torch.Tensor | None,
    num_rows: int,
    out_rows: int,
    n: int,
    a_row_div: int,
    out_row_div: int,
    block_m: int,
    mode: str,
    gated: bool,
) -> torch.Tensor:
    """One launch of the first-generation `dequant_gemm_kernel` (legacy layout: scales `[E, N, K / g]`)."""
    routed = sorted_pairs is not None
    route_weighted = route_weights is not None
    k = a.shape[1]
    group = k // s.shape[-1]
    block_k = _legacy_block_k(group)
    assert block_k is not None and k % block_k == 0, f"K={k} with group {group} has no K step >= {_MIN_DOT}"
    out = _gemm_output(a, out_rows, n, route_weighted)
    block_n = _legacy_block_n(n)
    row_blocks = block_experts.numel() if routed else -(-num_rows // block_m)
    dummy = out
    _launch(
        moe_kernels.dequant_gemm_kernel, (row_blocks * -(-n // block_n),),
        a, w, s, out,
        sorted_pairs if routed else dummy,
        block_experts if routed else dummy,
        rows_used if routed else dummy,
        route_weights if route_weighted else dummy,
        num_rows, n, k, a_row_div, out_row_div,
        a.stride(0), a.stride(1), w.stride(0), w.stride(1), w.stride(2),
        s.stride(0), s.stride(1), s.stride(2), out.stride(0), out.stride(1),
        GROUP=group, MODE=moe_kernels.MODE_CODES[mode], ROUTED=routed, GATED=gated,
        ROUTE_WEIGHTED=route_weighted,
        DOT_PRECISION="ieee" if a.dtype == torch.float32 or interpreting() else "tf32",
        DOT_FP32=interpreting(),
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
        num_warps=4,
    )  # fmt: skip
    return out


@_dequant_gemm_op.register_fake
def _(a, w, s, sorted_pairs, block_experts, rows_used, route_weights, num_rows, out_rows, n, a_row_div,
      out_row_div, block_m, mode, gated):  # fmt: skip
    return _gemm_output(a, out_rows, n, route_weights is not None, fake=True)


def _gemm_output(a: torch.Tensor, rows: int, n: int, route_weighted: bool, fake: bool = False,
                 dtype: torch.dtype | None = None) -> torch.Tensor:  # fmt: skip
    """The kernel's output: fp32 zeros for the atomic top-k sums, else uninitialised in `dtype` (default a's)."""
    if route_weighted:
        return a.new_empty((rows, n), dtype=torch.float32) if fake else a.new_zeros((rows, n), dtype=torch.float32)
    return a.new_empty((rows, n), dtype=dtype or a.dtype)


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
