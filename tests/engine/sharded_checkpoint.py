"""Builds a sharded DiffusionGemma checkpoint big enough to measure a load: ~305 MB in fp32, 12 shards.

Experts dominate as in the real model (64 experts x 6 layers are ~95% of the
weights); the tokenizer and generation config are the tiny model's. Run as a
script (`python sharded_checkpoint.py DIR`) so the test process never holds the
weights itself.
"""

import shutil
import sys
from pathlib import Path

SHARD_SIZE = "40MB"


def build(folder: Path) -> None:
    import torch
    from transformers import (
        DiffusionGemmaConfig,
        DiffusionGemmaForBlockDiffusion,
        DiffusionGemmaTextConfig,
        Gemma4VisionConfig,
    )

    from dgemma_lsp.engine.model.tiny_model import VISION_CONFIG, ensure_tiny_random_model

    text = DiffusionGemmaTextConfig(
        vocab_size=1024, hidden_size=256, intermediate_size=512, num_hidden_layers=6,
        num_attention_heads=4, num_key_value_heads=2, head_dim=64, sliding_window=64,
        layer_types=["sliding_attention"] * 5 + ["full_attention"], global_head_dim=64,
        num_experts=64, top_k_experts=4, moe_intermediate_size=256,
        pad_token_id=0, eos_token_id=1, bos_token_id=2,
    )
    config = DiffusionGemmaConfig(
        text_config=text.to_dict(), vision_config=Gemma4VisionConfig(**VISION_CONFIG), canvas_length=32,
        image_token_id=1023, boi_token_id=1022, eoi_token_id=1021,
    )
    torch.manual_seed(0)
    DiffusionGemmaForBlockDiffusion(config).save_pretrained(folder, max_shard_size=SHARD_SIZE)
    tiny = ensure_tiny_random_model()
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
        shutil.copy(tiny / name, folder / name)


if __name__ == "__main__":
    build(Path(sys.argv[1]))
