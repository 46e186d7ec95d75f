"""Safetensors checkpoints quantized by vLLM's tools: compressed-tensors FP8-dynamic and NVFP4, ModelOpt NVFP4.

Their quantized linears (attention, MLP, self-conditioning) keep the linear's name; their experts
are stored one per expert (`...experts.E.{gate,up,down}_proj`), as vLLM's loader reads them, and
land in our fused `[E, 2I, H]` / `[E, H, I]` stacks (gate rows first). Per tensor:

- FP8-dynamic: `weight` float8_e4m3fn `[N, K]`, `weight_scale` `[N, 1]` (one per output channel;
  activations are quantized at run time by vLLM; here the kernels' own w8a8 path does that). The
  fp8 bits go into the fp8 layout as they are, the channel scale becomes one group of the whole row
  (`[1, N]` group-major, kept in float32, which the kernels read as they read bf16): no round trip
  through bf16, nothing lost.
- NVFP4, compressed-tensors: `weight_packed` uint8 `[N, K/2]` (e2m1, element 2i in the low
  nibble), `weight_scale` float8_e4m3fn `[N, K/16]`, `weight_global_scale` `[1]`;
  w = e2m1 * weight_scale / weight_global_scale.
- NVFP4, ModelOpt: `weight` uint8 `[N, K/2]`, `weight_scale` float8_e4m3fn `[N, K/16]`,
  `weight_scale_2` scalar; w = e2m1 * weight_scale * weight_scale_2.
  This build has no FP4 kernel yet: every e2m1 value is exact in e4m3, so NVFP4 loads into the
  fp8 layout with a group of 16 (scale = block scale x global scale, rounded to bf16) — exact
  values at fp8 residency, scales within bf16's rounding. It is offered only where the checkpoint is meant to run (FP4 tensor
  cores, sm100/sm120) and on the CPU (tests); other cards get the checkpoint that fits them.

Streams like the bf16 loader: one shard open at a time (a tensor's scale in another shard is
read from that shard alone), each expert placed in its stack as it arrives.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from ...errors import ModelLoadError
from ..streaming import KeyMapper, SkeletonFiller, TensorInfo, _numel, checkpoint_files, read_headers
from ..text_model import is_vision_key
from .detect import CT_FP8, CT_NVFP4, MODELOPT_NVFP4

log = logging.getLogger(__name__)

E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
"""FP4 e2m1 by its 4-bit code (sign in bit 3), as OCP MX and NVIDIA define it."""
NVFP4_GROUP = 16
_EXPERT = re.compile(r"^(?P<prefix>.+\.experts)\.(?P<expert>\d+)\.(?P<proj>gate_proj|up_proj|down_proj)\.(?P<part>\w+)$")
_PARTS = ("weight", "weight_packed", "weight_scale", "weight_global_scale", "weight_scale_2", "input_scale",
          "input_global_scale", "weight_zero_point", "input_zero_point")
"""Tensors of one quantized linear; the weight and its scales are read, activation scales are not (weight-only)."""


@dataclass(frozen=True)
class Piece:
    """Where one quantized weight goes: its checkpoint target key, and for an expert its row block."""

    target: str
    """Checkpoint key of the skeleton tensor: `...experts.gate_up_proj`, `...experts.down_proj`, `....weight`."""
    expert: int | None
    half: int
    """gate_up: 0 for gate rows, 1 for up rows; 0 otherwise."""
    base: str
    """The checkpoint's name of this linear (`...experts.3.up_proj`, `...self_attn.q_proj`)."""


def pieces(infos: list[TensorInfo]) -> tuple[dict[str, Piece], set[str]]:
    """Checkpoint linear name -> Piece for every quantized weight; and every key those pieces consume."""
    keys = {info.key: info for info in infos}
    found: dict[str, Piece] = {}
    consumed: set[str] = set()
    for key, info in keys.items():
        match = _EXPERT.match(key)
        if match and match["part"] in _PARTS:
            base = key.rsplit(".", 1)[0]
            if base in found:
                consumed.add(key)
                continue
            proj = match["proj"]
            target = f"{match['prefix']}.{'down_proj' if proj == 'down_proj' else 'gate_up_proj'}"
            found[base] = Piece(target, int(match["expert"]), 1 if proj == "up_proj" else 0, base)
            consumed.add(key)
            continue
        base, _, part = key.rpartition(".")
        if part in ("weight_packed", "weight_scale", "weight_global_scale", "weight_scale_2") or (
            part == "weight" and info.dtype in ("F8_E4M3", "U8") and f"{base}.weight_scale" in keys
        ):
            found.setdefault(base, Piece(f"{base}.weight", None, 0, base))
    for base in found:
        consumed.update(f"{base}.{part}" for part in _PARTS if f"{base}.{part}" in keys)
    return found, consumed


