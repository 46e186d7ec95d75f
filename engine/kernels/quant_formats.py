"""Group-wise weight packing for quantized residency: pure tensor functions.

Owns the storage formats of `quantization.py` and nothing else: how a float
weight `[..., N, K]` becomes packed data + per-group scales along its input
dimension K, and how it comes back; and the reference per-group quantization
of activations that the w8a8 kernels do in registers. Knows nothing of
modules, models, files or devices; every function works on CPU and CUDA alike.

Formats (one scale per `group` inputs along K; scales are stored group-major,
`[..., K // group, N]`, so a kernel reading one group for a tile of output
columns reads one contiguous run):

- int8: data int8 `[..., N, K]`, values in [-127, 127], scale = absmax / 127.
- fp8: data uint8 `[..., N, K]` holding the bits of float8_e4m3fn,
  scale = absmax / 448. Stored as uint8 so `module.to(dtype)` (which casts
  every floating-point buffer, float8 included) cannot silently inflate it.
- int4 ("tiles", the layout the expert kernel reads): data int16
  `[..., N, K // 4]`, four 4-bit codes per word. Along K the words come in
  blocks of `P` (16 wherever K is a multiple of 64: every tensor of the real
  model): word `b * P + p` of a row holds inputs `4 * P * b + P * j + p` in
  its bits `4j .. 4j + 3`, j = 0..3. So one word read gives four values that
  belong to four *contiguous* K-slices of P inputs: a kernel that unpacks
  code j of a `[rows, P]` tile of words gets the weight tile of inputs
  `4Pb + Pj .. 4Pb + Pj + P - 1` with no shuffle, and one 32-bit register
  (two words) unpacks into bf16 pairs with one AND/OR each (the magic number:
  0x4300 | c is the bf16 of 128 + c, `expert_kernels`). Codes are offset
  binary: symmetric int4 stores c = q + 8 for q in [-8, 7], scale =
  absmax / 7, weight = scale * (c - 8).
- int4 affine (same words, plus a `mins` tensor shaped like the scales):
  weight = scale * c + min, c in [0, 15]. This is the form GGUF Q4_K
  and AWQ / GPTQ with zero points (scale = s, min = -z * s, fp16: exact)
  are repacked into without loss. Our own `quantize_int4_affine` (min-max,
  group 32) stores bf16.
- two-level scales (any of the above, optional `super_scales` / `super_mins`
  `[..., K // S, N]`, one per S inputs, S a multiple of the group): the
  group's scale is scales[g] * super_scales[g * group // S] in fp32, its min
  mins[g] * super_mins[...]. GGUF Q4_K is exactly that: per 256 inputs an
  fp16 d and dmin, per 32 a 6-bit sc and m, scale = d * sc (17 bits: more
  than bf16 or fp16 hold, exact in fp32), min = -dmin * m. Stored as uint8
  sc / m and fp16 d / -dmin it costs 0.625 bits per weight beyond the codes
  (Q4_K's own 0.5) where float32 per-group scales and mins would cost 2.
  Every scale dtype (bf16, fp16, float32, uint8) is read as fp32 by the
  kernels, and the product taken in fp32 is exact for these formats.

The scale is rounded to its stored dtype *before* the weights are divided by
it, so the scale actually stored is the one the values were quantized against.
`legacy_layout` gives the layout of `moe_kernels.dequant_gemm_kernel` (int4
as two's-complement nibble pairs `[..., N, K // 2]` uint8, scales `[..., N,
K // group]`), kept for A/B timing against the new kernel.
"""

from __future__ import annotations

from typing import Literal

import torch

