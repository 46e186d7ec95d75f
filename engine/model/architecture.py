"""The released models' architectures, written out as config files (configs/), for when their weights are not at hand.

`doctor` plans the memory of the default model from its architecture before it is downloaded; the
GPU benchmarks build the full-size architecture with random weights from the same files. Each file's
`_provenance` says where its values come from and which are assumed. Torch-free.
"""

from __future__ import annotations

from pathlib import Path

CONFIG_DIR = Path(__file__).resolve().parent / "configs"
DIFFUSION_CONFIG = CONFIG_DIR / "diffusiongemma-26B-A4B-it.json"
"""google/diffusiongemma-26B-A4B-it, the product's model."""
AUTOREGRESSIVE_CONFIG = CONFIG_DIR / "gemma-4-26B-A4B.json"
"""The autoregressive Gemma 4 26B-A4B text model: the baseline `bench gpu` sets beside it."""


def architecture_config(model_id: str) -> Path | None:
    """The written-out config of a released model named by its hub id, or None when none ships."""
    path = CONFIG_DIR / f"{model_id.split('/')[-1]}.json"
    return path if path.is_file() else None
