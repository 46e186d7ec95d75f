"""Checkpoints published already quantized: GGUF, compressed-tensors FP8-dynamic and NVFP4, ModelOpt NVFP4, MLX.

`detect` says which format a folder holds; `gguf` and `prequantized` fill the text model's
skeleton from each, into the packed modules of weights/quantization.py (QuantizedExperts,
QuantizedLinear), streaming as the bf16 loader does. This module is what loading.py and
readiness.py call: the planned resident bytes of a found checkpoint, the mode it loads in,
the refusals (MLX anywhere, NVFP4 off FP4 cards) with the checkpoint that fits instead, and the
load itself (a GGUF's repack cached like `--quantization`'s packed weights).

A pre-quantized checkpoint loads in the mode it was made for: `--quantization none` (the
default) means "as it is"; another mode would quantize it twice and is refused with the
checkpoint made for that mode.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from ...errors import ModelLoadError
from ...model.cache import cache_root
from ..streaming import PACK_CHUNK_BYTES
from .detect import CT_FP8, GGUF, MLX, NVFP4_FORMATS, PLAIN, Found, find_format

log = logging.getLogger(__name__)

GGUF_CACHE_VERSION = 2
"""Bump when the GGUF repack changes (group sizes, modes): older packed caches are rebuilt. 2: lossless (Q4_K as
affine int4, each projection in its own mode)."""

__all__ = ["Found", "Sizes", "check_runs_here", "find_format", "load", "sizes"]


@dataclass(frozen=True)
class Sizes:
    """What loading a found checkpoint will hold."""

    mode: str
    """The mode most expert bytes are packed in (none, fp8, int8, int4)."""
    resident_bytes: int
    host_pass_bytes: int
    """Host memory the load itself holds beyond what stays resident."""


def sizes(found: Found, config, dtype: torch.dtype, quantization: str = "none") -> Sizes:
    """Planned resident bytes of `found` loaded with `config`'s skeleton in `dtype`; reads headers only."""
    from ..text_model import meta_skeleton as _skeleton

    skeleton = _skeleton(config, dtype)
    if found.format == GGUF:
        from . import gguf

        tensors, _ = gguf.read_tensors(found.files)
        names = gguf.checkpoint_names(skeleton, config.text_config.num_hidden_layers)
        the_plan = gguf.plan(tensors, names, skeleton, quantization)
        resident = gguf.planned_bytes(tensors, names, the_plan, dtype)
        return Sizes(the_plan.mode, resident, 2 * PACK_CHUNK_BYTES)  # a chunk of experts' values, and its blocks
    if found.format == CT_FP8 or found.format in NVFP4_FORMATS:
        from ..streaming import checkpoint_files, read_headers
        from . import prequantized

        files = checkpoint_files(found.folder)
        resident = prequantized.planned_bytes(read_headers(files), skeleton, found.format, dtype)
        return Sizes("fp8", resident, max(file.stat().st_size for file in files))
    raise AssertionError(f"sizes() of a {found.format} checkpoint")


def check_runs_here(found: Found, spec: str, device: str, quantization: str, native_mode: str) -> None:
    """ModelLoadError when this checkpoint cannot serve here: MLX, NVFP4 off an FP4 card, a second quantization."""
    from ...model.checkpoints import FP4_CAPABILITIES

    if found.format == MLX:
        raise ModelLoadError(
            f"'{spec}' is an {found.label} checkpoint: MLX runs on Apple silicon only. "
            f"On this machine: {_instead(device)}"
        )
    if found.format in NVFP4_FORMATS and device.startswith("cuda"):
        capability = torch.cuda.get_device_capability(torch.device(device))
        if tuple(capability) not in FP4_CAPABILITIES:
            raise ModelLoadError(
                f"'{spec}' is {found.label}, made for FP4 tensor cores (sm100/sm120); this GPU is "
                f"sm_{capability[0]}{capability[1]}: {_instead(device)}"
            )
    if quantization not in ("none", native_mode) and native_mode != "none":
        raise ModelLoadError(
            f"'{spec}' is {found.label} and loads as {native_mode}; --quantization {quantization} would quantize "
            f"it a second time: leave --quantization out, or use a checkpoint made for {quantization} "
            "(`dgemma-lsp doctor` lists them)"
        )


