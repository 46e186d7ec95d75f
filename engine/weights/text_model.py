"""DiffusionGemma without its vision tower: the model class every load path builds.

Code infill never sends an image, yet `DiffusionGemmaEncoderModel.__init__`
always builds the vision tower (~0.57B parameters in the released checkpoint)
and its projection. `TextOnlyDiffusionGemma` is the same transformers class with
those two modules swapped for a parameter-free stand-in right after
construction, so:
- `from_pretrained` never materialises them (it builds on the meta device) and
  skips their checkpoint keys as expected-unexpected (no warning, no read);
- the streaming loader and the packed-weight loader build a skeleton without
  them, so they are never read, never resident and never counted.
A feature that needs images would load `DiffusionGemmaForBlockDiffusion` itself.

Knows transformers' DiffusionGemma module names; knows nothing of files,
quantization or devices.
"""

from __future__ import annotations

from torch import nn
from transformers import DiffusionGemmaForBlockDiffusion

VISION_MODULES = ("model.encoder.vision_tower", "model.encoder.embed_vision")
"""Modules of the checkpoint that text infill never runs."""
VISION_PREFIXES = tuple(f"{name}." for name in VISION_MODULES)


class VisionNotLoaded(nn.Module):
    """Holds the place of the vision tower: no weights; calling it says why."""

    def forward(self, *args, **kwargs):
        raise RuntimeError(
            "dgemma-lsp loads DiffusionGemma without its vision tower (code infill sends no images)"
        )


class TextOnlyDiffusionGemma(DiffusionGemmaForBlockDiffusion):
    """`DiffusionGemmaForBlockDiffusion` with the vision tower and its projection left out."""

    # Checkpoint keys of the left-out modules are expected to go unused: no "unexpected keys" warning.
    _keys_to_ignore_on_load_unexpected = [r"^model\.encoder\.(vision_tower|embed_vision)\."]

    def __init__(self, config) -> None:
        super().__init__(config)
        drop_vision(self)


def drop_vision(model: nn.Module) -> None:
    """Swap the vision modules of a DiffusionGemma for stand-ins (in place)."""
    for name in VISION_MODULES:
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name), child, VisionNotLoaded())


def is_vision_key(name: str) -> bool:
    return name.startswith(VISION_PREFIXES)


def meta_skeleton(config, torch_dtype) -> TextOnlyDiffusionGemma:
    """The text-only model on the meta device, in the dtype `from_pretrained` would build it in (no memory)."""
    import torch
    from transformers.modeling_utils import local_torch_dtype

    with local_torch_dtype(torch_dtype), torch.device("meta"):
        return TextOnlyDiffusionGemma(config)
