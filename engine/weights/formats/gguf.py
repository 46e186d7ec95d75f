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

Repack. Each tensor's blocks are dequantized to fp32 by gguf's own `gguf.quants.dequantize`
(bit-exact with ggml), a few experts at a time, then packed by `quant_formats.quantize`:
- a 4-bit type (Q4_K, Q4_0, IQ4_*, ...) -> int4, groups of 32 (Q4_K's sub-block);
- Q8_0, Q5_0, Q6_K -> int8 with the file's own values and block scales (`exact_int8`: fp16 scales
  per 32 for Q8_0/Q5_0, float32 per 16 for Q6_K, which the kernels read as they read bf16): nothing
  is lost; Q5_K -> int8 in groups of 32 through `quantize` (its values fit; the scale is re-rounded);
- F32/F16/BF16 -> kept in full precision (or packed like the bf16 loader when asked).
One expert module holds one mode, so a module takes its gate_up's (2/3 of its bytes): in Q4_K_M
llama.cpp writes `ffn_down_exps` as Q5_0 or Q8_0 (704 columns do not tile Q4_K's 256), and those
are packed to int4 with gate_up. What that loses, against the GGUF's own dequantized weights, is
measured by `dgemma-lsp bench formats` (RESULTS); what would make it lossless is written there
and in docs/configuration.md. The packed result is saved like `--quantization`'s cache, so only
the first start dequantizes.

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
from ...kernels.quant_formats import effective_group_size, quantize
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
    """(mode, group) a GGUF type packs into losing the least: None for float types (kept as they are)."""
    import gguf

    kind = gguf.GGMLQuantizationType(qtype)
    if kind in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16, gguf.GGMLQuantizationType.BF16):
        return None, 0
    block, size = gguf.GGML_QUANT_SIZES[kind]
    bits = size * 8 / block
    if bits <= 4.5:  # 4-bit values (+ scales): int4 in Q4_K's sub-block of 32
        return "int4", 32
    return "int8", 16 if kind == gguf.GGMLQuantizationType.Q6_K else 32


@dataclass(frozen=True)
class Plan:
    """How each checkpoint tensor lands: packed (mode, group) or kept; and the load's label."""

    modes: dict[str, str | None]
    """Module name (each tied name) -> packed mode; None: full precision."""
    groups: dict[str, tuple[str, int]]
    """Checkpoint key of a packed tensor -> (mode, group)."""
    mode: str
    """The mode most of the expert bytes are in ("none" when they stay float)."""
    exact: frozenset[str] = frozenset()
    """Keys placed as int8 with the file's own values and block scales (Q8_0, Q5_0, Q6_K): nothing lost."""

    def mode_of(self, names: tuple[str, ...]) -> str | None:
        return next((self.modes[name] for name in names if name in self.modes), None)


def plan(tensors: list[GgufTensor], names: dict[str, str], skeleton: nn.Module, quantization: str) -> Plan:
    """Per-module modes for these tensors; `quantization` (the flag) applies only to float tensors."""
    targets = _quantized_targets(skeleton)
    by_key = {names[t.name]: t for t in tensors if t.name in names}
    modes: dict[str, str | None] = {}
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
    for key in targets:
        module_name = key.rsplit(".", 1)[0]
        mode = modes.get(module_name)
        tensor = by_key.get(key)
        if mode is None or tensor is None:
            continue
        own_mode, own_group = packed_mode_of(tensor.qtype)
        group = own_group if own_mode == mode else 32 if own_mode is not None else 128
        groups[key] = (mode, effective_group_size(tensor.shape[-1], group))
        if mode == "int8" and tensor.qtype in _exact_types():
            exact.add(key)
    _tie_modes(skeleton, modes)
    label = max(expert_bytes, key=expert_bytes.get) if expert_bytes else "none"
    return Plan(modes, groups, label, frozenset(exact))


def planned_bytes(tensors: list[GgufTensor], names: dict[str, str], the_plan: Plan, dtype: torch.dtype) -> int:
    """Resident bytes after the load: packed tensors in their mode, the rest in `dtype`, each tied tensor once."""
    size = torch.tensor([], dtype=dtype).element_size()
    total = 0
    for tensor in tensors:
        key = names.get(tensor.name)
        if key is None:
            continue
        if key in the_plan.exact:
            _, group, scale_bytes = _exact_layout(tensor.qtype)
            total += _numel(tensor.shape) * (1 + scale_bytes / group)
        elif key in the_plan.groups:
            mode, group = the_plan.groups[key]
            total += _packed_bytes(tensor.shape, mode, group)
        else:
            total += _numel(tensor.shape) * size
    return total


