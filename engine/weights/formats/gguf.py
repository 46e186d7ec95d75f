"""GGUF checkpoints of DiffusionGemma (llama.cpp's `diffusion-gemma`; unsloth's Q4_K_M, Q8_0, ...) into our packed layout.

Names. llama.cpp's converter (ggml-org/llama.cpp PRs #24423/#24427, `conversion/diffusion_gemma.py`,
read 2026-12) writes the decoder's backbone under Gemma 4's GGUF names (`model.decoder.X` ->
`model.X`, then gguf-py's own `GEMMA4` tensor map: `blk.N.ffn_gate_up_exps`, `blk.N.attn_q`, ...),
the router's scale as `blk.N.ffn_gate_inp.scale`, the per-expert down scale as
`blk.N.ffn_down_exps.scale`, the decoder's `layer_scalar` as `blk.N.layer_output_scale`, the
encoder's as `blk.N.enc_layer_output_scale`, the self-conditioning MLP as `self_cond_{pre_norm,
gate,up,down}`, drops the vision tower, the tied `lm_head` and the other encoder tensors (tied to the
decoder's), and may cut `token_embd` to the tokenizer's length. `gguf` 0.19 (PyPI) has no
`diffusion-gemma` architecture yet, so the map here is that converter's rules run backwards over
gguf-py's `GEMMA4` map, checked against the tensor list of the published Q4_K_M file (692
tensors: fused `ffn_gate_up_exps` [E, 2I, H], no `attn_v` on the 5 full-attention layers).

Repack. Every tensor of a Q4_K_M or Q8_0 file is placed without loss: the packed weights
dequantize to exactly what gguf's own `gguf.quants.dequantize` (bit-exact with ggml) gives,
a few experts at a time, each projection in the form its own type fits (`_exact_forms`):
- Q4_K -> affine int4 in groups of 32 (Q4_K's sub-block) with two-level scales: the block's 4-bit
  codes, its 6-bit sc and m per 32 (uint8) and its fp16 d and -dmin per 256 as they are; the kernels
  take scale = sc * d and min = m * -dmin in fp32 (17 bits: exact); 4.625 bits per weight where Q4_K
  takes 4.5 (float32 scales and mins per 32 would take 6);
- Q8_0, Q5_0, Q6_K -> int8 with the file's own values and block scales (fp16 per 32 for
  Q8_0 / Q5_0, float32 d * sc per 16 for Q6_K);
- F32/F16/BF16 -> kept in full precision (or packed like the bf16 loader when asked).
An experts module holds gate_up and down each in its own mode: in Q4_K_M llama.cpp writes
`ffn_down_exps` as Q5_0 or Q8_0 (704 columns do not tile Q4_K's 256; Q6_K on `use_more_bits`
layers), so one layer has Q4_K gate_up as affine int4 beside int8 down. The kernels read every
one of these scales (fp16, float32, uint8 under fp16) and mins as they read bf16 ones. Other types are dequantized and re-packed
by `quant_formats.quantize`, which rounds again: a 4-bit one (Q4_0, IQ4_*, ...) -> symmetric int4
in groups of 32, Q5_K -> int8 in groups of 32. `dgemma-lsp bench formats` measures each repack
against the GGUF's own dequantized weights (RESULTS). The packed result is saved like
`--quantization`'s cache, so only the first start reads the blocks.

Host memory: the file is read with positioned reads (`numpy.fromfile(offset=)`), never mapped
whole, so a load holds a chunk of experts' blocks and their fp32 values, never the file.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ...errors import ModelLoadError
from ...kernels.quant_formats import effective_group_size, pack_int4_tiles, quantize
from ..streaming import PACK_CHUNK_BYTES, SkeletonFiller, _numel, _packed_bytes, _quantized_targets
from ..text_model import is_vision_key

log = logging.getLogger(__name__)

ARCHITECTURE = "diffusion-gemma"
EXPECTED_UNUSED = ("rope_freqs.weight",)
"""Written by the converter for llama.cpp's rope; the model computes its own."""
HOST_CHUNK_BYTES = 0
"""fp32 bytes of experts dequantized per read on a CPU device: 0, one expert (the quantize temporaries share
host memory with the load; 8 MB chunks grew a load's peak by about the file's size, measured with `bench load`)."""
DENSE_CHUNK_BYTES = 8 * 1024**2
"""fp32 bytes of a full-precision tensor (the embedding) dequantized per read."""
SELF_CONDITIONING = {"pre_norm": "self_cond_pre_norm", "gate_proj": "self_cond_gate", "up_proj": "self_cond_up",
                     "down_proj": "self_cond_down"}