def check_fits(found: Found, planned: Sizes, spec: str, device: str) -> None:
    """ModelLoadError, naming the checkpoint that fits, when `found` does not fit free memory (memory_plan's rule)."""
    from ..memory_plan import FitPlan, _gib, available_host_bytes, free_device_bytes

    plan = FitPlan(mode=planned.mode, device=device, resident_bytes={planned.mode: planned.resident_bytes},
                   device_free_bytes=free_device_bytes(device), host_free_bytes=available_host_bytes(),
                   host_pass_bytes=planned.host_pass_bytes)
    if plan.fits(planned.mode):
        return
    where = "host memory" if device == "cpu" else device
    raise ModelLoadError(
        f"the model does not fit: '{spec}' ({found.label}) needs {_gib(planned.resident_bytes)} GiB of weights on "
        f"{where} (+{_gib(plan.margin_bytes)} GiB working memory) but {_gib(plan.device_free_bytes)} GiB is free; "
        f"{_instead(device)}"
    )


def load(found: Found, config, *, spec: str, device: str, dtype: torch.dtype, quantization: str,
         progress: Callable[[int, int], None] | None = None):
    """The text model filled from `found` on `device`; logs which format it found."""
    from ..quantization import SAVE_FORMAT_VERSION, load_quantized, save_quantized, saved_format_version
    from ..text_model import meta_skeleton as _skeleton

    skeleton = _skeleton(config, dtype)
    source = f"'{spec}' ({found.label})"
    if found.format == GGUF:
        from . import gguf

        cached = gguf_cache_dir(found, dtype, quantization)
        if saved_format_version(cached) == SAVE_FORMAT_VERSION:
            report = load_quantized(skeleton, cached, device=device, progress=progress)
            log.info("found %s in %s; loaded its packed weights from %s: %s", found.label, found.folder, cached, report)
            skeleton.loaded_from_packed_cache = True
            return skeleton
        tensors, metadata = gguf.read_tensors(found.files)
        gguf.check_architecture(metadata, config, source)
        names = gguf.checkpoint_names(skeleton, config.text_config.num_hidden_layers)
        the_plan = gguf.plan(tensors, names, skeleton, quantization)
        report = gguf.stream_load(skeleton, found.files, tensors, names, the_plan, device=device, dtype=dtype,
                                  source=source, progress=progress)
        save_quantized(skeleton, cached)
        log.info("found %s in %s; repacked it to %s and saved it in %s: %s", found.label, found.folder,
                 the_plan.mode, cached, report)
    else:
        from . import prequantized

        report = prequantized.stream_load(skeleton, found.folder, found.format, device=device, dtype=dtype,
                                          source=source, progress=progress)
        log.info("found %s in %s; loaded it into the fp8 layout: %s", found.label, found.folder, report)
    skeleton.loaded_from_packed_cache = False
    return skeleton


def gguf_cache_dir(found: Found, dtype: torch.dtype, quantization: str) -> Path:
    """Where a GGUF's repack is kept between starts: keyed by its files (path, size, time), dtype and flag."""
    parts = [f"gguf-v{GGUF_CACHE_VERSION}", str(dtype), quantization]
    for file in found.files:
        stat = file.stat()
        parts.append(f"{file.resolve()}|{stat.st_size}|{stat.st_mtime_ns}")
    return cache_root() / "quantized" / hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def _instead(device: str) -> str:
    """The checkpoint `doctor` would name for `device`, as a fetch command (or what to do without one)."""
    from ..choice import recommendation

    choice = recommendation(device)
    if choice is None:
        return "no published checkpoint fits this device's free memory (`dgemma-lsp doctor` says what does)"
    return f"`dgemma-lsp fetch-model {choice.spec}` ({choice.describe()}) fits it"


def is_plain(found: Found) -> bool:
    return found.format == PLAIN
