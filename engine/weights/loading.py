"""Finding and loading a DiffusionGemma checkpoint and its tokenizer.

Which folder a model spec names is model/folders' business. Loading is offline: nothing is
downloaded unless the user runs `dgemma-lsp fetch-model`. The vision tower is
never loaded (text_model); before any weight is read the planned resident size
is checked against free memory (memory_plan); quantized modes stream the
checkpoint shard by shard (streaming) and keep the packed result for later
starts (quantization.save_quantized). Every failure is a
ModelNotFoundError / ModelLoadError with one line that names the model and what
to do. Knows torch and transformers; knows nothing of prompts or LSP.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from ..errors import ModelLoadError, ModelNotFoundError
from ..model.cache import cache_root
from ..model.folders import companion_folder, resolve_model_folder
from .memory_plan import FitPlan, available_host_bytes, check_fit, free_device_bytes

ProgressFn = Callable[[int, int], None]
"""Called with (shards done, shards in all) while weights load."""

log = logging.getLogger(__name__)


def pick_device_and_dtype(device: str | None, dtype: str | None) -> tuple[str, str]:
    """CUDA in bf16 when available, else CPU in fp32; either can be overridden."""
    import torch

    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if dtype is None:
        dtype = "bfloat16" if device.startswith("cuda") else "float32"
    return device, dtype


def load_model_and_tokenizer(
    spec: str,
    *,
    device: str | None = None,
    dtype: str | None = None,
    quantization: str = "none",
    allow_download: bool = False,
    progress: ProgressFn | None = None,
):
    """Returns (model, tokenizer, device) ready for generate, in eval mode.

    `progress(done, total)` runs after each checkpoint shard is read (the `none`
    mode reads through `from_pretrained`: one step, at its end).
    """
    folder = resolve_model_folder(spec, allow_download=allow_download)
    device, dtype = pick_device_and_dtype(device, dtype)
    found = find_checkpoint(spec, folder)
    config_folder = folder if not found.prequantized else companion_folder(folder) or folder
    if not (config_folder / "config.json").is_file():
        if found.prequantized:
            raise ModelLoadError(
                f"'{spec}' ({found.label}) carries no config.json or tokenizer, and the base model's are not in the "
                f"Hugging Face cache: run `dgemma-lsp fetch-model {spec}` (it fetches them, a few MB)"
            )
        raise ModelLoadError(f"model folder '{folder}' is incomplete: config.json is missing")

    from transformers import AutoConfig, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # progress bars would clutter the editor's log
    try:
        config = AutoConfig.from_pretrained(config_folder, local_files_only=True)
    except Exception as error:  # noqa: BLE001 - any parse failure means a corrupt folder
        raise ModelLoadError(
            f"model folder '{config_folder}' has an unreadable config.json: {_first_line(error)}") from None
    if config.model_type != "diffusion_gemma":
        raise ModelLoadError(
            f"model '{spec}' is a '{config.model_type}' model, not DiffusionGemma (model_type diffusion_gemma)"
        )
    try:
        tokenizer = AutoTokenizer.from_pretrained(config_folder, local_files_only=True)
        if found.prequantized:
            model = _load_prequantized(found, spec, config_folder, config, device, dtype, quantization, progress)
        else:
            model = _load_weights(folder, config, device, dtype, quantization, progress)
        model.eval()
    except (ModelLoadError, ModelNotFoundError):
        raise
    except Exception as error:  # noqa: BLE001 - weights/tokenizer errors all mean "cannot load"
        raise ModelLoadError(f"could not load model '{spec}' from '{folder}': {_first_line(error)}") from None
    log.info("loaded %s from %s on %s (%s)", spec, folder, device, dtype)
    return model, tokenizer, device


def _load_weights(folder: Path, config, device: str, dtype: str, quantization: str, progress: ProgressFn | None):
    """The model, never with its vision tower; checked to fit before a weight is read.

    - none: `from_pretrained` with a device map, so weights go straight to the device;
    - a packed mode, first start: streamed shard by shard, packed as read, then saved;
    - a packed mode, later starts: the saved packed shards, streamed.
    """
    import torch

    from .quantization import SAVE_FORMAT_VERSION, load_quantized, save_quantized, saved_format_version
    from .streaming import checkpoint_files, read_headers, stream_load
    from .text_model import TextOnlyDiffusionGemma

    torch_dtype = getattr(torch, dtype)
    files = checkpoint_files(folder)
    skeleton = _skeleton(config, torch_dtype)
    cached = quantized_cache_dir(folder, quantization)
    from_cache = quantization != "none" and saved_format_version(cached) == SAVE_FORMAT_VERSION
    read_files = sorted(cached.glob("*.safetensors")) if from_cache else files
    check_fit(_fit_plan(read_headers(files), skeleton, quantization, device, torch_dtype, read_files))
    if quantization == "none":
        if progress is not None:
            progress(0, 1)
        model = TextOnlyDiffusionGemma.from_pretrained(
            folder, dtype=torch_dtype, device_map=device, local_files_only=True
        )
        if progress is not None:
            progress(1, 1)
        return model
    from transformers.models.diffusion_gemma.generation_diffusion_gemma import DiffusionGemmaGenerationConfig

    if from_cache:
        report = load_quantized(skeleton, cached, device=device, progress=progress)
        log.info("loaded %s weights from %s: %s", quantization, cached, report)
    else:
        report = stream_load(skeleton, folder, device=device, dtype=torch_dtype, mode=quantization,
                             progress=progress)
        save_quantized(skeleton, cached)
        log.info("quantized %s to %s while loading and saved it in %s: %s", folder, quantization, cached, report)
    skeleton.generation_config = DiffusionGemmaGenerationConfig.from_pretrained(folder)
    skeleton.loaded_from_packed_cache = from_cache
    return skeleton


def find_checkpoint(spec: str, folder: Path):
    """The format `spec`'s folder holds (weights/formats/detect.py); a `.gguf` path or `:VARIANT` picks one file."""
    from ..model.folders import split_variant
    from .formats import find_format

    path = Path(spec).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return find_format(folder, file=path)
    return find_format(folder, split_variant(spec)[1])


