"""The two built-in tiny DiffusionGemmas; neither is ever downloaded.

`--model tiny` is the model trained on a CPU (issue 28, docs/training.md): a
save_pretrained folder shipped inside this package (data/tiny/: bf16 weights,
its tokenizer, `corpus.json` naming every training source with its licence, and
`training.json` with the recipe, the CPU-seconds and the tokens it cost). It is
loaded as it lies, with no build step; `python -m dgemma_lsp.engine.training.ship`
replaces it with a newer snapshot of a run.

`--model tiny-random` is a ~270K-parameter model with seeded random weights,
built from a config (the recipe in shared/REFERENCE.md) with a byte-level BPE
tokenizer trained in well under a second on text shipped in this package,
wrapped with a Gemma-style chat template. Everything is deterministic by seed
and cached in the user cache dir, keyed by a hash of the recipe, so a second
start only loads files. It writes random text: it exists to run the real
transformers code paths quickly on a CPU in tests, never to judge quality.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from importlib import resources
from pathlib import Path

from ..errors import ModelNotFoundError
from .cache import cache_root

TINY = "tiny"
TINY_RANDOM = "tiny-random"
BUILTIN_MODELS = (TINY, TINY_RANDOM)
"""Model specs that name a built-in model, never a folder or a hub id."""
TINY_SEED = 1234
TOKENIZER_VOCAB = 1000
"""Below the model vocab (1024) so the image/boi/eoi ids (1021-1023) are never produced by the tokenizer."""

SPECIAL_TOKENS = ["<pad>", "<eos>", "<bos>", "<unk>", "<|turn>", "<turn|>"]
"""Pinned ids: pad 0, eos 1, bos 2, as in the real checkpoint; the turn markers of Gemma's chat template."""

CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "<|turn>{{ 'model' if message['role'] == 'assistant' else message['role'] }}\n"
    "{{ message['content'] }}<turn|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|turn>model\n{% endif %}"
)

TEXT_CONFIG = dict(
    vocab_size=1024, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
    num_attention_heads=2, num_key_value_heads=1, head_dim=32, sliding_window=64,
    layer_types=["sliding_attention", "full_attention"], global_head_dim=32, num_experts=4,
    top_k_experts=2, moe_intermediate_size=64, pad_token_id=0, eos_token_id=1, bos_token_id=2,
)
VISION_CONFIG = dict(
    hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=1,
    num_key_value_heads=1, head_dim=16, position_embedding_size=16, patch_size=4,
)
CANVAS_LENGTH = 32
GENERATION_DEFAULTS = dict(
    max_denoising_steps=48, t_min=0.4, t_max=0.8, stability_threshold=1,
    confidence_threshold=0.005, eos_token_id=[1], pad_token_id=0, bos_token_id=2,
)


def _corpus_text() -> str:
    return resources.files("dgemma_lsp.engine.model").joinpath("data/tiny_corpus.txt").read_text("utf-8")


def recipe_hash() -> str:
    """Changes whenever anything that shapes the tiny model changes."""
    recipe = json.dumps(
        [TINY_SEED, TOKENIZER_VOCAB, SPECIAL_TOKENS, CHAT_TEMPLATE, TEXT_CONFIG, VISION_CONFIG,
         CANVAS_LENGTH, GENERATION_DEFAULTS, _corpus_text()],
        sort_keys=True,
    )
    return hashlib.sha256(recipe.encode()).hexdigest()[:16]


def builtin_model_folder(spec: str, *, build: bool = True) -> Path | None:
    """The folder of a built-in model (`tiny-random`'s built first unless `build` is False: building
    imports torch); None when `spec` names none."""
    if spec == TINY:
        folder = shipped_tiny_dir()
        if not (folder / "model.safetensors").is_file():
            raise ModelNotFoundError(
                f"this installation has no trained tiny model ({folder} is missing its weights); "
                f"reinstall dgemma-lsp, or use --model {TINY_RANDOM}"
            )
        return folder
    if spec == TINY_RANDOM:
        return ensure_tiny_random_model() if build else tiny_random_dir()
    return None


def shipped_tiny_dir() -> Path:
    """The trained tiny model's folder inside the installed package (a plain folder: installs are never zipped)."""
    return Path(str(resources.files("dgemma_lsp.engine.model").joinpath("data/tiny")))


def tiny_random_dir() -> Path:
    """Where the built random model lives, under the cache root (`DGEMMA_LSP_CACHE` overrides it)."""
    return cache_root() / f"tiny-{recipe_hash()}"


def ensure_tiny_random_model() -> Path:
    """Build the random tiny model's folder if it is not cached yet; return its path."""
    folder = tiny_random_dir()
    if (folder / "model.safetensors").exists() and (folder / "tokenizer.json").exists():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    # Build into a temporary sibling and rename: two processes starting at once never see half a folder.
    staging = Path(tempfile.mkdtemp(prefix="tiny-build-", dir=folder.parent))
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # its "Writing model shards" bar is noise in an editor's log
        build_tiny_tokenizer().save_pretrained(staging)
        build_tiny_model().save_pretrained(staging)
        try:
            staging.rename(folder)
        except OSError:  # another process won the race; its folder is identical
            shutil.rmtree(staging, ignore_errors=True)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return folder


def build_tiny_tokenizer():
    """Train a byte-level BPE on the shipped corpus and wrap it for transformers."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TOKENIZER_VOCAB,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_corpus_text().splitlines(keepends=True), trainer=trainer)
    for token_id, token in enumerate(SPECIAL_TOKENS):
        assert tokenizer.token_to_id(token) == token_id, f"special token {token} must have id {token_id}"
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        pad_token="<pad>", eos_token="<eos>", bos_token="<bos>", unk_token="<unk>",
        chat_template=CHAT_TEMPLATE,
    )


def build_tiny_model():
    """The tiny DiffusionGemma with seeded random weights and checkpoint-like generation defaults."""
    import torch
    from transformers import (
        DiffusionGemmaConfig,
        DiffusionGemmaForBlockDiffusion,
        DiffusionGemmaTextConfig,
        Gemma4VisionConfig,
    )
    from transformers.models.diffusion_gemma.generation_diffusion_gemma import (
        DiffusionGemmaGenerationConfig,
        EntropyBoundSamplerConfig,
    )

    # vision_config=None would still build the default 167M-parameter tower: pass a tiny one.
    config = DiffusionGemmaConfig(
        text_config=DiffusionGemmaTextConfig(**TEXT_CONFIG).to_dict(),
        vision_config=Gemma4VisionConfig(**VISION_CONFIG),
        canvas_length=CANVAS_LENGTH,
        image_token_id=1023, boi_token_id=1022, eoi_token_id=1021,
    )
    torch.manual_seed(TINY_SEED)
    model = DiffusionGemmaForBlockDiffusion(config)
    model.generation_config = DiffusionGemmaGenerationConfig(
        sampler_config=EntropyBoundSamplerConfig(entropy_bound=0.1), **GENERATION_DEFAULTS
    )
    return model
