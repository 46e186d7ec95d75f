"""How fast does a recipe's model train here: steps of the real objective on synthetic batches, eager and compiled.

`python bench/device/train_probe.py RECIPE TOKENIZER_DIR [--device cuda] [--steps 8] [--compile]
[--shape NAME:hidden,intermediate,layers,heads,kvHeads,moeIntermediate ...]`

For the recipe's model (and each `--shape`, eager only), `--steps` timed optimizer steps after two warm-ups
(accelerator.py's device, precision and fused AdamW; objective.py's loss with the recipe's knobs) on batches of
the recipe's size whose prompt lengths are drawn like the recipe's examples (SHORTEST_PROMPT): seconds a step, tokens a second, 6·N·D FLOP a second and
the share of PEAK_TFLOPS that is (MFU), and the peak memory. With `--compile`, then the same with the layers
and the LM head compiled (`train.compile` "layers", `train.compiledHead`), and the seconds the compile took.
One JSON line per variant on stdout, as it is measured (a cut run keeps what it measured); bench/device/
train-tiny.sh reads the lines to choose `train.compile` for its run. Knows the training modules; no data files.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

PEAK_TFLOPS = 790.0
"""bf16 dense matmul measured on this workplace's H200 (/work/.library/device/KINDS.md, 8192^3, random data)."""
SHORTEST_PROMPT = 60
"""Synthetic prompts are uniform from this to 0.8 x the recipe's maxPromptTokens: for tiny-code-gpu.json a mean of
~490, about its examples' (issue 51: a mean of 395 prompt tokens for 64-1,024-token contexts, plus a batch's
padding to its longest)."""


def _synthetic_batch(rng: random.Random, rows: int, vocab: int, canvas: int, end_id: int, longest: int,
                     width: int | None = None, spread: int = 64):
    """A batch whose rows' prompts are of like length (as the packer's buckets make them), random ids."""
    from dgemma_lsp.engine.training.objective import collate

    width = width or rng.randint(SHORTEST_PROMPT, longest)
    prompts = [[rng.randrange(8, vocab) for _ in range(max(8, width - rng.randrange(spread)))] for _ in range(rows)]
    canvases = []
    for _ in range(rows):
        answer = rng.randrange(1, canvas - 1)
        canvases.append([rng.randrange(8, vocab) for _ in range(answer)] + [end_id] + [0] * (canvas - answer - 1))
    return collate(prompts, canvases, 0, end_id)


def measure(recipe: dict, tokenizer, device: str, steps: int, *, compiled: bool, label: str) -> dict:
    import torch

    from dgemma_lsp.engine.training.accelerator import Accelerator, active_parameters
    from dgemma_lsp.engine.training.examples import end_of_turn_id
    from dgemma_lsp.engine.training.objective import LMHead, diffusion_loss
    from dgemma_lsp.engine.training.train import build_model

    schedule = dict(recipe["train"], compile="layers" if compiled else "none")
    accelerator = Accelerator.from_recipe(schedule, device)
    model = accelerator.prepare(build_model(recipe, tokenizer, recipe["seed"]).train())
    optimizer = accelerator.optimizer(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1)
    head = LMHead(model, compiled=compiled)
    generator = accelerator.generator(0)
    rng = random.Random(0)
    vocab, end_id = len(tokenizer), end_of_turn_id(tokenizer)
    # The two warm-ups: the shortest and the longest prompts, so that a compiled model has met both sides of the
    # sliding window before the timed steps (a recompile inside them would be timed).
    longest = int(0.8 * recipe["data"]["maxPromptTokens"])
    widths = [SHORTEST_PROMPT, longest] + [None] * steps
    batches = [accelerator.to_device(_synthetic_batch(rng, schedule["batch"], vocab, recipe["model"]["canvas"], end_id,
                                                      longest, width)) for width in widths]
    if accelerator.is_cuda:
        torch.cuda.reset_peak_memory_stats()
    times, tokens = [], 0
    for index, batch in enumerate(batches):
        accelerator.synchronize()
        started = time.perf_counter()
        with accelerator.autocast():
            parts = diffusion_loss(model, batch, generator, self_conditioning=schedule["selfConditioning"],
                                   encoder_loss_weight=schedule["encoderLossWeight"], eps=schedule["eps"],
                                   draws=schedule.get("draws", 1), pad_weight=schedule.get("padWeight", 1.0),
                                   answer_encoder_weight=schedule.get("answerEncoderWeight", 0.0),
                                   clean_weight=schedule.get("cleanWeight", 1.0), head=head)
        optimizer.zero_grad(set_to_none=True)
        parts.total.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), schedule["clipNorm"])
        optimizer.step()
        accelerator.synchronize()
        times.append(time.perf_counter() - started)
        if index >= 2:
            tokens += int(batch.prompt_mask.sum()) + batch.canvas_ids.numel()
    timed = sum(times[2:])
    flop_parameters = active_parameters(model)
    rate = 6 * flop_parameters * tokens / timed
    return {"variant": label, "compiled": compiled, "device": accelerator.describe()["device"],
            "parameters": sum(p.numel() for p in model.parameters()), "flopParameters": flop_parameters,
            "batch": schedule["batch"], "steps": len(times) - 2, "secondsPerStep": round(timed / (len(times) - 2), 4),
            "firstStepsSeconds": [round(t, 2) for t in times[:2]], "tokensPerSecond": round(tokens / timed),
            "tflops6ND": round(rate / 1e12, 2), "mfu": round(rate / (PEAK_TFLOPS * 1e12), 4),
            "peakMemoryGiB": round(torch.cuda.max_memory_allocated() / 2**30, 1) if accelerator.is_cuda else None,
            "finalLoss": round(parts.total.item(), 3)}


def main(argv=None) -> int:
    from transformers import AutoTokenizer

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("recipe", type=Path)
    parser.add_argument("tokenizer", type=Path)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--batch", type=int, help="examples a step (default: the recipe's)")
    parser.add_argument("--compile", action="store_true", help="also measure the compiled layers and head")
    parser.add_argument("--shape", action="append", default=[],
                        help="NAME:hidden,intermediate,layers,heads,kvHeads,moeIntermediate: another shape, eager")
    args = parser.parse_args(argv)
    recipe = json.loads(args.recipe.read_text())
    if args.batch:
        recipe["train"]["batch"] = args.batch
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    variants = [("recipe", recipe, False)] + ([("recipe-compiled", recipe, True)] if args.compile else [])
    for spec in args.shape:
        name, numbers = spec.split(":")
        hidden, intermediate, layers, heads, kv_heads, moe = (int(n) for n in numbers.split(","))
        shaped = json.loads(json.dumps(recipe))
        shaped["model"].update(hidden=hidden, intermediate=intermediate, layers=layers, heads=heads,
                               kvHeads=kv_heads, moeIntermediate=moe)
        variants.append((name, shaped, False))
    for label, variant, compiled in variants:
        started = time.perf_counter()
        try:
            line = measure(variant, tokenizer, args.device, args.steps, compiled=compiled, label=label)
        except Exception as error:  # noqa: BLE001 - one variant's failure (a compile error, memory) is a figure too
            line = {"variant": label, "compiled": compiled, "error": f"{type(error).__name__}: {error}"[:500]}
        line["wallSeconds"] = round(time.perf_counter() - started, 1)
        sys.stdout.write(json.dumps(line) + "\n")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
