"""The published checkpoints of DiffusionGemma 26B-A4B, what each costs to download, and which one fits a card.

Torch-free: `doctor`, `fetch-model` and the language server read it without loading anything.
A checkpoint is named by a spec: a Hugging Face id, with `:VARIANT` for one file of a repo
that holds several (GGUF, as llama.cpp's `-hf user/repo:Q4_K_M` names them).

Download sizes: the GGUF files' were read off the published files (Q4_K_M 16.8 GB, Q8_0
26.9 GB); the others are estimates from the architecture (parameters x bytes per
parameter of the format, the vision tower included, as the repos ship it) and say so.
Resident sizes are not here: engine/weights/readiness.py plans them from the architecture
with the loader's own rule for each format.
"""

from __future__ import annotations

from dataclasses import dataclass

from .folders import DEFAULT_MODEL_ID, split_variant

GB = 10**9
GIB = 1024**3


@dataclass(frozen=True)
class Checkpoint:
    spec: str
    """What `--model` and `fetch-model` take."""
    format: str
    """bf16, gguf, compressed-tensors-fp8, compressed-tensors-nvfp4, modelopt-nvfp4 or mlx."""
    label: str
    """How people name it: "GGUF Q4_K_M", "FP8-dynamic", ..."""
    mode: str
    """The packed mode it loads in (quantization.MODES); NVFP4 has no FP4 kernel here yet and loads as fp8."""
    download_bytes: int
    download_estimated: bool
    """True when download_bytes is computed from the architecture, not read off the published files."""
    needs_capability: tuple[tuple[int, int], ...] = ()
    """CUDA capabilities it is made for (NVFP4: FP4 tensor cores); empty: any CUDA card."""
    apple_only: bool = False

    @property
    def repo(self) -> str:
        return split_variant(self.spec)[0]

    @property
    def variant(self) -> str | None:
        return split_variant(self.spec)[1]

    def describe(self) -> str:
        about = "~" if self.download_estimated else ""
        return f"{self.spec} ({self.label}, {about}{self.download_bytes / GB:.1f} GB download)"


FP4_CAPABILITIES = ((10, 0), (10, 3), (12, 0), (12, 1))
"""sm100/sm103 (B200, B300) and sm120/sm121 (RTX 50xx, DGX Spark): the cards with FP4 tensor cores."""

GGUF_REPO = "unsloth/diffusiongemma-26B-A4B-it-GGUF"

CHECKPOINTS: tuple[Checkpoint, ...] = (
    Checkpoint(DEFAULT_MODEL_ID, "bf16", "bf16", "none", 52 * GB, False),
    Checkpoint("RedHatAI/diffusiongemma-26B-A4B-it-FP8-dynamic", "compressed-tensors-fp8", "FP8-dynamic", "fp8",
               27 * GB, True),
    Checkpoint(f"{GGUF_REPO}:Q8_0", "gguf", "GGUF Q8_0", "int8", 26_900_000_000, False),
    Checkpoint(f"{GGUF_REPO}:Q4_K_M", "gguf", "GGUF Q4_K_M", "int4", 16_800_000_000, False),
    Checkpoint("RedHatAI/diffusiongemma-26B-A4B-it-NVFP4", "compressed-tensors-nvfp4", "NVFP4", "fp8", 16 * GB, True,
               needs_capability=FP4_CAPABILITIES),
    Checkpoint("nvidia/diffusiongemma-26B-A4B-it-NVFP4", "modelopt-nvfp4", "NVFP4 (ModelOpt)", "fp8", 16 * GB, True,
               needs_capability=FP4_CAPABILITIES),
    Checkpoint("mlx-community/diffusiongemma-26B-A4B-it-4bit", "mlx", "MLX 4-bit", "int4", 15 * GB, True,
               apple_only=True),
)
"""Most precise first: the order `recommend` prefers among those that fit."""


@dataclass(frozen=True)
class Card:
    name: str
    capability: tuple[int, int]
    memory_bytes: int


CARDS = (
    Card("RTX 4090", (8, 9), 24 * GIB),
    Card("RTX 5090", (12, 0), 32 * GIB),
    Card("H100", (9, 0), 80 * GIB),
    Card("B200", (10, 0), 180 * GIB),
)
"""Cards `doctor --for-gpu` plans for without having them (the dry run's virtual GPUs and a B200)."""


def find(spec: str) -> Checkpoint | None:
    """The catalog entry `spec` names (a GGUF repo without a variant: none)."""
    return next((checkpoint for checkpoint in CHECKPOINTS if checkpoint.spec == spec), None)


def runs_on(checkpoint: Checkpoint, capability: tuple[int, int] | None) -> bool:
    """Whether this build serves `checkpoint` on a card of `capability` (None: no CUDA card)."""
    if checkpoint.apple_only:
        return False
    if checkpoint.needs_capability:
        return capability in checkpoint.needs_capability
    return True


def recommend(fits: dict[str, bool], capability: tuple[int, int] | None) -> Checkpoint | None:
    """The most precise checkpoint this card serves whose planned weights fit (`fits`: spec -> verdict)."""
    for checkpoint in CHECKPOINTS:
        if runs_on(checkpoint, capability) and fits.get(checkpoint.spec, False):
            return checkpoint
    return None