_LAYER = re.compile(r"\.layers\.(\d+)\.")


@dataclass(frozen=True)
class GgufTensor:
    file: Path
    name: str
    qtype: int
    """gguf.GGMLQuantizationType."""
    shape: tuple[int, ...]
    """numpy order (outermost first), as the checkpoint's torch tensor: [E, N, K], [N, K], [K]."""
    offset: int
    """Absolute byte offset of its data in `file`."""
    n_bytes: int


def read_tensors(files: tuple[Path, ...]) -> tuple[list[GgufTensor], dict[str, object]]:
    """Every tensor's name, type, shape and place, and the metadata, from the files' headers."""
    from gguf import GGUFReader

    tensors: list[GgufTensor] = []
    metadata: dict[str, object] = {}
    for file in files:
        reader = GGUFReader(file)  # maps the file but reads only its header pages
        for key, field in reader.fields.items():
            if not key.startswith("tokenizer.ggml.") and key not in metadata:
                try:
                    metadata[key] = field.contents()
                except Exception:  # noqa: BLE001 - an odd field must not stop a load that never reads it
                    continue
        for tensor in reader.tensors:
            shape = tuple(int(dim) for dim in reversed(tensor.shape.tolist()))
            tensors.append(GgufTensor(file, tensor.name, int(tensor.tensor_type), shape, int(tensor.data_offset),
                                      int(tensor.n_bytes)))
        del reader
    return tensors, metadata


def check_architecture(metadata: dict[str, object], config, source: str) -> None:
    """ModelLoadError when the GGUF is not DiffusionGemma or not `config`'s size."""
    arch = metadata.get("general.architecture")
    if arch != ARCHITECTURE:
        raise ModelLoadError(f"{source} holds a '{arch}' model, not DiffusionGemma ('{ARCHITECTURE}')")
    text = config.text_config
    for key, want in (("block_count", text.num_hidden_layers), ("embedding_length", text.hidden_size),
                      ("expert_count", text.num_experts)):
        found = metadata.get(f"{ARCHITECTURE}.{key}")
        if found is not None and int(found) != int(want):
            raise ModelLoadError(f"{source} has {key} {found}, its config.json says {want}: they are not one model")


def checkpoint_names(skeleton: nn.Module, n_blocks: int) -> dict[str, str]:
    """GGUF tensor name -> the checkpoint key it came from, for every tensor the text model loads."""
    import gguf

    name_map = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GEMMA4, n_blocks)
    names = {}
    for key in skeleton.state_dict(keep_vars=True):
        name = gguf_name(key, name_map)
        if name is not None:
            names.setdefault(name, key)
    return names