PackedMode = Literal["fp8", "int8", "int4"]
PACKED_MODES: tuple[PackedMode, ...] = ("fp8", "int8", "int4")
ActivationKind = Literal["fp8", "int8"]
SCALE_DTYPE = torch.bfloat16
_QMAX = {"int8": 127.0, "int4": 7.0, "fp8": 448.0}
_SMALLEST_SCALE = 1e-12
"""An all-zero group would divide by zero; bf16 keeps fp32's exponent range, so this survives the cast."""
INT4_SUBTILE = 16
"""Words per K-block of the int4 tiles where K allows (K % 64 == 0): the kernel's K step per unpacked code."""
INT4_CODES_PER_WORD = 4
INT4_OFFSET = 8
"""Symmetric int4 codes are q + 8 (offset binary): the kernel's magic-number subtraction takes 136, not 128."""


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


def values_per_element(mode: str) -> int:
    """Inputs along K per stored data element: int4 words hold four."""
    return INT4_CODES_PER_WORD if mode == "int4" else 1


def in_features_of(data: torch.Tensor, mode: str) -> int:
    return data.shape[-1] * values_per_element(mode)


def group_of(data: torch.Tensor, scales: torch.Tensor, mode: str) -> int:
    """Inputs per scale of a packed weight (scales are `[..., K // group, N]`)."""
    return in_features_of(data, mode) // scales.shape[-2]


def int4_subtile(in_features: int) -> int:
    """P, the words per K-block of the int4 tiles: 16 where 64 divides K, else the largest power of two that fits."""
    assert in_features % INT4_CODES_PER_WORD == 0, f"int4 tiles need K divisible by 4, got {in_features}"
    words = INT4_SUBTILE
    while in_features % (INT4_CODES_PER_WORD * words):
        words //= 2
    return words


