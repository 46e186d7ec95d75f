"""Finding and loading a DiffusionGemma checkpoint and its tokenizer.

A model spec is `tiny` (built locally, see tiny_model), a local folder, or a
Hugging Face id looked up in the local HF cache. Loading is offline: nothing is
downloaded unless the user runs `dgemma-lsp fetch-model`. Every failure is a
ModelNotFoundError / ModelLoadError with one line that names the model and what
to do. Knows torch and transformers; knows nothing of prompts or LSP.
"""

from __future__ import annotations

import logging
from pathlib import Path

from ..errors import ModelLoadError, ModelNotFoundError

DEFAULT_MODEL_ID = "google/diffusiongemma-26B-A4B-it"
log = logging.getLogger(__name__)


def pick_device_and_dtype(device: str | None, dtype: str | None) -> tuple[str, str]:
    """CUDA in bf16 when available, else CPU in fp32; either can be overridden."""
    import torch

    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if dtype is None:
        dtype = "bfloat16" if device.startswith("cuda") else "float32"
    return device, dtype


def resolve_model_folder(spec: str, *, allow_download: bool = False) -> Path:
    """The local folder holding the model's files, or a one-line error saying how to get them."""
    if spec == "tiny":
        from .tiny_model import ensure_tiny_model

        return ensure_tiny_model()
    path = Path(spec).expanduser()
    if path.is_dir():
        return path
    if path.exists() or spec.startswith((".", "/", "~")) or spec.count("/") != 1:
        raise ModelNotFoundError(
            f"model '{spec}' is neither a model folder nor a Hugging Face id like '{DEFAULT_MODEL_ID}'"
        )
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    try:
        return Path(snapshot_download(spec, local_files_only=not allow_download))
    except HFValidationError as error:
        raise ModelNotFoundError(f"model '{spec}' is not a valid Hugging Face id: {error}") from None
    except LocalEntryNotFoundError:
        raise ModelNotFoundError(
            f"model '{spec}' is not in the Hugging Face cache; run `dgemma-lsp fetch-model {spec}` "
            "to download it (~52 GB), or pass --model with a local folder"
        ) from None


def fetch_model(model_id: str = DEFAULT_MODEL_ID) -> Path:
    """Download a checkpoint into the Hugging Face cache (the one command that uses the network)."""
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(model_id))


def load_model_and_tokenizer(
    spec: str,
    *,
    device: str | None = None,
    dtype: str | None = None,
    quantization: str = "none",
    allow_download: bool = False,
):
    """Returns (model, tokenizer, device) ready for generate, in eval mode."""
    folder = resolve_model_folder(spec, allow_download=allow_download)
    device, dtype = pick_device_and_dtype(device, dtype)
    if not (folder / "config.json").is_file():
        raise ModelLoadError(f"model folder '{folder}' is incomplete: config.json is missing")

    import torch
    from transformers import AutoConfig, AutoTokenizer, DiffusionGemmaForBlockDiffusion
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # progress bars would clutter the editor's log
    try:
        config = AutoConfig.from_pretrained(folder, local_files_only=True)
    except Exception as error:  # noqa: BLE001 - any parse failure means a corrupt folder
        raise ModelLoadError(f"model folder '{folder}' has an unreadable config.json: {_first_line(error)}") from None
    if config.model_type != "diffusion_gemma":
        raise ModelLoadError(
            f"model '{spec}' is a '{config.model_type}' model, not DiffusionGemma (model_type diffusion_gemma)"
        )
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
        if quantization == "none":
            model = DiffusionGemmaForBlockDiffusion.from_pretrained(
                folder, dtype=getattr(torch, dtype), local_files_only=True
            )
            model.to(device)
        else:
            model = _load_quantized(folder, config, device, dtype, quantization)
        model.eval()
    except (ModelLoadError, ModelNotFoundError):
        raise
    except Exception as error:  # noqa: BLE001 - weights/tokenizer errors all mean "cannot load"
        raise ModelLoadError(f"could not load model '{spec}' from '{folder}': {_first_line(error)}") from None
    log.info("loaded %s from %s on %s (%s)", spec, folder, device, dtype)
    return model, tokenizer, device


def cache_root() -> Path:
    """The folder for what dgemma-lsp builds once and keeps: `DGEMMA_LSP_CACHE`, else the user cache dir."""
    import os

    import platformdirs

    return Path(os.environ.get("DGEMMA_LSP_CACHE") or platformdirs.user_cache_dir("dgemma-lsp"))


def quantized_cache_dir(folder: Path, quantization: str) -> Path:
    """Where the packed weights of `folder` in one mode are kept between starts."""
    import hashlib

    config = folder / "config.json"
    key = f"{folder.resolve()}|{config.stat().st_mtime_ns}|{quantization}"
    return cache_root() / "quantized" / hashlib.sha256(key.encode()).hexdigest()[:16]


def _load_quantized(folder: Path, config, device: str, dtype: str, quantization: str):
    """Quantize the checkpoint once and save the packed weights; later starts load only those.

    The first start holds the full-precision checkpoint in memory: on the GPU when
    it fits there, else on the CPU (quantized there, then moved).
    """
    import torch
    from transformers import DiffusionGemmaForBlockDiffusion
    from transformers.models.diffusion_gemma.generation_diffusion_gemma import DiffusionGemmaGenerationConfig

    from .quantization import load_quantized, quantize_model, save_quantized

    cached = quantized_cache_dir(folder, quantization)
    if (cached / "quantization.json").is_file():
        with torch.device("meta"):
            model = DiffusionGemmaForBlockDiffusion(config)
        report = load_quantized(model, cached, device=device)
        model.generation_config = DiffusionGemmaGenerationConfig.from_pretrained(folder)
        log.info("loaded %s weights from %s: %s", quantization, cached, report)
        return model
    model = DiffusionGemmaForBlockDiffusion.from_pretrained(folder, dtype=getattr(torch, dtype), local_files_only=True)
    model.to(device if _fits_on(device, model) else "cpu")
    report = quantize_model(model, quantization)
    model.to(device)
    save_quantized(model, cached)
    log.info("quantized %s to %s and saved it in %s: %s", folder, quantization, cached, report)
    return model


def _fits_on(device: str, model) -> bool:
    import torch

    if not device.startswith("cuda"):
        return True
    free, _ = torch.cuda.mem_get_info(torch.device(device))
    return free > 1.1 * sum(p.numel() * p.element_size() for p in model.parameters())


def _first_line(error: BaseException) -> str:
    text = str(error).strip() or type(error).__name__
    return text.splitlines()[0][:300]