def stream_load(skeleton: nn.Module, found_files: tuple[Path, ...], tensors: list[GgufTensor], names: dict[str, str],
                the_plan: Plan, *, device: str, dtype: torch.dtype, source: str,
                progress: Callable[[int, int], None] | None = None):
    """Fill `skeleton` from the GGUF, each tensor dequantized and packed per `the_plan`; returns the report."""
    filler = SkeletonFiller(skeleton, device=device, mode=the_plan.mode, group_size=32, mode_of=the_plan.mode_of)
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
                    _pack(module, which, tensor, mode, group, device, exact=key in the_plan.exact)
                else:
                    target = _target_shape(skeleton, name, tensor.shape)
                    filler.put(key, lambda tensor=tensor, target=target: _dense(tensor, dtype, target))
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


def _pack(module: nn.Module, which: str, tensor: GgufTensor, mode: str, group: int, device: str,
          exact: bool = False) -> None:
    """Dequantize and pack `tensor` into `module`'s `{which}_data`/`_scales`, a chunk of experts at a time;
    `exact`: as int8 holding the file's own values and block scales (exact_int8)."""
    shape = tensor.shape if len(tensor.shape) == 3 else (1, *tensor.shape)
    experts, rows, columns = shape
    budget = PACK_CHUNK_BYTES if str(device).startswith("cuda") else HOST_CHUNK_BYTES
    chunk = max(1, budget // (rows * columns * 4))
    data = scales = None
    for start in range(0, experts, chunk):
        count = min(chunk, experts - start)
        if exact:
            chunk_data, chunk_scales = exact_int8(tensor, start * rows, count * rows)
            chunk_data = chunk_data.reshape(count, rows, columns).to(device)
            chunk_scales = chunk_scales.reshape(count, rows, -1).transpose(-1, -2).contiguous().to(device)
        else:
            values = torch.from_numpy(dequantize_rows(tensor, start * rows, count * rows)).reshape(
                count, rows, columns)
            chunk_data, chunk_scales = quantize(values.to(device), mode, group)
        if data is None:
            data = torch.empty((experts, *chunk_data.shape[1:]), dtype=chunk_data.dtype, device=device)
            scales = torch.empty((experts, *chunk_scales.shape[1:]), dtype=chunk_scales.dtype, device=device)
        data[start : start + count], scales[start : start + count] = chunk_data, chunk_scales
    if len(tensor.shape) == 2:
        data, scales = data[0], scales[0]
    setattr(module, f"{which}_data", data)
    setattr(module, f"{which}_scales", scales)
    module._is_hf_initialized = True  # initialize_weights must leave packed modules alone


def _exact_types() -> dict[int, tuple[int, int, int]]:
    """GGUF types whose values fit int8 with a scale per block: type -> (block bytes, inputs per scale, scale
    bytes as stored here). Q8_0 and Q5_0 keep their fp16 block scale as it is (fp16: exact); Q6_K's scale is
    fp16 d times an int8 sub-scale, up to 19 bits, so float32."""
    import gguf

    kinds = gguf.GGMLQuantizationType
    return {int(kinds.Q8_0): (34, 32, 2), int(kinds.Q5_0): (22, 32, 2), int(kinds.Q6_K): (210, 16, 4)}


def _exact_layout(qtype: int) -> tuple[int, int, int]:
    return _exact_types()[qtype]


def exact_int8(tensor: GgufTensor, first: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows [first, first + count) of a Q8_0 / Q5_0 / Q6_K tensor as int8 values and their block scales
    (`[count, K]`, `[count, K // block]`): the values gguf's dequantizer gives, divided by the block's own
    scale read from the block (Q8_0/Q5_0: its fp16 d; Q6_K: d x its int8 sub-scale), so value x scale is the
    file's weight exactly. Scales in fp16 (Q8_0, Q5_0) or float32 (Q6_K), which the kernels read as bf16."""
    import gguf

    block_bytes, group, scale_bytes = _exact_layout(tensor.qtype)
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


def _dense(tensor: GgufTensor, dtype: torch.dtype, target: tuple[int, ...]) -> torch.Tensor:
    """A float tensor of the checkpoint in `dtype` on the host, read in row chunks; rows the converter cut
    (token_embd beyond the tokenizer's vocabulary) are zero."""
    rows = _numel(tensor.shape[:-1]) if len(tensor.shape) > 1 else 1
    columns = tensor.shape[-1]
    out = torch.zeros(target, dtype=dtype if _is_float(dtype) else torch.float32)
    flat = out.view(-1, columns) if len(target) > 1 else out.view(1, -1)
    chunk = max(1, DENSE_CHUNK_BYTES // (columns * 4))
    for start in range(0, rows, chunk):
        count = min(chunk, rows - start)
        flat[start : start + count] = torch.from_numpy(dequantize_rows(tensor, start, count))
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
