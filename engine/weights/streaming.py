"""Streaming, quantizing load of a DiffusionGemma checkpoint: one safetensors shard at a time.

Owns: listing a checkpoint's shards and reading their headers (shapes and
dtypes, no data), mapping checkpoint keys to module names the way
`from_pretrained` does, and filling a meta-device skeleton shard by shard —
each expert/linear tensor packed the moment it is read and placed on the target
device, every other tensor cast and placed as it arrives. Host memory holds one
shard's mapping and one tensor's temporaries at a time, never the whole
full-precision checkpoint. Knows safetensors, torch and transformers' loading
helpers; knows nothing of prompts, LSP, or where checkpoints live.

Why not `from_pretrained(quantization_config=...)`: no transformers quantizer
packs the fused 3-D expert tensors into our formats (see quantization.py), and a
custom `HfQuantizer` would tie this code to transformers' private loading loop.
So this reuses the public pieces instead: the model's own conversion mapping
(key renames, `get_model_conversion_mapping` + `rename_source_key`), its tie
structure (a meta skeleton already shares tied Parameters), and its own
`initialize_weights` for what the checkpoint does not hold (rotary tables and
other non-persistent buffers), exactly as `from_pretrained` does.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from ..errors import ModelLoadError
from ..kernels.quant_formats import PACKED_MODES, effective_group_size, quantize
from .quantization import (
    DEFAULT_GROUP_SIZE,
    QuantizationReport,
    QuantizedExperts,
    QuantizedLinear,
    _quantizable_modules,
    _replace_module,
    _report_from_loaded,
    all_tensors,
)
from .text_model import is_vision_key

log = logging.getLogger(__name__)

ProgressFn = Callable[[int, int], None]
"""Called with (shards done, shards in all) after each shard."""
ModeOf = Callable[[tuple[str, ...]], str | None]
"""The packed mode for one tied group of modules (all its names), None to keep it in full precision."""

PACK_CHUNK_BYTES = 128 * 1024**2
"""fp32 bytes of the experts packed per quantize call while loading onto a GPU (inside memory_plan's working margin)."""
HOST_PACK_CHUNK_BYTES = 0
"""The same on a CPU device, where the temporaries share host memory with the load: 0, one expert per call."""
INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
DTYPE_BYTES = {"F64": 8, "F32": 4, "BF16": 2, "F16": 2, "F8_E4M3": 1, "F8_E5M2": 1,
               "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}


@dataclass(frozen=True)
class TensorInfo:
    """One checkpoint tensor, from its shard's header."""

    file: Path
    key: str
    """Name in the checkpoint."""
    shape: tuple[int, ...]
    dtype: str
    """safetensors dtype name (BF16, F32, ...)."""

    @property
    def bytes(self) -> int:
        return _numel(self.shape) * DTYPE_BYTES.get(self.dtype, 4)


def checkpoint_files(folder: Path) -> list[Path]:
    """The checkpoint's safetensors shards, in index order."""
    folder = Path(folder)
    index = folder / INDEX_FILE
    if index.is_file():
        weight_map = json.loads(index.read_text("utf-8"))["weight_map"]
        names = sorted(set(weight_map.values()))
        missing = [name for name in names if not (folder / name).is_file()]
        if missing:
            raise ModelLoadError(f"model folder '{folder}' is incomplete: {', '.join(missing[:3])} missing")
        return [folder / name for name in names]
    if (folder / SINGLE_FILE).is_file():
        return [folder / SINGLE_FILE]
    raise ModelLoadError(f"model folder '{folder}' has no safetensors weights ({SINGLE_FILE} or {INDEX_FILE})")


def read_headers(files: list[Path]) -> list[TensorInfo]:
    """Every tensor's name, shape and dtype; reads only the shards' headers."""
    from safetensors import safe_open

    infos = []
    for file in files:
        with safe_open(str(file), framework="pt") as shard:
            for key in shard.keys():
                piece = shard.get_slice(key)
                infos.append(TensorInfo(file, key, tuple(piece.get_shape()), piece.get_dtype()))
    return infos


class KeyMapper:
    """Checkpoint key -> the skeleton's name, as `from_pretrained` maps it for this model class."""

    def __init__(self, model: nn.Module) -> None:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightConverter, WeightRenaming

        transforms = get_model_conversion_mapping(model)
        self._renamings = [t for t in transforms if isinstance(t, WeightRenaming)]
        self._converters = [t for t in transforms if isinstance(t, WeightConverter)]
        self._prefix = getattr(model, "base_model_prefix", None)
        self._known = {name: True for name, _, _ in all_tensors(model)}

    def __call__(self, key: str) -> str:
        from transformers.core_model_loading import rename_source_key

        name, converter = rename_source_key(key, self._renamings, self._converters, self._prefix, self._known)
        if converter is not None:
            # A converter merges or splits tensors across keys: it cannot run one tensor at a time.
            raise ModelLoadError(
                f"checkpoint key '{key}' needs transformers' '{converter}' conversion, which the streaming "
                "loader does not do; load it with --quantization none"
            )
        return name


def planned_bytes(infos: list[TensorInfo], skeleton: nn.Module, mode: str, dtype: torch.dtype,
                  group_size: int = DEFAULT_GROUP_SIZE) -> int:
    """Resident bytes after loading `infos` into `skeleton` in `mode`: each tied tensor once, no vision."""
    mapper = KeyMapper(skeleton)
    targets = _quantized_targets(skeleton) if mode in PACKED_MODES else {}
    size = torch.tensor([], dtype=dtype).element_size()
    total = 0
    for info in infos:
        name = mapper(info.key)
        if is_vision_key(name):
            continue
        if name in targets:
            total += _packed_bytes(info.shape, mode, group_size)
        elif info.dtype in ("F64", "F32", "BF16", "F16"):
            total += _numel(info.shape) * size
        else:
            total += info.bytes
    return total


def stream_load(skeleton: nn.Module, folder: Path, *, device: str, dtype: torch.dtype, mode: str,
                group_size: int = DEFAULT_GROUP_SIZE, progress: ProgressFn | None = None) -> QuantizationReport:
    """Fill `skeleton` (built on the meta device, tied like after `from_pretrained`) from `folder`, packing
    the experts and text linears in `mode` as they are read; returns what was packed.

    Raises ModelLoadError when the checkpoint lacks a weight the skeleton needs.
    """
    from safetensors import safe_open

    assert mode in PACKED_MODES, f"stream_load packs weights; got mode {mode!r}"
    filler = SkeletonFiller(skeleton, device=device, mode=mode, group_size=group_size)
    files = checkpoint_files(folder)
    if progress is not None:
        progress(0, len(files))
    with torch.no_grad():
        for done, file in enumerate(files, start=1):
            # One shard mapped at a time: its pages leave the process when the handle closes.
            with safe_open(str(file), framework="pt", device="cpu") as shard:
                for key in shard.keys():
                    filler.put(key, lambda key=key: shard.get_tensor(key))
            if progress is not None:
                progress(done, len(files))
    return filler.finish(f"model folder '{folder}'")


class SkeletonFiller:
    """Places checkpoint tensors, one at a time and by checkpoint key, into a meta-device skeleton:
    experts and text linears packed in `mode` ("none": none packed), everything else cast and placed.

    `stream_load` feeds it from safetensors shards; the virtual-GPU dry run (bench/dryrun.py) feeds
    it fake tensors of the checkpoint's shapes, so both run this same placement code.
    """

    def __init__(self, skeleton: nn.Module, *, device: str, mode: str, group_size: int = DEFAULT_GROUP_SIZE,
                 mode_of: ModeOf | None = None, down_mode_of: ModeOf | None = None) -> None:
        self.skeleton = skeleton
        self.device = device
        self.mode = mode
        self.group_size = group_size
        self.mapper = KeyMapper(skeleton)
        if mode_of is not None:  # a pre-quantized checkpoint (formats/): each module in the mode its tensors fit
            self.targets = _quantized_targets(skeleton, replace_with_mode=mode_of, down_mode_of=down_mode_of)
        else:
            self.targets = _quantized_targets(skeleton, replace_with_mode=mode) if mode in PACKED_MODES else {}
        self.parameters = _tied_names(skeleton)
        self.unexpected: list[str] = []

    def put(self, key: str, read: Callable[[], torch.Tensor]) -> None:
        """Place the checkpoint tensor `key`; `read()` gives it (in host memory), called only when it is used."""
        name = self.mapper(key)
        if is_vision_key(name):
            return  # never read
        with torch.no_grad():
            if name in self.targets:
                module, which = self.targets[name]
                _pack_into(module, which, read(), self.mode, self.group_size, self.device)
            elif name in self.parameters:
                _assign_parameter(self.skeleton, self.parameters[name], read(), self.device)
            elif _is_buffer(self.skeleton, name):
                _assign_buffer(self.skeleton, name, read(), self.device)
            else:
                self.unexpected.append(key)

    def finish(self, source: str) -> QuantizationReport:
        """Check every weight arrived (ModelLoadError naming `source` if not), build the buffers no
        checkpoint holds, and report what was packed."""
        if self.unexpected:
            log.warning("checkpoint keys the model does not use: %s", ", ".join(self.unexpected[:5]))
        _check_complete(self.skeleton, source)
        _initialize_the_rest(self.skeleton, self.device)
        self.skeleton._dgemma_quantization = (self.mode, self.group_size)  # read by save_quantized
        return _report_from_loaded(self.skeleton, self.mode, self.group_size)


# -- pieces -------------------------------------------------------------------------------


def _quantized_targets(model: nn.Module, replace_with_mode: str | ModeOf | None = None,
                       down_mode_of: ModeOf | None = None) -> dict[str, tuple[nn.Module, str]]:
    """Checkpoint names of the tensors to pack -> (their packed module, "gate_up" | "down" | "weight").

    With `replace_with_mode`, every expert/linear module (each tied position) is
    swapped for one empty packed module per tied group, filled as tensors arrive.
    A `ModeOf` picks the mode per tied group; a group it answers None for stays
    as it is (full precision) and is no target. `down_mode_of` picks an experts
    group's down projection's mode where it differs (None: the group's mode).
    """
    experts_groups, linear_groups = _quantizable_modules(model)
    targets: dict[str, tuple[nn.Module, str]] = {}

    def mode_for(modules) -> str | None:
        if callable(replace_with_mode):
            return replace_with_mode(tuple(name for name, _ in modules))
        return replace_with_mode

    for modules in experts_groups:
        original = modules[0][1]
        mode = mode_for(modules)
        if replace_with_mode is not None and mode is None:
            continue
        down_mode = down_mode_of(tuple(name for name, _ in modules)) if down_mode_of and mode else None
        packed = (QuantizedExperts(mode=mode, num_experts=original.num_experts, act_fn=original.act_fn,
                                   down_mode=down_mode) if mode else original)
        for name, _ in modules:
            targets[f"{name}.gate_up_proj"] = (packed, "gate_up")
            targets[f"{name}.down_proj"] = (packed, "down")
            if mode:
                _replace_module(model, name, packed)
    for modules in linear_groups:
        original = modules[0][1]
        assert original.bias is None, "the DiffusionGemma text linears have no bias; a biased one would lose it"
        mode = mode_for(modules)
        if replace_with_mode is not None and mode is None:
            continue
        packed = (QuantizedLinear(mode=mode, in_features=original.in_features,
                                  out_features=original.out_features) if mode else original)
        for name, _ in modules:
            targets[f"{name}.weight"] = (packed, "weight")
            if mode:
                _replace_module(model, name, packed)
    return targets


def _pack_into(module: nn.Module, which: str, weight: torch.Tensor, mode: str, group_size: int,
               device: str) -> None:
    """Pack `weight` (host memory) on `device` into `module`'s `{which}_data` / `{which}_scales` buffers."""
    if weight.dim() == 2:
        data, scales = quantize(weight.to(device), mode, group_size)
    else:
        # [E, N, K] a few experts at a time: the fp32 temporaries stay about the chunk's bytes
        # (the full model's gate_up is 16 MB per expert in fp32), and the packed stack is written
        # in place rather than stacked (no second copy). One expert per call was 7,680 small
        # quantize calls per load on a GPU; each expert packs the same either way (groups are per row).
        budget = PACK_CHUNK_BYTES if str(device).startswith("cuda") else HOST_PACK_CHUNK_BYTES
        chunk = max(1, budget // (weight[0].numel() * 4))
        data = scales = None
        for start in range(0, weight.shape[0], chunk):
            chunk_data, chunk_scales = quantize(weight[start : start + chunk].to(device), mode, group_size)
            if data is None:
                data = torch.empty((weight.shape[0], *chunk_data.shape[1:]), dtype=chunk_data.dtype, device=device)
                scales = torch.empty((weight.shape[0], *chunk_scales.shape[1:]), dtype=chunk_scales.dtype,
                                     device=device)
            data[start : start + chunk], scales[start : start + chunk] = chunk_data, chunk_scales
    setattr(module, f"{which}_data", data)
    setattr(module, f"{which}_scales", scales)
    module._is_hf_initialized = True  # initialize_weights must leave packed modules alone


def _tied_names(model: nn.Module) -> dict[str, list[str]]:
    """Every parameter name -> all the names that share its Parameter (tied positions)."""
    by_tensor: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        by_tensor.setdefault(id(param), []).append(name)
    return {name: names for names in by_tensor.values() for name in names}


def _assign_parameter(model: nn.Module, names: list[str], value: torch.Tensor, device: str) -> None:
    old = model.get_parameter(names[0])
    parameter = nn.Parameter(_owned(value, old.dtype, device), requires_grad=False)
    parameter._is_hf_initialized = True
    for name in names:
        module_name, _, attr = name.rpartition(".")
        (model.get_submodule(module_name) if module_name else model)._parameters[attr] = parameter


def _is_buffer(model: nn.Module, name: str) -> bool:
    module_name, _, attr = name.rpartition(".")
    try:
        module = model.get_submodule(module_name) if module_name else model
    except AttributeError:
        return False
    return attr in module._buffers


def _assign_buffer(model: nn.Module, name: str, value: torch.Tensor, device: str) -> None:
    module_name, _, attr = name.rpartition(".")
    module = model.get_submodule(module_name) if module_name else model
    buffer = _owned(value, module._buffers[attr].dtype, device)
    buffer._is_hf_initialized = True
    module._buffers[attr] = buffer


def _owned(value: torch.Tensor, dtype: torch.dtype, device: str) -> torch.Tensor:
    """`value` cast and placed, always in memory of its own: a tensor still backed by the shard's
    mapping would keep the whole shard (every page read so far) resident after it closes."""
    dtype = dtype if value.is_floating_point() and dtype.is_floating_point else value.dtype
    return value.to(device=device, dtype=dtype, copy=True)


def _check_complete(model: nn.Module, source: str) -> None:
    missing = [name for name, param in model.named_parameters() if param.device.type == "meta"]
    missing += [name for module in model.modules() if isinstance(module, QuantizedExperts | QuantizedLinear)
                for name, buffer in module.named_buffers() if buffer.numel() == 0]
    if missing:
        raise ModelLoadError(
            f"{source} lacks {len(missing)} weights the model needs, e.g. {', '.join(missing[:3])}"
        )


def _initialize_the_rest(model: nn.Module, device: str) -> None:
    """Non-persistent buffers (rotary tables, embedding scales) were never in the checkpoint: build them
    on `device` and let the model's own `initialize_weights` fill them, as `from_pretrained` does."""
    for module in model.modules():
        for attr, buffer in list(module._buffers.items()):
            if buffer is not None and buffer.device.type == "meta":
                module._buffers[attr] = torch.empty_like(buffer, device=device)
    # The init functions skip every tensor flagged `_is_hf_initialized` (all loaded ones), so
    # this fills only the fresh buffers.
    model.initialize_weights()
    leftovers = [name for name, tensor, _ in all_tensors(model) if tensor.device.type == "meta"]
    assert not leftovers, f"still on the meta device after loading: {leftovers[:5]}"


def _packed_bytes(shape: tuple[int, ...], mode: str, group_size: int) -> int:
    numel = _numel(shape)
    data = numel // 2 if mode == "int4" else numel
    scales = numel // effective_group_size(shape[-1], group_size) * 2  # bf16 scales
    return data + scales


def _numel(shape: tuple[int, ...]) -> int:
    count = 1
    for dim in shape:
        count *= dim
    return count