def gguf_name(key: str, name_map) -> str | None:
    """The converter's name for checkpoint key `key`; None for what it drops (vision, tied copies)."""
    if is_vision_key(key) or key == "lm_head.weight":
        return None
    encoder_scalar = re.fullmatch(r"model\.encoder\.language_model\.layers\.(\d+)\.layer_scalar", key)
    if encoder_scalar:
        return f"blk.{encoder_scalar[1]}.enc_layer_output_scale.weight"
    if key.startswith("model.encoder."):
        return None  # tied to the decoder's tensor of the same name
    if key.startswith("model.decoder.self_conditioning."):
        part = key.removeprefix("model.decoder.self_conditioning.").split(".")[0]
        return f"{SELF_CONDITIONING[part]}.weight" if part in SELF_CONDITIONING else None
    name = "model." + key.removeprefix("model.decoder.")
    layer = _LAYER.search(name)
    if name.endswith(".router.scale") and layer:
        return f"blk.{layer[1]}.ffn_gate_inp.scale"
    if name.endswith(".router.per_expert_scale") and layer:
        return f"blk.{layer[1]}.ffn_down_exps.scale"
    if name.endswith("layer_scalar") or (".experts." in name and not name.endswith(".weight")):
        name += ".weight"
    return name_map.get_name(name, try_suffixes=(".weight", ".bias"))


def packed_mode_of(qtype: int) -> tuple[str | None, int]:
    """(mode, group) a GGUF type packs into losing the least (nothing for `_exact_forms`' types): None for float
    types (kept as they are)."""
    import gguf

    kind = gguf.GGMLQuantizationType(qtype)
    if kind in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16, gguf.GGMLQuantizationType.BF16):
        return None, 0
    exact = _exact_forms().get(int(kind))
    if exact is not None:
        return exact.mode, exact.group
    block, size = gguf.GGML_QUANT_SIZES[kind]
    bits = size * 8 / block
    if bits <= 4.5:  # 4-bit values (+ scales): int4 in Q4_K's sub-block of 32
        return "int4", 32
    return "int8", 32


