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

import json
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import EngineError
from .choice import catalog_sizes, recommendation  # noqa: F401 - doctor's facts too (choice.py: which checkpoint fits)
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


def published_plan(spec: str, device: str | None, dtype: str | None) -> SizePlan | None:
    """A published pre-quantized checkpoint not downloaded yet (model/checkpoints.py): its one mode's size,
    planned from the architecture by its format's rule (choice.catalog_sizes); None for any other spec."""
    from ..model.architecture import DIFFUSION_CONFIG
    from ..model.checkpoints import find
    from .loading import pick_device_and_dtype

    checkpoint = find(spec)
    if checkpoint is None or checkpoint.format in ("bf16", "mlx"):
        return None
    device, dtype = pick_device_and_dtype(device, dtype)
    resident = {checkpoint.mode: catalog_sizes(DIFFUSION_CONFIG, dtype)[checkpoint.spec]}
    fit = FitPlan(mode=checkpoint.mode, device=device, resident_bytes=resident,
                  device_free_bytes=free_device_bytes(device), host_free_bytes=available_host_bytes(),
                  host_pass_bytes=0)
    return SizePlan(device, dtype, f"{checkpoint.label}'s plan for the architecture", resident,
                    fit.device_free_bytes, fit.host_free_bytes, 0, {checkpoint.mode: fit.fits(checkpoint.mode)},
                    fit.margin_bytes, format=checkpoint.label, native_mode=checkpoint.mode)


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