def quantize(weight: torch.Tensor, mode: PackedMode, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Pack `weight` `[..., N, K]`; returns (data, scales `[..., K // group, N]`)."""
    assert mode in PACKED_MODES, f"unknown packed mode {mode!r}"
    grouped, group = _grouped(weight, group_size)  # [..., N, K // group, group] fp32
    absmax = grouped.abs().amax(dim=-1, keepdim=True)
    scales = (absmax / _QMAX[mode]).clamp(min=_SMALLEST_SCALE).to(SCALE_DTYPE)
    scaled = grouped / scales.float()
    if mode == "int8":
        data = scaled.round().clamp(-127, 127).to(torch.int8).reshape(weight.shape)
    elif mode == "int4":
        codes = (scaled.round().clamp(-8, 7) + INT4_OFFSET).to(torch.uint8).reshape(weight.shape)
        data = pack_int4_tiles(codes)
    else:
        data = scaled.clamp(-448, 448).to(torch.float8_e4m3fn).reshape(weight.shape).view(torch.uint8)
    return data, _group_major(scales.squeeze(-1))


def quantize_int4_affine(
    weight: torch.Tensor, group_size: int = 32
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Min-max int4 (weight = scale * c + min, c in [0, 15]): (data, scales, mins), scales and mins `[..., K // g, N]`.

    The form imported Q4_K / AWQ weights take (module docstring); here for tests and timing of that path.
    """
    grouped, _ = _grouped(weight, group_size)
    low = grouped.amin(dim=-1, keepdim=True).clamp(max=0.0)  # a group of all-positive weights keeps 0 exact
    high = grouped.amax(dim=-1, keepdim=True).clamp(min=0.0)
    scales = ((high - low) / 15).clamp(min=_SMALLEST_SCALE).to(SCALE_DTYPE)
    mins = low.to(SCALE_DTYPE)
    codes = ((grouped - mins.float()) / scales.float()).round().clamp(0, 15).to(torch.uint8).reshape(weight.shape)
    return pack_int4_tiles(codes), _group_major(scales.squeeze(-1)), _group_major(mins.squeeze(-1))


def dequantize(
    data: torch.Tensor,
    scales: torch.Tensor,
    mode: PackedMode,
    dtype: torch.dtype,
    mins: torch.Tensor | None = None,
    super_scales: torch.Tensor | None = None,
    super_mins: torch.Tensor | None = None,
) -> torch.Tensor:
    """Unpack to a `dtype` weight `[..., N, K]`; works on one expert's slice or a whole stack.

    `mins` (int4 only) selects the affine form, weight = scale * code + min; `super_scales` / `super_mins`
    the two-level scales (each group's scale and min times its super-block's, module docstring).
    """
    assert mins is None or mode == "int4", "only int4 has an affine (min) form"
    assert (super_mins is not None) == (super_scales is not None and mins is not None), (
        "an affine weight with super scales has super mins, and only it"
    )
    if mode == "int8":
        values = data.float()
    elif mode == "int4":
        values = unpack_int4_tiles(data).float() - (0 if mins is not None else INT4_OFFSET)
    elif mode == "fp8":
        values = data.view(torch.float8_e4m3fn).float()
    else:
        raise AssertionError(f"unknown packed mode {mode!r}")
    groups = scales.shape[-2]
    in_features = values.shape[-1]
    # [..., N, groups, group] * [..., N, groups, 1]: one multiply, no per-group loop; exact in fp32
    # for our formats (a bf16 scale times an integer of <= 8 bits), then one rounding to `dtype`.
    grouped = values.reshape(*values.shape[:-1], groups, in_features // groups)
    weight = grouped * _group_factors(scales, super_scales).unsqueeze(-1)
    if mins is not None:
        weight = weight + _group_factors(mins, super_mins).unsqueeze(-1)
    return weight.reshape(values.shape).to(dtype)


def _group_factors(per_group: torch.Tensor, per_super: torch.Tensor | None) -> torch.Tensor:
    """fp32 `[..., N, G]`: the per-group scales (or mins), times their super-block's where there are two levels
    (the product of a <= 8-bit integer and an fp16 value: exact in fp32, in the kernels' order)."""
    factors = _row_major(per_group).float()
    if per_super is None:
        return factors
    repeat = per_group.shape[-2] // per_super.shape[-2]
    assert repeat * per_super.shape[-2] == per_group.shape[-2], "super groups must be whole groups"
    return factors * _row_major(per_super).float().repeat_interleave(repeat, dim=-1)


def pack_int4_tiles(codes: torch.Tensor) -> torch.Tensor:
    """4-bit codes (0..15, any integer dtype) `[..., K]` -> int16 words `[..., K // 4]` in the tile order."""
    in_features = codes.shape[-1]
    words = int4_subtile(in_features)
    # [..., blocks, j, p] -> word (block, p) gets code j in bits 4j..4j+3
    tiled = codes.to(torch.int32).reshape(*codes.shape[:-1], in_features // (4 * words), 4, words)
    shifts = torch.tensor([0, 4, 8, 12], dtype=torch.int32, device=codes.device).view(4, 1)
    packed = (tiled << shifts).sum(dim=-2)  # [..., blocks, p]: disjoint bits, so the sum is an OR
    # int16 is two's complement: codes with bit 15 set wrap to negative, the bits unchanged
    packed = torch.where(packed >= 1 << 15, packed - (1 << 16), packed)
    return packed.to(torch.int16).reshape(*codes.shape[:-1], in_features // 4)


def unpack_int4_tiles(words: torch.Tensor) -> torch.Tensor:
    """int16 words `[..., K // 4]` -> uint8 codes `[..., K]` in input order."""
    in_features = words.shape[-1] * 4
    per_block = int4_subtile(in_features)
    bits = words.to(torch.int32) & 0xFFFF
    blocks = bits.reshape(*words.shape[:-1], in_features // (4 * per_block), 1, per_block)
    shifts = torch.tensor([0, 4, 8, 12], dtype=torch.int32, device=words.device).view(4, 1)
    codes = (blocks >> shifts) & 0xF  # [..., blocks, j, p]
    return codes.to(torch.uint8).reshape(*words.shape[:-1], in_features)


def quantize_activations(
    activations: torch.Tensor, group: int, kind: ActivationKind
) -> tuple[torch.Tensor, torch.Tensor]:
    """What the w8a8 kernels do to activations in registers: `[..., K]` -> (codes `[..., K]`, fp32 scales `[..., K // group]`).

    Per row and per `group` inputs: scale = absmax / qmax (fp32), codes = activations / scale, rounded
    to float8_e4m3fn (to nearest even) or to int8 (half up: floor(x + 0.5)), the kernels' own rules.
    An all-zero group gets a tiny scale and zero codes.
    """
    values = activations.float()
    grouped = values.reshape(*values.shape[:-1], values.shape[-1] // group, group)
    qmax = 448.0 if kind == "fp8" else 127.0
    scales = grouped.abs().amax(dim=-1, keepdim=True).clamp(min=_SMALLEST_SCALE) / qmax
    scaled = grouped / scales
    if kind == "fp8":
        codes = scaled.to(torch.float8_e4m3fn)
    else:
        codes = torch.floor(scaled + 0.5).clamp(-127, 127).to(torch.int8)
    return codes.reshape(activations.shape), scales.squeeze(-1)


def dequantize_activations(codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """fp32 `[..., K]` from `quantize_activations`' output."""
    group = codes.shape[-1] // scales.shape[-1]
    grouped = codes.float().reshape(*codes.shape[:-1], scales.shape[-1], group)
    return (grouped * scales.unsqueeze(-1)).reshape(codes.shape)


def legacy_layout(data: torch.Tensor, scales: torch.Tensor, mode: PackedMode) -> tuple[torch.Tensor, torch.Tensor]:
    """The same packed values in `moe_kernels.dequant_gemm_kernel`'s layout (int4 nibble pairs, scales `[..., N, G]`)."""
    if mode == "int4":
        data = pack_int4(unpack_int4_tiles(data).to(torch.int8) - INT4_OFFSET)
    return data, _row_major(scales).contiguous()


def pack_int4(nibbles: torch.Tensor) -> torch.Tensor:
    """Legacy int4 pairs: int8 values in [-8, 7] `[..., K]` (K even) -> uint8 `[..., K // 2]`, 2i low, 2i+1 high."""
    assert nibbles.shape[-1] % 2 == 0, f"int4 packing needs an even last dimension, got {nibbles.shape[-1]}"
    low = nibbles[..., 0::2].to(torch.int16) & 0xF
    high = nibbles[..., 1::2].to(torch.int16) & 0xF
    return (low | (high << 4)).to(torch.uint8)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """Legacy int4 pairs: uint8 `[..., K // 2]` -> int8 values in [-8, 7] `[..., K]`."""
    low = (packed & 0xF).to(torch.int8)
    high = (packed >> 4).to(torch.int8)
    # sign-extend a 4-bit two's complement value: 8..15 -> -8..-1
    low = low - ((low & 0x8) << 1)
    high = high - ((high & 0x8) << 1)
    return torch.stack((low, high), dim=-1).reshape(*packed.shape[:-1], packed.shape[-1] * 2)


def packed_bytes(data: torch.Tensor, *per_group: torch.Tensor) -> int:
    """Resident bytes of one packed weight: data plus its scales (and mins, and super scales)."""
    return sum(t.numel() * t.element_size() for t in (data, *per_group))


def _grouped(weight: torch.Tensor, group_size: int) -> tuple[torch.Tensor, int]:
    """`[..., N, K]` -> fp32 `[..., N, K // group, group]` (fp32 so the rounding that follows is exact)."""
    in_features = weight.shape[-1]
    group = effective_group_size(in_features, group_size)
    return weight.detach().float().reshape(*weight.shape[:-1], in_features // group, group), group


def _group_major(per_row: torch.Tensor) -> torch.Tensor:
    """`[..., N, G]` -> contiguous `[..., G, N]`."""
    return per_row.transpose(-1, -2).contiguous()


def _row_major(group_major: torch.Tensor) -> torch.Tensor:
    """`[..., G, N]` -> a `[..., N, G]` view."""
    return group_major.transpose(-1, -2)
