"""Which published checkpoint fits a card: each one's planned resident bytes on the real architecture, by the
loader's own rule for its format, against a card's free memory (memory_plan's fit rule).

`doctor`, `fetch-model --for-this-gpu` and the loader's refusals (an NVFP4 or MLX checkpoint where it
cannot serve) name the same checkpoint through `recommendation`. Sizes come from the architecture's
config alone (model/configs/), built on the meta device: nothing is read or downloaded. Knows torch,
transformers and the formats' planning; knows nothing of LSP or how the answer is printed.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

from .memory_plan import FitPlan, available_host_bytes, free_device_bytes


def _numel(shape: tuple[int, ...]) -> int:
    count = 1
    for size in shape:
        count *= size
    return count


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
    from .formats.gguf import architecture_tensors, planned_bytes
    from .formats.gguf import plan as gguf_plan
    from .streaming import _quantized_targets, is_vision_key
    from .text_model import meta_skeleton as _skeleton

    config = _architecture_config(architecture)
    torch_dtype = getattr(torch, dtype)
    element = torch.tensor([], dtype=torch_dtype).element_size()
    skeleton = _skeleton(config, torch_dtype)
    targets = _quantized_targets(skeleton)
    parameters = [(name, tuple(p.shape)) for name, p in skeleton.named_parameters() if not is_vision_key(name)]
    sizes: dict[str, int] = {}
    for checkpoint in CHECKPOINTS:
        if checkpoint.format == "gguf":
            tensors, names = architecture_tensors(skeleton, config.text_config.num_hidden_layers,
                                                       checkpoint.variant)
            plan = gguf_plan(tensors, names, skeleton, "none")
            sizes[checkpoint.spec] = planned_bytes(tensors, names, plan, torch_dtype)
        elif checkpoint.format in ("compressed-tensors-fp8", "compressed-tensors-nvfp4", "modelopt-nvfp4"):
            per_row = checkpoint.format == "compressed-tensors-fp8"  # a float32 scale per row, else bf16 per 16
            sizes[checkpoint.spec] = sum(
                _numel(shape) + (_numel(shape[:-1]) * 4 if per_row else _numel(shape) // 16 * 2)
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
