"""Rounding as a GPU rounds, in every kernel of the step: fp32 to a dtype, and activations to w8a8 codes.

Owns the `@triton.jit` helpers that `fused_layer` (the norms, which round where transformers stores a tensor and
may write the next GEMM's activation codes) and `expert_kernels` (the GEMMs, which round activations in their K
loop or read codes rounded ahead) share, so that a value rounded in one kernel is the value the other would have
rounded: the same function, bit for bit. Each also gives a GPU's answer in Triton's CPU interpreter (the tests),
whose own conversions differ: it truncates fp32 -> bf16, and loses a carry in fp32 -> e4m3.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def round_to(x, DTYPE: tl.constexpr):
    """fp32 x rounded to nearest-even in DTYPE, as fp32: where transformers stores a tensor of that dtype.

    bf16 by bit arithmetic: Triton's interpreter (the CPU tests) truncates on `.to(tl.bfloat16)`
    where a GPU rounds to nearest even; this gives the GPU's answer in both (NaN aside).
    """
    if DTYPE == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + (((bits >> 16) & 1) + 0x7FFF)) & 0xFFFF0000
        return bits.to(tl.float32, bitcast=True)
    elif DTYPE == tl.float32:
        return x
    else:
        return x.to(DTYPE).to(tl.float32)


@triton.jit
def cast_to(x, DTYPE: tl.constexpr):
    """x stored as DTYPE with round-to-nearest-even (see `round_to`)."""
    return round_to(x, DTYPE).to(DTYPE)


@triton.jit
def round_to_e4m3(x):
    """fp32 rounded to the nearest-even e4m3 value (|x| <= 448), in fp32 arithmetic.

    For the interpreter only: Triton 3.7's interpreted fp32 -> float8e4nv conversion loses the carry
    when rounding up crosses a power of two (-7.96 became -4, not -8). Adding and taking away
    copysign(2^(e + 20), x), e = x's exponent (>= -6, e4m3's subnormal step), rounds x to 3 mantissa
    bits with fp32's own round-to-nearest-even; the result then converts exactly.
    """
    bits = x.to(tl.int32, bitcast=True)
    exponent = tl.maximum(((bits >> 23) & 0xFF) - 127, -6)
    magic = ((exponent + 20 + 127) << 23) | (bits & -2147483648)  # 2^(e+20) with x's sign
    shift = magic.to(tl.float32, bitcast=True)
    return (x + shift) - shift


@triton.jit
def quantized_activations(a, ACTIVATIONS: tl.constexpr, SWAP: tl.constexpr, FP32_MATH: tl.constexpr):
    """Per-row quantization of an activation tile (rows along axis 1 when SWAP): (codes, fp32 scale per row)."""
    values = a.to(tl.float32)
    k_axis: tl.constexpr = 0 if SWAP else 1
    absmax = tl.max(tl.abs(values), axis=k_axis)
    if ACTIVATIONS == 2:
        row_scale = tl.maximum(absmax, 1e-12) / 448.0
    else:
        row_scale = tl.maximum(absmax, 1e-12) / 127.0
    if SWAP:
        scaled = values / row_scale[None, :]
    else:
        scaled = values / row_scale[:, None]
    if ACTIVATIONS == 2:
        if FP32_MATH:
            scaled = round_to_e4m3(scaled)
        codes = scaled.to(tl.float8e4nv)
    else:
        codes = tl.minimum(tl.maximum(tl.floor(scaled + 0.5), -127.0), 127.0).to(tl.int8)
    return codes, row_scale
