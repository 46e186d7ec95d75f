"""Group-wise weight packing for quantized residency: pure tensor functions.

Owns the storage formats of `quantization.py` and nothing else: how a float
weight `[..., N, K]` becomes packed data + per-group scales along its input
dimension K, and how it comes back. Knows nothing of modules, models, files or
devices; every function works on CPU and CUDA alike.

Formats (symmetric, no zero points; scales are bf16, one per `group` inputs):

- int8: data int8 `[..., N, K]`, values in [-127, 127], scale = absmax / 127.
- int4: data uint8 `[..., N, K // 2]`, two signed nibbles per byte (element
  2i in the low nibble, 2i+1 in the high one), values in [-8, 7],
  scale = absmax / 7.
- fp8: data uint8 `[..., N, K]` holding the bits of float8_e4m3fn,
  scale = absmax / 448. Stored as uint8 so `module.to(dtype)` (which casts
  every floating-point buffer, float8 included) cannot silently inflate it.

The scale is rounded to bf16 *before* the weights are divided by it, so the
scale actually stored is the one the values were quantized against.
"""

from __future__ import annotations

from typing import Literal

import torch

PackedMode = Literal["fp8", "int8", "int4"]
PACKED_MODES: tuple[PackedMode, ...] = ("fp8", "int8", "int4")
SCALE_DTYPE = torch.bfloat16
_QMAX = {"int8": 127.0, "int4": 7.0, "fp8": 448.0}
_SMALLEST_SCALE = 1e-12
"""An all-zero group would divide by zero; bf16 keeps fp32's exponent range, so this survives the cast."""


def effective_group_size(in_features: int, group_size: int) -> int:
    """The group actually used: `group_size` halved until it divides `in_features`.

    The full model's expert down projection has K = 704 = 5.5 x 128, so a fixed
    128 would not tile it; 64 does. Halving keeps groups a power-of-two fraction
    of the request rather than padding the weights.
    """
    assert group_size >= 2 and group_size % 2 == 0, f"group size must be even and >= 2, got {group_size}"
    group = group_size
    while in_features % group:
        group //= 2
    assert group >= 2, f"input dimension {in_features} has no even group size <= {group_size}"
    return group


def quantize(weight: torch.Tensor, mode: PackedMode, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Pack `weight` `[..., N, K]`; returns (data, scales `[..., N, K // group]`)."""
    assert mode in PACKED_MODES, f"unknown packed mode {mode!r}"
    in_features = weight.shape[-1]
    group = effective_group_size(in_features, group_size)
    # grouped: [..., N, K // group, group]; fp32 so the rounding below is exact
    grouped = weight.detach().float().reshape(*weight.shape[:-1], in_features // group, group)
    absmax = grouped.abs().amax(dim=-1, keepdim=True)
    scales = (absmax / _QMAX[mode]).clamp(min=_SMALLEST_SCALE).to(SCALE_DTYPE)
    scaled = grouped / scales.float()
    if mode == "int8":
        data = scaled.round().clamp(-127, 127).to(torch.int8).reshape(weight.shape)
    elif mode == "int4":
        nibbles = scaled.round().clamp(-8, 7).to(torch.int8).reshape(weight.shape)
        data = pack_int4(nibbles)
    else:
        data = scaled.clamp(-448, 448).to(torch.float8_e4m3fn).reshape(weight.shape).view(torch.uint8)
    return data, scales.squeeze(-1)


def dequantize(
    data: torch.Tensor, scales: torch.Tensor, mode: PackedMode, dtype: torch.dtype
) -> torch.Tensor:
    """Unpack to a `dtype` weight `[..., N, K]`; works on one expert's slice or a whole stack."""
    if mode == "int8":
        values = data
    elif mode == "int4":
        values = unpack_int4(data)
    elif mode == "fp8":
        values = data.view(torch.float8_e4m3fn)
    else:
        raise AssertionError(f"unknown packed mode {mode!r}")
    groups = scales.shape[-1]
    in_features = values.shape[-1]
    # [..., N, groups, group] * [..., N, groups, 1]: one multiply, no per-group loop
    grouped = values.to(dtype).reshape(*values.shape[:-1], groups, in_features // groups)
    return (grouped * scales.to(dtype).unsqueeze(-1)).reshape(values.shape)


def pack_int4(nibbles: torch.Tensor) -> torch.Tensor:
    """int8 values in [-8, 7] `[..., K]` (K even) -> uint8 `[..., K // 2]`."""
    assert nibbles.shape[-1] % 2 == 0, f"int4 packing needs an even last dimension, got {nibbles.shape[-1]}"
    low = nibbles[..., 0::2].to(torch.int16) & 0xF
    high = nibbles[..., 1::2].to(torch.int16) & 0xF
    return (low | (high << 4)).to(torch.uint8)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """uint8 `[..., K // 2]` -> int8 values in [-8, 7] `[..., K]`."""
    low = (packed & 0xF).to(torch.int8)
    high = (packed >> 4).to(torch.int8)
    # sign-extend a 4-bit two's complement value: 8..15 -> -8..-1
    low = low - ((low & 0x8) << 1)
    high = high - ((high & 0x8) << 1)
    return torch.stack((low, high), dim=-1).reshape(*packed.shape[:-1], packed.shape[-1] * 2)


def packed_bytes(data: torch.Tensor, scales: torch.Tensor) -> int:
    """Resident bytes of one packed weight, scales included."""
    return data.numel() * data.element_size() + scales.numel() * scales.element_size()