@dataclass(frozen=True)
class ExactForm:
    """How a GGUF type's blocks go into one of our layouts as they are (`exact_int8`, `exact_int4_affine`)."""

    mode: str
    block_bytes: int
    group: int
    """Inputs per scale."""
    scale_bytes: int
    """Bytes per stored scale: fp16 where the block's scale is one fp16, float32 where it is a product, uint8
    where it is a sub-scale under a super scale."""
    min_bytes: int = 0
    """Bytes per stored min (affine int4); 0: none."""
    super_group: int = 0
    """Inputs per super scale (and super min) of two-level scales; 0: one level."""
    super_bytes: int = 0
    """Bytes per super-block: its super scale and super min."""

    def fields(self, count: int, columns: int) -> list[tuple[tuple[int, int], torch.dtype]]:
        """(shape, dtype) of each tensor `_exact_rows` gives for `count` rows of `columns` inputs: codes,
        scales[, mins][, super scales, super mins]. The dry run (bench/dryrun.py) makes fake rows of these."""
        per_group = (count, columns // self.group)
        fields = [((count, columns), torch.uint8 if self.mode == "int4" else torch.int8),
                  (per_group, _STORED[self.scale_bytes])]
        if self.min_bytes:
            fields.append((per_group, _STORED[self.min_bytes]))
        if self.super_group:  # a super scale and a super min, half the bytes each
            fields += [((count, columns // self.super_group), _STORED[self.super_bytes // 2])] * 2
        return fields


_STORED = {1: torch.uint8, 2: torch.float16, 4: torch.float32}
"""Dtype of a stored scale or min by its bytes (`ExactForm`): a uint8 sub-scale, an fp16 or float32 scale."""


def _exact_forms() -> dict[int, ExactForm]:
    """GGUF type -> its exact form. Q8_0 and Q5_0 keep their fp16 block scale as it is; Q6_K's scale is fp16 d
    times an int8 sub-scale (up to 19 bits): float32 per 16; Q4_K keeps its two levels (uint8 sc and m per 32,
    fp16 d and -dmin per 256)."""
    import gguf

    kinds = gguf.GGMLQuantizationType
    return {int(kinds.Q8_0): ExactForm("int8", 34, 32, 2), int(kinds.Q5_0): ExactForm("int8", 22, 32, 2),
            int(kinds.Q6_K): ExactForm("int8", 210, 16, 4),
            int(kinds.Q4_K): ExactForm("int4", 144, 32, 1, 1, super_group=256, super_bytes=4)}


@dataclass(frozen=True)
class Plan:
    """How each checkpoint tensor lands: packed (mode, group) or kept; and the load's label."""

    modes: dict[str, str | None]
    """Module name (each tied name) -> packed mode (an experts module's gate_up's); None: full precision."""
    down_modes: dict[str, str]
    """Experts module name (each tied name) -> its down projection's packed mode (its own type's)."""
    groups: dict[str, tuple[str, int]]
    """Checkpoint key of a packed tensor -> (mode, group)."""
    mode: str
    """The mode most of the expert bytes are in ("none" when they stay float)."""
    exact: frozenset[str] = frozenset()
    """Keys placed with the file's own values and block scales (`_exact_forms`' types): nothing lost."""

    def mode_of(self, names: tuple[str, ...]) -> str | None:
        return next((self.modes[name] for name in names if name in self.modes), None)

    def down_mode_of(self, names: tuple[str, ...]) -> str | None:
        return next((self.down_modes[name] for name in names if name in self.down_modes), None)


def plan(tensors: list[GgufTensor], names: dict[str, str], skeleton: nn.Module, quantization: str) -> Plan:
    """Per-projection modes for these tensors; `quantization` (the flag) applies only to float tensors."""
    targets = _quantized_targets(skeleton)
    by_key = {names[t.name]: t for t in tensors if t.name in names}
    modes: dict[str, str | None] = {}
    down_modes: dict[str, str] = {}
    groups: dict[str, tuple[str, int]] = {}
    exact: set[str] = set()
    expert_bytes: dict[str, int] = {}
    for key, (_module, which) in targets.items():
        tensor = by_key.get(key)
        if tensor is None or which == "down":
            continue
        mode, _ = packed_mode_of(tensor.qtype)
        if mode is None and quantization != "none":
            mode = quantization
        modes[key.rsplit(".", 1)[0]] = mode
        if which == "gate_up":
            expert_bytes[mode or "none"] = expert_bytes.get(mode or "none", 0) + _numel(tensor.shape)
    for key, (_module, which) in targets.items():
        module_name = key.rsplit(".", 1)[0]
        mode = modes.get(module_name)
        tensor = by_key.get(key)
        if mode is None or tensor is None:
            continue
        own_mode, own_group = packed_mode_of(tensor.qtype)
        if which == "down":  # in its own type's mode (Q4_K_M: int8 down beside int4 gate_up); a float one in gate_up's
            mode = down_modes[module_name] = own_mode or mode
        group = own_group if own_mode == mode else 128
        groups[key] = (mode, effective_group_size(tensor.shape[-1], group))
        if own_mode == mode and tensor.qtype in _exact_forms():
            exact.add(key)
    _tie_modes(skeleton, modes)
    _tie_modes(skeleton, down_modes)
    label = max(expert_bytes, key=expert_bytes.get) if expert_bytes else "none"
    return Plan(modes=modes, down_modes=down_modes, groups=groups, mode=label, exact=frozenset(exact))


def planned_bytes(tensors: list[GgufTensor], names: dict[str, str], the_plan: Plan, dtype: torch.dtype) -> int:
    """Resident bytes after the load: packed tensors in their mode, the rest in `dtype`, each tied tensor once."""
    size = torch.tensor([], dtype=dtype).element_size()
    total = 0
    for tensor in tensors:
        key = names.get(tensor.name)
        if key is None:
            continue
        if key in the_plan.exact:
            form = _exact_forms()[tensor.qtype]
            value_bytes = 0.5 if form.mode == "int4" else 1
            per_super = form.super_bytes / form.super_group if form.super_group else 0
            total += _numel(tensor.shape) * (value_bytes + (form.scale_bytes + form.min_bytes) / form.group + per_super)
        elif key in the_plan.groups:
            mode, group = the_plan.groups[key]
            total += _packed_bytes(tensor.shape, mode, group)
        else:
            total += _numel(tensor.shape) * size
    return round(total)  # the exact forms' fractional bytes per input add up to whole super-blocks


@dataclass(frozen=True)
class RowSource:
    """Where `stream_load` reads a tensor's rows: the file (the default), or the virtual-GPU dry run's fake tensors
    of the same shapes and dtypes (bench/dryrun.py), so both run the same placement."""

    exact: Callable[[GgufTensor, int, int], tuple[torch.Tensor, ...]]
    """(tensor, first, count) -> rows [first, first + count) in the tensor's exact form (`_exact_rows`)."""
    values: Callable[[GgufTensor, int, int], torch.Tensor]
    """(tensor, first, count) -> those rows' fp32 values `[count, K]` (`dequantize_rows`)."""


def stream_load(skeleton: nn.Module, found_files: tuple[Path, ...], tensors: list[GgufTensor], names: dict[str, str],
                the_plan: Plan, *, device: str, dtype: torch.dtype, source: str,
                progress: Callable[[int, int], None] | None = None, rows: RowSource | None = None):
    """Fill `skeleton` from the GGUF, each tensor dequantized and packed per `the_plan`; returns the report.
    `rows`: where tensors' rows come from (default: the files)."""
    rows = rows or file_rows()
    filler = SkeletonFiller(skeleton, device=device, mode=the_plan.mode, group_size=32, mode_of=the_plan.mode_of,
                            down_mode_of=the_plan.down_mode_of)
    ordered = sorted(tensors, key=lambda t: (t.file.name, t.offset))
    unknown = [t.name for t in ordered if t.name not in names and t.name not in EXPECTED_UNUSED]
    if unknown:
        log.warning("%s: GGUF tensors the model does not use: %s", source, ", ".join(unknown[:5]))
    steps = len(ordered)
    if progress is not None:
        progress(0, steps)
    with torch.no_grad():
        for done, tensor in enumerate(ordered, start=1):
            key = names.get(tensor.name)
            if key is not None:
                name = filler.mapper(key)
                if name in filler.targets and key in the_plan.groups:
                    module, which = filler.targets[name]
                    mode, group = the_plan.groups[key]
                    _pack(module, which, tensor, mode, group, device, rows, exact=key in the_plan.exact)
                else:
                    target = _target_shape(skeleton, name, tensor.shape)
                    filler.put(key, lambda tensor=tensor, target=target: _dense(tensor, dtype, target, rows))
            if progress is not None:
                progress(done, steps)
    return filler.finish(source)


# -- pieces -------------------------------------------------------------------------------


def read_blocks(tensor: GgufTensor, first: int, count: int) -> np.ndarray:
    """Raw blocks of rows [first, first + count) of the tensor viewed as [rows, K]: uint8 [count, row bytes]."""
    import gguf

    kind = gguf.GGMLQuantizationType(tensor.qtype)
    block, size = gguf.GGML_QUANT_SIZES[kind]
    row_bytes = tensor.shape[-1] // block * size
    raw = np.fromfile(tensor.file, dtype=np.uint8, count=count * row_bytes, offset=tensor.offset + first * row_bytes)
    return raw.reshape(count, row_bytes)


def dequantize_rows(tensor: GgufTensor, first: int, count: int) -> np.ndarray:
    """fp32 values of rows [first, first + count), by gguf's own dequantizer: [count, K]."""
    from gguf.quants import dequantize

    return np.asarray(dequantize(read_blocks(tensor, first, count), tensor.qtype), dtype=np.float32).reshape(
        count, tensor.shape[-1])


def file_rows() -> RowSource:
    """The rows as the file's blocks give them (`stream_load`'s default)."""
    return RowSource(exact=_exact_rows, values=lambda tensor, first, count: torch.from_numpy(
        dequantize_rows(tensor, first, count)))


def _pack(module: nn.Module, which: str, tensor: GgufTensor, mode: str, group: int, device: str,
          rows_from: RowSource, exact: bool = False) -> None:
    """Place `tensor` in `module`'s `{which}_data` / `_scales` (and `_mins`, `_super_scales`, `_super_mins`), a
    chunk of experts at a time:
    `exact`: the file's own values and block scales (`exact_int8`, `exact_int4_affine`); else dequantized and
    packed in `mode`."""
    shape = tensor.shape if len(tensor.shape) == 3 else (1, *tensor.shape)
    experts, rows, columns = shape
    budget = PACK_CHUNK_BYTES if str(device).startswith("cuda") else HOST_CHUNK_BYTES
    chunk = max(1, budget // (rows * columns * 4))
    stacks: list[torch.Tensor] | None = None  # data, scales[, mins, super scales, super mins] `[E, ...]`
    for start in range(0, experts, chunk):
        count = min(chunk, experts - start)
        if exact:
            parts = rows_from.exact(tensor, start * rows, count * rows)
            codes, *per_group = (part.reshape(count, rows, -1) for part in parts)
            data = pack_int4_tiles(codes) if mode == "int4" else codes
            # [count, N, K / g] -> group-major [count, K / g, N], as quant_formats stores every scale
            pieces = [data.to(device), *(t.transpose(-1, -2).contiguous().to(device) for t in per_group)]
        else:
            values = rows_from.values(tensor, start * rows, count * rows).reshape(count, rows, columns)
            pieces = list(quantize(values.to(device), mode, group))
        if stacks is None:
            stacks = [torch.empty((experts, *piece.shape[1:]), dtype=piece.dtype, device=device) for piece in pieces]
        for stack, piece in zip(stacks, pieces, strict=True):
            stack[start : start + count] = piece
    if len(tensor.shape) == 2:
        stacks = [stack[0] for stack in stacks]
    for part, stack in zip(("data", "scales", "mins", "super_scales", "super_mins"), stacks, strict=False):
        setattr(module, f"{which}_{part}", stack)
    module._is_hf_initialized = True  # initialize_weights must leave packed modules alone


def _exact_rows(tensor: GgufTensor, first: int, count: int) -> tuple[torch.Tensor, ...]:
    """Rows [first, first + count) in the tensor's exact form: (codes, scales[, mins, super scales, super mins]),
    each `[count, ...]`."""
    if _exact_forms()[tensor.qtype].mode == "int4":
        return exact_int4_affine(tensor, first, count)
    return exact_int8(tensor, first, count)


def exact_int4_affine(tensor: GgufTensor, first: int, count: int) -> tuple[torch.Tensor, ...]:
    """Rows [first, first + count) of a Q4_K tensor as affine int4 with two-level scales, every field as the
    blocks hold it: codes uint8 `[count, K]` (0..15), sub-scales sc and sub-mins m uint8 `[count, K // 32]`,
    super scales d and super mins -dmin fp16 `[count, K // 256]`. sc * d * code + m * -dmin in fp32 is gguf's
    own dequantized weight (d * sc * q - dmin * m): the same exact products, the same one rounding."""
    from gguf.quants import Q4_K

    blocks = read_blocks(tensor, first, count).reshape(-1, 144)  # [n, 144]: d, dmin, 12 bytes of sc/m, 128 of codes
    d = blocks[:, 0:2].copy().view(np.float16)  # [n, 1]
    dmin = blocks[:, 2:4].copy().view(np.float16)
    sub_scales, sub_mins = Q4_K.get_scale_min(blocks[:, 4:16].copy())  # [n, 8] each, 6-bit
    # 4 chunks of 64 inputs per block: 32 bytes whose low nibbles are inputs 0..31, high nibbles 32..63
    codes = (blocks[:, 16:].reshape(-1, 4, 1, 32) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)) & 0xF
    fields = (codes, sub_scales.astype(np.uint8), sub_mins.astype(np.uint8), d, -dmin)  # fp16 negation is exact
    return tuple(torch.from_numpy(np.ascontiguousarray(field).reshape(count, -1)) for field in fields)


def exact_int8(tensor: GgufTensor, first: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows [first, first + count) of a Q8_0 / Q5_0 / Q6_K tensor as int8 values and their block scales
    (`[count, K]`, `[count, K // block]`): the values gguf's dequantizer gives, divided by the block's own
    scale read from the block (Q8_0/Q5_0: its fp16 d; Q6_K: d x its int8 sub-scale), so value x scale is the
    file's weight exactly. Scales in fp16 (Q8_0, Q5_0) or float32 (Q6_K), which the kernels read as bf16."""
    import gguf

    form = _exact_forms()[tensor.qtype]
    block_bytes, group, scale_bytes = form.block_bytes, form.group, form.scale_bytes
    raw = read_blocks(tensor, first, count)
    blocks = raw.reshape(-1, block_bytes)
    if tensor.qtype == int(gguf.GGMLQuantizationType.Q6_K):
        d = blocks[:, 208:210].copy().view(np.float16).astype(np.float32)  # [n, 1]
        sub = blocks[:, 192:208].copy().view(np.int8).astype(np.float32)  # [n, 16]
        scale = (d * sub).reshape(count, -1)  # one per 16 inputs
    else:
        scale = blocks[:, 0:2].copy().view(np.float16).reshape(count, -1)
    from gguf.quants import dequantize as gguf_dequantize

    values = np.asarray(gguf_dequantize(raw, tensor.qtype), dtype=np.float32).reshape(count, -1, group)
    wide = scale.astype(np.float32)[..., None]
    with np.errstate(divide="ignore", invalid="ignore"):
        codes = np.where(wide != 0, np.rint(values / wide), 0.0)
    data = torch.from_numpy(codes.reshape(count, -1).astype(np.int8))
    scales = torch.from_numpy(scale.astype(np.float16 if scale_bytes == 2 else np.float32))
    return data, scales


def _dense(tensor: GgufTensor, dtype: torch.dtype, target: tuple[int, ...], rows_from: RowSource) -> torch.Tensor:
    """A float tensor of the checkpoint in `dtype` on the host, read in row chunks; rows the converter cut
    (token_embd beyond the tokenizer's vocabulary) are zero."""
    rows = _numel(tensor.shape[:-1]) if len(tensor.shape) > 1 else 1
    columns = tensor.shape[-1]
    out = torch.zeros(target, dtype=dtype if _is_float(dtype) else torch.float32)
    flat = out.view(-1, columns) if len(target) > 1 else out.view(1, -1)
    chunk = max(1, DENSE_CHUNK_BYTES // (columns * 4))
    for start in range(0, rows, chunk):
        count = min(chunk, rows - start)
        flat[start : start + count] = rows_from.values(tensor, start, count)
    return out


def _target_shape(skeleton: nn.Module, name: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The skeleton's shape for `name` (the embedding may have more rows than the GGUF kept)."""
    module_name, _, attr = name.rpartition(".")
    try:
        module = skeleton.get_submodule(module_name) if module_name else skeleton
    except AttributeError:
        return shape
    tensor = module._parameters.get(attr) if attr in module._parameters else module._buffers.get(attr)
    if tensor is None:
        return shape
    want = tuple(tensor.shape)
    if _numel(want) == _numel(shape):
        return want
    if len(want) == len(shape) == 2 and want[1] == shape[1] and want[0] >= shape[0]:
        return want
    raise ModelLoadError(f"GGUF tensor for {name} has shape {shape}, the model needs {want}")


def _tie_modes(skeleton: nn.Module, modes: dict[str, str | None]) -> None:
    """Give every tied name of a module (encoder and decoder positions) the mode found for one of them."""
    from ..quantization import _quantizable_modules

    experts_groups, linear_groups = _quantizable_modules(skeleton)
    for group in [*experts_groups, *linear_groups]:
        names = [name for name, _ in group]
        known = next((modes[name] for name in names if name in modes), None)
        if any(name in modes for name in names):
            for name in names:
                modes[name] = known


def _is_float(dtype: torch.dtype) -> bool:
    return dtype.is_floating_point


# -- llama.cpp's type choice, for planning without the file and for writing test files ------


RECIPES = ("Q4_K_M", "Q8_0")


def recipe_types(recipe: str, shapes: dict[str, tuple[int, ...]]) -> dict[str, int]:
    """GGUF name -> the type `llama-quantize` gives it in `recipe`, for this architecture's tensors
    (llama.cpp src/llama-quant.cpp, read 2026-12: Q4_K_M puts Q6_K on the token embedding and on
    `use_more_bits` layers' attn_v and ffn_down, Q4_K elsewhere; a row length that 256 does not
    divide falls back Q4_K -> Q5_0, Q6_K -> Q8_0; norms, 1-D tensors and the router stay F32)."""
    import gguf

    kinds = gguf.GGMLQuantizationType
    assert recipe in RECIPES, f"recipe must be one of {RECIPES}"
    default = kinds.Q4_K if recipe == "Q4_K_M" else kinds.Q8_0
    attn_v = sorted((n for n in shapes if n.endswith("attn_v.weight")), key=_block_of)
    ffn_down = [n for n in shapes if "ffn_down" in n and n.endswith(".weight")]
    types: dict[str, int] = {}
    for name, shape in shapes.items():
        if len(shape) < 2 or name.endswith("_norm.weight") or "ffn_gate_inp" in name or not name.endswith(".weight"):
            types[name] = kinds.F32
            continue
        kind = default
        if recipe == "Q4_K_M":
            if name == "token_embd.weight":
                kind = kinds.Q6_K
            elif name in attn_v and _more_bits(attn_v.index(name), len(attn_v)):
                kind = kinds.Q6_K
            elif name in ffn_down and _more_bits(_block_of(name), len(ffn_down)):
                kind = kinds.Q6_K
        block = gguf.GGML_QUANT_SIZES[kind][0]
        if shape[-1] % block:
            kind = {kinds.Q4_K: kinds.Q5_0, kinds.Q6_K: kinds.Q8_0}.get(kind, kind)
        types[name] = int(kind)
    return types


def _more_bits(index: int, count: int) -> bool:
    return index < count // 8 or index >= 7 * count // 8 or (index - count // 8) % 3 == 2


def _block_of(name: str) -> int:
    match = re.match(r"blk\.(\d+)\.", name)
    return int(match[1]) if match else -1


def empty_rows() -> RowSource:
    """`stream_load`'s rows as `torch.empty` tensors of the shapes and dtypes a file's blocks give: with
    `architecture_tensors` and under a FakeTensorMode, a load of a GGUF that does not exist (the virtual-GPU dry
    run, bench/dryrun.py) placed by this module's own code."""

    def exact(tensor: GgufTensor, first: int, count: int) -> tuple[torch.Tensor, ...]:
        form = _exact_forms()[tensor.qtype]
        return tuple(torch.empty(shape, dtype=dtype) for shape, dtype in form.fields(count, tensor.shape[-1]))

    def values(tensor: GgufTensor, first: int, count: int) -> torch.Tensor:
        return torch.empty((count, tensor.shape[-1]), dtype=torch.float32)

    return RowSource(exact=exact, values=values)


def architecture_tensors(skeleton: nn.Module, n_blocks: int, recipe: str) -> tuple[list[GgufTensor], dict[str, str]]:
    """The tensors a `recipe` GGUF of `skeleton`'s architecture holds (no file: offsets 0), and their names."""
    import gguf

    names = checkpoint_names(skeleton, n_blocks)
    state = skeleton.state_dict(keep_vars=True)
    shapes = {name: tuple(state[key].shape) for name, key in names.items()}
    types = recipe_types(recipe, shapes)
    tensors = []
    for name, shape in shapes.items():
        block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(types[name])]
        tensors.append(GgufTensor(Path(), name, types[name], shape, 0, _numel(shape) // block * size))
    return tensors, names