def module_modes(found: dict[str, Piece], skeleton: nn.Module, mapper) -> dict[str, str]:
    """Module name (every tied name) -> "fp8" for each module the checkpoint holds quantized."""
    from ..quantization import _quantizable_modules

    quantized = {mapper(piece.target).rsplit(".", 1)[0] for piece in found.values()}
    experts_groups, linear_groups = _quantizable_modules(skeleton)
    modes: dict[str, str] = {}
    for group in [*experts_groups, *linear_groups]:
        names = [name for name, _ in group]
        if any(name in quantized for name in names):
            modes.update(dict.fromkeys(names, "fp8"))
    return modes


def planned_bytes(infos: list[TensorInfo], skeleton: nn.Module, fmt: str, dtype: torch.dtype) -> int:
    """Resident bytes: quantized weights as fp8 data + bf16 scales, the rest in `dtype`, no vision, ties once."""
    found, consumed = pieces(infos)
    mapper = KeyMapper(skeleton)
    by_key = {info.key: info for info in infos}
    size = torch.tensor([], dtype=dtype).element_size()
    total = 0
    for piece in found.values():
        if is_vision_key(mapper(piece.target)):
            continue
        rows, columns = _weight_shape(by_key, piece.base, fmt)
        total += rows * columns + (rows * 4 if fmt == CT_FP8 else rows * (columns // NVFP4_GROUP) * 2)
    for info in infos:
        if info.key in consumed or is_vision_key(mapper(info.key)):
            continue
        total += _numel(info.shape) * (size if info.dtype in ("F64", "F32", "BF16", "F16") else info.bytes // max(
            1, _numel(info.shape)))
    return total


def stream_load(skeleton: nn.Module, folder: Path, fmt: str, *, device: str, dtype: torch.dtype, source: str,
                progress: Callable[[int, int], None] | None = None):
    """Fill `skeleton` from the checkpoint's shards; quantized linears and experts into the fp8 layout."""
    from safetensors import safe_open

    files = checkpoint_files(folder)
    infos = read_headers(files)
    found, consumed = pieces(infos)
    mapper = KeyMapper(skeleton)
    modes = module_modes(found, skeleton, mapper)
    filler = SkeletonFiller(skeleton, device=device, mode="fp8", group_size=NVFP4_GROUP,
                            mode_of=lambda names: next((modes[n] for n in names if n in modes), None))
    where = {info.key: info.file for info in infos}
    stacks = _Stacks(filler, skeleton, device)
    if progress is not None:
        progress(0, len(files))
    with torch.no_grad():
        for done, file in enumerate(files, start=1):
            with safe_open(str(file), framework="pt", device="cpu") as shard:
                def read(key: str, shard=shard, file=file) -> torch.Tensor:
                    if where.get(key) == file:
                        return shard.get_tensor(key)
                    if key not in where:
                        raise ModelLoadError(f"{source} lacks {key}")
                    with safe_open(str(where[key]), framework="pt", device="cpu") as other:
                        return other.get_tensor(key)

                for key in shard.keys():
                    base = key.rsplit(".", 1)[0]
                    piece = found.get(base)
                    if piece is not None and is_vision_key(mapper(piece.target)):
                        continue  # the vision tower is never loaded (text_model)
                    if piece is not None and key == _weight_key(base, fmt):
                        data, scales = _fp8_layout(fmt, base, read)
                        stacks.place(piece, mapper(piece.target), data.to(device), scales.to(device))
                    elif key not in consumed:
                        filler.put(key, lambda key=key: shard.get_tensor(key))
            if progress is not None:
                progress(done, len(files))
    stacks.finish(source)
    return filler.finish(source)


def _fp8_layout(fmt: str, base: str, read: Callable[[str], torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """(data uint8 e4m3 bits [N, K], scales group-major [groups, N]) of one quantized linear, in the fp8 layout."""
    if fmt == CT_FP8:
        weight = read(f"{base}.weight")
        if weight.dtype != torch.float8_e4m3fn:
            raise ModelLoadError(f"{base}.weight is {weight.dtype}, FP8-dynamic stores float8_e4m3fn")
        scale = read(f"{base}.weight_scale").float().reshape(weight.shape[0], -1)  # [N, 1]
        if scale.shape[1] != 1:
            raise ModelLoadError(f"{base}.weight_scale has {scale.shape[1]} scales per row; FP8-dynamic has one")
        # fp32, group-major [1, N]: the kernels read float32 scales as they read bf16 (quant_formats), so the
        # checkpoint's values are held exactly, at 4 bytes per row.
        return weight.view(torch.uint8), scale.transpose(0, 1).contiguous()
    packed = read(f"{base}.weight_packed" if fmt == CT_NVFP4 else f"{base}.weight")
    block_scale = read(f"{base}.weight_scale").float()  # [N, K/16], stored as e4m3
    if fmt == CT_NVFP4:
        global_scale = 1.0 / read(f"{base}.weight_global_scale").float().reshape(())
    else:
        global_scale = read(f"{base}.weight_scale_2").float().reshape(())
    values = unpack_e2m1(packed)  # [N, K] float32, exact
    if block_scale.shape[-1] * NVFP4_GROUP != values.shape[-1]:
        raise ModelLoadError(f"{base}: {block_scale.shape[-1]} scales for {values.shape[-1]} inputs (NVFP4: one per 16)")
    data = values.to(torch.float8_e4m3fn).view(torch.uint8)
    # bf16, group-major [K/16, N]: fp32 would hold block x global exactly at twice the scales' bytes
    # (0.25 instead of 0.125 per weight), which a card that NVFP4 is for cannot spare at fp8 residency.
    return data, (block_scale * global_scale).to(torch.bfloat16).transpose(0, 1).contiguous()


def unpack_e2m1(packed: torch.Tensor) -> torch.Tensor:
    """uint8 [..., K/2] of e2m1 pairs (element 2i in the low nibble) -> float32 [..., K]."""
    table = torch.tensor(E2M1_VALUES, dtype=torch.float32)
    low = table[(packed & 0xF).long()]
    high = table[(packed >> 4).long()]
    return torch.stack((low, high), dim=-1).reshape(*packed.shape[:-1], packed.shape[-1] * 2)


def _weight_key(base: str, fmt: str) -> str:
    return f"{base}.weight_packed" if fmt == CT_NVFP4 else f"{base}.weight"


def _weight_shape(by_key: dict[str, TensorInfo], base: str, fmt: str) -> tuple[int, int]:
    info = by_key[_weight_key(base, fmt)]
    rows, columns = info.shape[-2], info.shape[-1]
    return (rows, columns * 2) if fmt in (CT_NVFP4, MODELOPT_NVFP4) else (rows, columns)


class _Stacks:
    """Each packed module's buffers, allocated on first use and filled piece by piece (experts by slice)."""

    def __init__(self, filler: SkeletonFiller, skeleton: nn.Module, device: str) -> None:
        self.filler = filler
        self.device = device
        self.expected: dict[tuple[int, str], int] = {}
        self.placed: dict[tuple[int, str], set[tuple[int | None, int]]] = {}
        self.names: dict[tuple[int, str], str] = {}
        for _name, (module, which) in filler.targets.items():
            if which != "weight":
                self.expected[(id(module), which)] = module.num_experts * (2 if which == "gate_up" else 1)

    def place(self, piece: Piece, name: str, data: torch.Tensor, scales: torch.Tensor) -> None:
        if name not in self.filler.targets:
            raise ModelLoadError(f"quantized tensor {piece.base} has no place in the model ({name})")
        module, which = self.filler.targets[name]
        slot = (id(module), which)
        self.names[slot] = name
        self.placed.setdefault(slot, set()).add((piece.expert, piece.half))
        module._is_hf_initialized = True
        if piece.expert is None:
            setattr(module, f"{which}_data", data)
            setattr(module, f"{which}_scales", scales)
            return
        rows = data.shape[0]
        halves = 2 if which == "gate_up" else 1
        current = getattr(module, f"{which}_data")
        if current.numel() == 0:
            setattr(module, f"{which}_data", torch.empty((module.num_experts, rows * halves, data.shape[1]),
                                                          dtype=data.dtype, device=self.device))
            setattr(module, f"{which}_scales", torch.empty((module.num_experts, scales.shape[0], rows * halves),
                                                            dtype=scales.dtype, device=self.device))
        start = piece.half * rows  # gate rows, then up rows (N); scales are group-major, N last
        getattr(module, f"{which}_data")[piece.expert, start : start + rows] = data
        getattr(module, f"{which}_scales")[piece.expert, :, start : start + rows] = scales

    def finish(self, source: str) -> None:
        for slot, count in self.expected.items():
            placed = len(self.placed.get(slot, ()))
            if slot in self.placed and placed != count:
                raise ModelLoadError(f"{source} holds {placed} of the {count} expert pieces of {self.names[slot]}")

