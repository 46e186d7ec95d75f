"""The held-out figures a recipe is judged by (engine/training/validation.py), on the shipped tiny model's weights."""

import json

import pytest
import torch
from transformers import AutoTokenizer, DiffusionGemmaForBlockDiffusion

from dgemma_lsp.engine.model.tiny_model import shipped_tiny_dir
from dgemma_lsp.engine.training.examples import end_of_turn_id
from dgemma_lsp.engine.training.validation import VALIDATION_SEED, score, validation_examples


@pytest.mark.timeout(300)
def test_left_to_right_accuracy_is_the_decoders_reading_of_a_partly_written_canvas():
    """Batched over left-padded prompts with one encoding for every k, it is what the model's own forward
    gives hole by hole: the true answer left of k, the metric's noise from k on, the argmax at k."""
    torch.set_num_threads(1)
    folder = shipped_tiny_dir()  # trained weights: hits are not all 0
    model = DiffusionGemmaForBlockDiffusion.from_pretrained(folder, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    recipe = json.loads((folder / "training.json").read_text())["recipe"]
    end = end_of_turn_id(tokenizer)
    examples = validation_examples(tokenizer, 32, tuple(recipe["data"]["heldOutSources"]), count=16)
    figures = score(model, examples, tokenizer.pad_token_id, end)

    noise = torch.randint(0, model.config.text_config.vocab_size, (16, 32),
                          generator=torch.Generator().manual_seed(VALIDATION_SEED + 1))
    hits = count = 0
    with torch.no_grad():
        for row, example in enumerate(examples):
            for k in range(example.canvas_ids.index(end) + 1):  # the answer and its end-of-turn
                canvas = noise[row].clone()
                canvas[:k] = torch.tensor(example.canvas_ids[:k])
                logits = model(input_ids=torch.tensor([example.prompt_ids]), decoder_input_ids=canvas[None]).logits
                hits += int(logits[0, k].argmax()) == example.canvas_ids[k]
                count += 1
    assert hits > 0
    assert figures["answerAccuracyLeftToRight"] == pytest.approx(hits / count, abs=1.01 / count)  # one near-tie
