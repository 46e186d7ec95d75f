"""Which format a checkpoint folder holds, read from its files alone (no weight is read).

- GGUF (llama.cpp's; unsloth publishes Q4_K_M, Q8_0, ...): `*.gguf` files, one per variant
  (a big variant may be split into `-0000N-of-0000M.gguf` parts); the variant is the file's
  `general.file_type`, and `owner/name:VARIANT` picks one when a folder holds several.
- compressed-tensors (vLLM's; RedHatAI's FP8-dynamic and NVFP4): safetensors shards whose
  config.json has `quantization_config.quant_method == "compressed-tensors"`; the scheme is
  read from its `config_groups` (8-bit float per channel: FP8-dynamic; 4-bit float in groups
  of 16: NVFP4).
- NVIDIA ModelOpt NVFP4: `quant_method == "modelopt"` (or `hf_quant_config.json`) with
  `quant_algo == "NVFP4"`.
- MLX (Apple's; mlx-community): config.json's `quantization: {bits, group_size}`.
- anything else with safetensors: the plain (bf16) checkpoint.

Knows file names and JSON; imports `gguf` only to read a GGUF header.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from ...errors import ModelLoadError, ModelNotFoundError

PLAIN = "bf16"
GGUF = "gguf"
CT_FP8 = "compressed-tensors-fp8"
CT_NVFP4 = "compressed-tensors-nvfp4"
MODELOPT_NVFP4 = "modelopt-nvfp4"
MLX = "mlx"
NVFP4_FORMATS = (CT_NVFP4, MODELOPT_NVFP4)
_PART = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)


@dataclass(frozen=True)
class Found:
    """A checkpoint's format and where its pieces are."""

    format: str
    label: str
    """What to tell the user: "GGUF Q4_K_M", "compressed-tensors FP8-dynamic", ..."""
    folder: Path
    files: tuple[Path, ...] = ()
    """GGUF: the variant's file(s), parts in order; others: empty (the folder's shards)."""
    config: dict | None = None
    """config.json's quantization_config (compressed-tensors, ModelOpt) or quantization (MLX)."""

    @property
    def prequantized(self) -> bool:
        return self.format != PLAIN


def find_format(folder: Path, variant: str | None = None, file: Path | None = None) -> Found:
    """What `folder` holds; `variant` (from `owner/name:VARIANT`) picks one GGUF file of several, `file`
    names one (`--model path/to/x.gguf`)."""
    folder = Path(folder)
    if file is not None:
        return Found(GGUF, f"GGUF {gguf_variant(file)}", folder, (Path(file),))
    ggufs = sorted(path for path in folder.rglob("*.gguf") if "mmproj" not in path.name.lower())
    config = _json(folder / "config.json")
    has_safetensors = any(folder.glob("*.safetensors"))
    if ggufs and (variant is not None or not has_safetensors):
        return _gguf(folder, ggufs, variant)
    if variant is not None:
        raise ModelNotFoundError(f"'{folder}' holds no GGUF files, so no variant {variant!r}")
    if config is None:
        return Found(PLAIN, "safetensors", folder)
    if "quantization" in config and isinstance(config["quantization"], dict) and "bits" in config["quantization"]:
        bits = config["quantization"]["bits"]
        return Found(MLX, f"MLX {bits}-bit", folder, config=config["quantization"])
    quant = config.get("quantization_config") or _json(folder / "hf_quant_config.json") or {}
    method = quant.get("quant_method") or ("modelopt" if "producer" in quant else None)
    if method == "compressed-tensors":
        return _compressed_tensors(folder, quant)
    if method == "modelopt":
        algo = quant.get("quant_algo") or quant.get("quantization", {}).get("quant_algo")
        if algo == "NVFP4":
            return Found(MODELOPT_NVFP4, "ModelOpt NVFP4", folder, config=quant)
        raise ModelLoadError(f"'{folder}' is a ModelOpt {algo} checkpoint; of ModelOpt's formats only NVFP4 loads here")
    if method is not None:
        raise ModelLoadError(
            f"'{folder}' is quantized with {method!r}, which this build does not read "
            "(it reads GGUF, compressed-tensors FP8-dynamic and NVFP4, ModelOpt NVFP4 and plain safetensors)"
        )
    return Found(PLAIN, "safetensors", folder)


def gguf_variant(path: Path) -> str:
    """The variant a GGUF file holds (general.file_type: Q4_K_M, Q8_0, ...), from its header."""
    from gguf import GGUFReader, LlamaFileType

    reader = GGUFReader(path)
    field = reader.get_field("general.file_type")
    if field is None:
        return _PART.sub(".gguf", path.name).removesuffix(".gguf").rsplit("-", 1)[-1]
    value = int(field.contents())
    try:
        return LlamaFileType(value).name.removeprefix("MOSTLY_").removeprefix("ALL_")
    except ValueError:
        return f"file_type {value}"


def _gguf(folder: Path, files: list[Path], variant: str | None) -> Found:
    if variant is not None:
        pattern = re.compile(rf"(?<![A-Za-z0-9]){re.escape(variant)}(-\d{{5}}-of-\d{{5}})?\.gguf$", re.IGNORECASE)
        files = [path for path in files if pattern.search(path.name)]
        if not files:
            raise ModelNotFoundError(
                f"'{folder}' has no {variant} GGUF file; run `dgemma-lsp fetch-model {_repo_of(folder)}:{variant}`"
            )
    stems = sorted({_PART.sub("", path.name).removesuffix(".gguf") for path in files})
    if len(stems) > 1:
        raise ModelLoadError(
            f"'{folder}' holds {len(stems)} GGUF files ({', '.join(stems)}): name one, "
            f"e.g. --model {_repo_of(folder)}:{gguf_variant(files[0])}"
        )
    parts = sorted(files, key=lambda path: path.name)
    label = variant or gguf_variant(parts[0])
    return Found(GGUF, f"GGUF {label}", folder, tuple(parts))


def _compressed_tensors(folder: Path, quant: dict) -> Found:
    schemes = []
    for group in (quant.get("config_groups") or {}).values():
        weights = group.get("weights") or {}
        schemes.append((weights.get("num_bits"), weights.get("type"), weights.get("strategy"),
                        weights.get("group_size"), group.get("format") or quant.get("format")))
    if schemes and all(s[:3] == (8, "float", "channel") for s in schemes):
        return Found(CT_FP8, "compressed-tensors FP8-dynamic", folder, config=quant)
    if schemes and all(s[:2] == (4, "float") and s[3] == 16 for s in schemes):
        return Found(CT_NVFP4, "compressed-tensors NVFP4", folder, config=quant)
    raise ModelLoadError(
        f"'{folder}' is a compressed-tensors checkpoint with weights {schemes}; this build reads its "
        "FP8-dynamic (8-bit float per channel) and NVFP4 (4-bit float, groups of 16) schemes"
    )


def _json(path: Path) -> dict | None:
    try:
        value = json.loads(path.read_text("utf-8"))
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def _repo_of(folder: Path) -> str:
    """`owner/name` for a Hugging Face cache snapshot (…/models--owner--name/snapshots/<rev>), else the folder."""
    for part in folder.parts:
        if part.startswith("models--"):
            return part.removeprefix("models--").replace("--", "/", 1)
    return str(folder)
