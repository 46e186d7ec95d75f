"""Which folder holds a model: the built-in ones, a local folder, or a Hugging Face id in the local cache.

Torch-free, and reads no weight: the language server, the daemon's client and the vLLM client
use it to name the model and know its context limit before (or without) loading it. Nothing is
downloaded except by `fetch_model` (`dgemma-lsp fetch-model`); every failure is a
ModelNotFoundError with one line that names the model and what to do.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import EngineError, ModelNotFoundError

DEFAULT_MODEL_ID = "google/diffusiongemma-26B-A4B-it"


def split_variant(spec: str) -> tuple[str, str | None]:
    """("owner/name", "Q4_K_M") for "owner/name:Q4_K_M" (one file of a repo holding several, as llama.cpp's
    `-hf user/repo:Q4_K_M` names it); (spec, None) for anything else, paths included."""
    head, sep, tail = spec.rpartition(":")
    if sep and head.count("/") == 1 and not head.startswith((".", "/", "~")) and tail and "/" not in tail:
        return head, tail
    return spec, None


def resolve_model_folder(spec: str, *, allow_download: bool = False) -> Path:
    """The local folder holding the model's files, or a one-line error saying how to get them."""
    from .tiny_model import builtin_model_folder

    builtin = builtin_model_folder(spec)
    if builtin is not None:
        return builtin
    spec, _variant = split_variant(spec)  # "owner/name:Q4_K_M": one file of the repo, chosen by the loader
    path = Path(spec).expanduser()
    if path.is_file() and path.suffix == ".gguf":  # a GGUF file named directly: its folder, the file the variant
        return path.parent
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
        wanted = f"{spec}:{_variant}" if _variant else spec
        size = " (~52 GB in bf16; `dgemma-lsp doctor` names the download that fits your GPU)" if (
            wanted == DEFAULT_MODEL_ID) else ""
        raise ModelNotFoundError(
            f"model '{wanted}' is not in the Hugging Face cache; run `dgemma-lsp fetch-model {wanted}` "
            f"to download it{size}, or pass --model with a local folder"
        ) from None


def declared_context_tokens(spec: str) -> int | None:
    """The context limit the model's folder names (prompting.MODEL_CONTEXT_KEY in its tokenizer_config.json), read
    without loading anything: known before the weights are; None when it names none, or its folder is not at hand
    (the load then says why)."""
    from .prompting import MODEL_CONTEXT_KEY, context_tokens_value
    from .tiny_model import builtin_model_folder

    try:
        folder = builtin_model_folder(spec, build=False) or resolve_model_folder(spec)
        folder = companion_folder(folder) or folder  # a GGUF's tokenizer is the base model's
        config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (EngineError, OSError, ValueError):
        return None
    return context_tokens_value(config.get(MODEL_CONTEXT_KEY)) if isinstance(config, dict) else None


COMPANION_FILES = ["*.json", "*.jinja", "tokenizer*"]
"""What a GGUF (weights only) borrows from the base model's repo: config, tokenizer, chat template (a few MB)."""


def fetch_model(model_id: str = DEFAULT_MODEL_ID) -> Path:
    """Download a checkpoint into the Hugging Face cache (the one command that uses the network).

    `owner/name:VARIANT` fetches only that variant's GGUF file(s), plus the base model's small
    files (config, tokenizer) the GGUF does not carry in a form transformers reads.
    """
    from huggingface_hub import snapshot_download

    repo, variant = split_variant(model_id)
    if variant is None:
        return Path(snapshot_download(repo))
    snapshot_download(DEFAULT_MODEL_ID, allow_patterns=COMPANION_FILES)
    return Path(snapshot_download(repo, allow_patterns=[f"*{variant}*.gguf", f"*{variant}*/*.gguf"],
                                  ignore_patterns=["*mmproj*"]))


def companion_folder(folder: Path) -> Path | None:
    """Where a weights-only folder's config.json and tokenizer are: the folder itself, else the base
    model's snapshot in the Hugging Face cache (fetched with it by `fetch_model`); None when neither has them."""
    if (folder / "config.json").is_file():
        return folder
    try:
        base = resolve_model_folder(DEFAULT_MODEL_ID)
    except ModelNotFoundError:
        return None
    return base if (base / "config.json").is_file() else None