def _load_prequantized(found, spec: str, config_folder: Path, config, device: str, dtype: str, quantization: str,
                       progress: ProgressFn | None):
    """A checkpoint published quantized (GGUF, compressed-tensors, ModelOpt): checked, fitted, streamed in."""
    import torch
    from transformers.models.diffusion_gemma.generation_diffusion_gemma import DiffusionGemmaGenerationConfig

    from . import formats

    torch_dtype = getattr(torch, dtype)
    formats.check_runs_here(found, spec, device, quantization, native_mode="none")  # MLX, NVFP4 off FP4 cards
    planned = formats.sizes(found, config, torch_dtype, quantization)
    formats.check_runs_here(found, spec, device, quantization, native_mode=planned.mode)
    formats.check_fits(found, planned, spec, device)
    log.info("'%s' is %s: loading it as %s (%.1f GiB of weights)", spec, found.label, planned.mode,
             planned.resident_bytes / 1024**3)
    model = formats.load(found, config, spec=spec, device=device, dtype=torch_dtype, quantization=quantization,
                         progress=progress)
    model.generation_config = DiffusionGemmaGenerationConfig.from_pretrained(config_folder)
    model.checkpoint_format = found.label
    return model


def _skeleton(config, torch_dtype):
    """The text-only model on the meta device, in the dtype `from_pretrained` would build it in."""
    from .text_model import meta_skeleton

    return meta_skeleton(config, torch_dtype)


def _fit_plan(infos, skeleton, quantization: str, device: str, torch_dtype, read_files: list[Path]) -> FitPlan:
    from .quantization import MODES
    from .streaming import planned_bytes

    return FitPlan(
        mode=quantization,
        device=device,
        resident_bytes={mode: planned_bytes(infos, skeleton, mode, torch_dtype) for mode in MODES},
        device_free_bytes=free_device_bytes(device),
        host_free_bytes=available_host_bytes(),
        host_pass_bytes=max((file.stat().st_size for file in read_files), default=0),
    )


def quantized_cache_dir(folder: Path, quantization: str) -> Path:
    """Where the packed weights of `folder` in one mode are kept between starts."""
    import hashlib

    config = folder / "config.json"
    key = f"{folder.resolve()}|{config.stat().st_mtime_ns}|{quantization}"
    return cache_root() / "quantized" / hashlib.sha256(key.encode()).hexdigest()[:16]


def _first_line(error: BaseException) -> str:
    text = str(error).strip() or type(error).__name__
    return text.splitlines()[0][:300]
