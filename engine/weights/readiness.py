"""What this machine can run: its GPUs, each quantization's planned size against free memory, the checkpoint.

The facts `dgemma-lsp doctor` reports, gathered without loading a weight: CUDA
devices and their free memory (torch), the checkpoint's place in the Hugging
Face cache (never downloading), and the resident bytes each `--quantization`
would need — from the checkpoint's own shard headers when it is here
(streaming.planned_bytes, the rule loading applies), else from the
architecture's config (the skeleton built on the meta device, its parameters
sized the same way) — judged by memory_plan.FitPlan, the rule a load enforces.
Knows torch and transformers (lazily); knows nothing of LSP, editors or how the
answer is printed.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import EngineError
from .memory_plan import FitPlan, available_host_bytes, free_device_bytes


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    total_bytes: int
    free_bytes: int


@dataclass(frozen=True)
class SizePlan:
    """Planned resident bytes per mode on one device, and whether each fits there now."""

    device: str
    dtype: str
    source: str
    """Where the sizes come from: "checkpoint headers" or "architecture config <file>"."""
    resident_bytes: dict[str, int]
    device_free_bytes: int
    host_free_bytes: int
    host_pass_bytes: int
    """The largest shard the first start reads through host memory (0: not known without the checkpoint)."""
    fits: dict[str, bool] = field(default_factory=dict)
    margin_bytes: int = 0
    """Working memory the fit rule keeps free beyond the weights on this device (memory_plan)."""
    format: str = "safetensors"
    """What the checkpoint is (formats/detect.py's label): "GGUF Q4_K_M", ..."""
    native_mode: str | None = None
    """The mode a pre-quantized checkpoint loads in (what `--quantization none` means for it); None: any."""


def cuda_devices() -> list[Gpu]:
    """Every CUDA device torch sees, with its free memory now; [] without CUDA."""
    import torch

    if not torch.cuda.is_available():
        return []
    found = []
    for index in range(torch.cuda.device_count()):
        free, total = torch.cuda.mem_get_info(index)
        found.append(Gpu(index, torch.cuda.get_device_name(index), int(total), int(free)))
    return found


def checkpoint_folder(model: str) -> Path | None:
    """The model's local folder (built-in tiny, a folder, or the HF cache), None when not here; never downloads."""
    from ..errors import ModelNotFoundError
    from ..model.folders import resolve_model_folder

    try:
        folder = resolve_model_folder(model, allow_download=False)
    except ModelNotFoundError:
        return None
    if (folder / "config.json").is_file():
        return folder
    if any(folder.rglob("*.gguf")):  # a GGUF borrows its config (folders.companion_folder)
        from .loading import find_checkpoint

        try:
            find_checkpoint(model, folder)  # the variant asked for is here
        except ModelNotFoundError:
            return None
        return folder
    return None


def size_plan(folder: Path | None, architecture: Path | None, device: str | None, dtype: str | None,
              model: str = "") -> SizePlan | None:
    """Each mode's planned size on the device the engine would pick, from the checkpoint or else the
    architecture config; None when neither is at hand."""
    from .loading import pick_device_and_dtype

    device, dtype = pick_device_and_dtype(device, dtype)
    found = None
    if folder is not None:
        found = _found(folder, model)
    if found is not None and found.prequantized:
        return _prequantized_plan(found, folder, device, dtype)
    if folder is not None:
        resident, host_pass, source = _from_checkpoint(folder, dtype)
    elif architecture is not None:
        resident, host_pass, source = _from_architecture(architecture, dtype), 0, f"architecture config {architecture}"
    else:
        return None
    fit = FitPlan(mode="none", device=device, resident_bytes=resident, device_free_bytes=free_device_bytes(device),
                  host_free_bytes=available_host_bytes(), host_pass_bytes=host_pass)
    return SizePlan(device, dtype, source, resident, fit.device_free_bytes, fit.host_free_bytes, host_pass,
                    {mode: fit.fits(mode) for mode in resident}, fit.margin_bytes)


def _found(folder: Path, model: str):
    """The format in `folder` (formats/detect.py); an EngineError when the folder cannot be read."""
    from .loading import find_checkpoint

    try:
        return find_checkpoint(model or str(folder), folder)
    except EngineError:
        raise
    except Exception as error:  # noqa: BLE001 - a corrupt folder: say what it is, never a traceback
        raise EngineError(f"cannot read the checkpoint in {folder}: {type(error).__name__}: {error}") from None


def _prequantized_plan(found, folder: Path, device: str, dtype: str) -> SizePlan:
    """A GGUF / compressed-tensors / ModelOpt checkpoint: its one mode's size, from its headers."""
    import torch
    from transformers import AutoConfig

    from ..model.folders import companion_folder
    from . import formats

    config_folder = companion_folder(folder)
    if config_folder is None:
        raise EngineError(f"{found.label} in {folder}: no config.json here nor the base model's in the cache")
    if found.format == "mlx":
        raise EngineError(f"{found.label} in {folder}: MLX checkpoints run on Apple silicon only")
    config = AutoConfig.from_pretrained(config_folder, local_files_only=True)
    planned = formats.sizes(found, config, getattr(torch, dtype))
    resident = {planned.mode: planned.resident_bytes}
    fit = FitPlan(mode=planned.mode, device=device, resident_bytes=resident,
                  device_free_bytes=free_device_bytes(device), host_free_bytes=available_host_bytes(),
                  host_pass_bytes=planned.host_pass_bytes)
    return SizePlan(device, dtype, f"{found.label} headers", resident, fit.device_free_bytes, fit.host_free_bytes,
                    planned.host_pass_bytes, {planned.mode: fit.fits(planned.mode)}, fit.margin_bytes,
                    format=found.label, native_mode=planned.mode)


def _from_checkpoint(folder: Path, dtype: str) -> tuple[dict[str, int], int, str]:
    import torch
    from transformers import AutoConfig

    from .loading import _skeleton
    from .quantization import MODES
    from .streaming import checkpoint_files, planned_bytes, read_headers

    try:
        config = AutoConfig.from_pretrained(folder, local_files_only=True)
        files = checkpoint_files(folder)
        infos = read_headers(files)
    except EngineError:
        raise
    except Exception as error:  # noqa: BLE001 - a corrupt folder: say what it is, never a traceback
        raise EngineError(f"cannot read the checkpoint in {folder}: {type(error).__name__}: {error}") from None
    torch_dtype = getattr(torch, dtype)
    skeleton = _skeleton(config, torch_dtype)
    resident = {mode: planned_bytes(infos, skeleton, mode, torch_dtype) for mode in MODES}
    return resident, max((f.stat().st_size for f in files), default=0), "checkpoint headers"


def _from_architecture(path: Path, dtype: str) -> dict[str, int]:
    """Sizes from a config alone: the skeleton's parameters, each packed where loading would pack it."""
    import torch
    from transformers import DiffusionGemmaConfig

    from .loading import _skeleton
    from .quantization import MODES
    from .streaming import DEFAULT_GROUP_SIZE, PACKED_MODES, _packed_bytes, _quantized_targets, is_vision_key

    data = json.loads(path.read_text("utf-8"))
    for private in ("_provenance", "model_type"):
        data.pop(private, None)
    torch_dtype = getattr(torch, dtype)
    skeleton = _skeleton(DiffusionGemmaConfig(**data), torch_dtype)
    element = torch.tensor([], dtype=torch_dtype).element_size()
    parameters = [(name, tuple(p.shape)) for name, p in skeleton.named_parameters() if not is_vision_key(name)]
    resident = {}
    for mode in MODES:
        targets = _quantized_targets(skeleton) if mode in PACKED_MODES else {}
        resident[mode] = sum(
            _packed_bytes(shape, mode, DEFAULT_GROUP_SIZE) if name in targets else _numel(shape) * element
            for name, shape in parameters
        )
    return resident


def _numel(shape: tuple[int, ...]) -> int:
    count = 1
    for size in shape:
        count *= size
    return count


# -- the published checkpoints: what each holds resident, which one fits ---------------------


def _architecture_config(path: Path):
    """A DiffusionGemmaConfig from a written-out architecture (model/configs/)."""
    from transformers import DiffusionGemmaConfig

    data = json.loads(path.read_text("utf-8"))
    for private in ("_provenance", "model_type"):
        data.pop(private, None)
    return DiffusionGemmaConfig(**data)


@functools.cache
def catalog_sizes(architecture: Path, dtype: str) -> dict[str, int]:
    """Planned resident bytes of each published checkpoint (model/checkpoints.py) of `architecture`, by the
    loader's own rules for each format (formats/), from the config alone."""
    import torch

    from ..model.checkpoints import CHECKPOINTS
    from .formats import gguf
    from .loading import _skeleton
    from .streaming import _quantized_targets, is_vision_key

    config = _architecture_config(architecture)
    torch_dtype = getattr(torch, dtype)
    element = torch.tensor([], dtype=torch_dtype).element_size()
    skeleton = _skeleton(config, torch_dtype)
    targets = _quantized_targets(skeleton)
    parameters = [(name, tuple(p.shape)) for name, p in skeleton.named_parameters() if not is_vision_key(name)]
    sizes: dict[str, int] = {}
    for checkpoint in CHECKPOINTS:
        if checkpoint.format == "gguf":
            tensors, names = gguf.architecture_tensors(skeleton, config.text_config.num_hidden_layers,
                                                       checkpoint.variant)
            plan = gguf.plan(tensors, names, skeleton, "none")
            sizes[checkpoint.spec] = gguf.planned_bytes(tensors, names, plan, torch_dtype)
        elif checkpoint.format in ("compressed-tensors-fp8", "compressed-tensors-nvfp4", "modelopt-nvfp4"):
            per_row = checkpoint.format == "compressed-tensors-fp8"  # one scale per row, else one per 16 inputs
            sizes[checkpoint.spec] = sum(
                _numel(shape) + (_numel(shape[:-1]) if per_row else _numel(shape) // 16) * 2
                if name in targets else _numel(shape) * element
                for name, shape in parameters
            )
        elif checkpoint.format == "bf16":
            sizes[checkpoint.spec] = sum(_numel(shape) * element for _, shape in parameters)
    return sizes


def recommendation(device: str, *, free_bytes: int | None = None, capability: tuple[int, int] | None = None,
                   architecture: Path | None = None):
    """The published checkpoint `doctor` names for `device` (model/checkpoints.recommend): the most precise
    one this card serves whose planned weights fit its free memory; None on the CPU or when none fits."""
    from ..model.architecture import DIFFUSION_CONFIG
    from ..model.checkpoints import CHECKPOINTS, recommend

    if not device.startswith("cuda") and free_bytes is None:
        return None
    if capability is None:
        import torch

        capability = tuple(torch.cuda.get_device_capability(torch.device(device)))
    if free_bytes is None:
        free_bytes = free_device_bytes(device)
    sizes = catalog_sizes(architecture or DIFFUSION_CONFIG, "bfloat16")
    fits = {}
    for checkpoint in CHECKPOINTS:
        if checkpoint.spec in sizes:
            plan = FitPlan(mode=checkpoint.mode, device="cuda", resident_bytes={checkpoint.mode: sizes[checkpoint.spec]},
                           device_free_bytes=free_bytes, host_free_bytes=available_host_bytes(), host_pass_bytes=0)
            fits[checkpoint.spec] = plan.fits(checkpoint.mode)
    return recommend(fits, capability)
