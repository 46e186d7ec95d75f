"""A fixed held-out validation set and the figures a recipe is judged by: answer-token accuracy and loss.

The set: `count` holes cut by `ExampleMaker` (fixed settings, below, whatever the recipe's)
from files of the sources a recipe holds out (`data.heldOutSources`: never trained on), with
the run's tokenizer. Arms of an A/B that share a tokenizer are scored on the very same holes.

The figures, per checkpoint or snapshot, from one decoder pass with no self-conditioning
(the first step of `generate`): for a canvas of pure noise (t = 1) and half noise (t = 0.5),
the answer-token accuracy (answer tokens + the first end-of-turn), the answer loss, and the
share of holes whose whole answer is right at t = 1. Noise is drawn from a fixed seed, so
two checkpoints see the same canvases. Beside them, `answerLossCausal`: the encoder's next-token
loss over the answer given the prompt and the answer's earlier tokens (what the shared weights
know of the infill, read causally; objective.py's answer_encoder_weight trains it), and
`answerAccuracyLeftToRight`: the decoder's accuracy at answer position k when the canvas holds the
true answer left of k and noise from k on, over every k (its own noise seed). It is the decoder's
reading of a canvas it has partly written: what a sampler can build on step after step. (On the
tiny run's snapshot at 2.5 CPU-hours: 14.9% where the causal reading of the same positions scored 34.6%, and
the decoder from pure noise got the first token nearly as often as the causal reading did, 26%
against 30%.)

`python -m dgemma_lsp.engine.training.validation RUN_DIR...` scores every snapshot of each
run not yet scored and appends to RUN_DIR/validation.jsonl; `--layout suffix-first` scores the
same holes laid out suffix-first into RUN_DIR/validation-suffix-first.jsonl (the recipes train on
both: which one the weights read better is issue 28's prompt-layout question); `--set focus` cuts
them from focus.FOCUS_HELD_OUT instead (short algorithm functions, the kind HumanEval asks for, that
no run trains on) into RUN_DIR/validation-focus.jsonl. Knows torch and the
training modules; knows nothing of LSP.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

VALIDATION_SEED = 20261125
CONTEXT_TOKENS = (64, 256)
MAX_PROMPT_TOKENS = 384
KIND_WEIGHTS = {"line": 0.35, "expression": 0.15, "statement": 0.25, "block": 0.15, "lines": 0.1}
"""The product's mix of holes, multi-line included: fixed, so every recipe is judged on one set."""
NOISE_LEVELS = (1.0, 0.5)


def validation_examples(tokenizer, canvas_length: int, held_out: tuple[str, ...], count: int = 300,
                        languages=("python",), layout: str = "natural", python_path: list[str] | None = None):
    """`count` examples from the held-out sources' files, the same for one tokenizer every time.

    `layout`: the prompt layout; the holes are the same in both (no draw decides the layout), unless
    a prompt over MAX_PROMPT_TOKENS in one layout and not the other shifts the stream (main reports it).
    `python_path`: read the held-out sources from these folders (focus.py's) instead of the environment."""
    from .corpus import collect
    from .examples import ExampleMaker

    assert held_out, "the recipe holds no source out: there is nothing to validate on"
    files, _ = collect(8_000_000, VALIDATION_SEED, languages=languages, only=held_out, python_path=python_path)
    assert files, f"no files of the held-out sources {held_out} on this machine"
    maker = ExampleMaker(tokenizer, canvas_length, max_prompt_tokens=MAX_PROMPT_TOKENS,
                         context_tokens=CONTEXT_TOKENS, kind_weights=KIND_WEIGHTS, layout=layout)
    examples, index = [], 0
    while len(examples) < count and index < 50 * count:
        rng = random.Random(VALIDATION_SEED * 1_000_003 + index)
        index += 1
        found = maker.make(files[rng.randrange(len(files))], rng)
        if found is not None:
            examples.append(found)
    return examples


def score(model, examples, pad_id: int, end_id: int, batch_size: int = 16) -> dict:
    """Answer accuracy and loss at each noise level, and exact answers at t = 1 (model in eval mode).

    On the model's device; the noise is drawn on the CPU from the fixed seeds, so a GPU scores the same canvases."""
    import torch
    import torch.nn.functional as F
    from transformers import DynamicCache

    from ..model.cache_keyword import with_cache
    from .objective import answer_encoder_loss, collate, softcapped_logits

    model.eval()
    device = model.device
    vocab = model.config.text_config.vocab_size
    generator = torch.Generator().manual_seed(VALIDATION_SEED)
    sums = {t: [0.0, 0, 0] for t in NOISE_LEVELS}  # loss sum, hits, positions
    exact, causal_sum, causal_count = 0, 0.0, 0
    left_generator = torch.Generator().manual_seed(VALIDATION_SEED + 1)  # the t-level draws stay as they were
    left_hits, left_count = 0, 0
    with torch.no_grad():
        for start in range(0, len(examples), batch_size):
            rows = examples[start:start + batch_size]
            batch = collate([e.prompt_ids for e in rows], [e.canvas_ids for e in rows], pad_id, end_id)
            batch = type(batch)(*(tensor.to(device) for tensor in
                                  (batch.prompt_ids, batch.prompt_mask, batch.canvas_ids, batch.answer_mask)))
            positions = (batch.prompt_mask.cumsum(-1) - 1).clamp(min=0)
            cache = DynamicCache(config=model.config.text_config)
            encoded = model.model.encoder(input_ids=batch.prompt_ids, attention_mask=batch.prompt_mask,
                                          position_ids=positions, **with_cache(cache), use_cache=True)
            count = int(batch.answer_mask.sum())
            causal_sum += float(answer_encoder_loss(model, batch, cache, encoded)) * count
            causal_count += count
            for t in NOISE_LEVELS:
                cache = DynamicCache(config=model.config.text_config)
                model.model.encoder(input_ids=batch.prompt_ids, attention_mask=batch.prompt_mask,
                                    position_ids=positions, **with_cache(cache), use_cache=True)
                shape = batch.canvas_ids.shape
                corrupt = (torch.rand(shape, generator=generator) < t).to(device)
                noise = torch.randint(0, vocab, shape, generator=generator).to(device)
                canvas = torch.where(corrupt, noise, batch.canvas_ids)
                logits = softcapped_logits(model, _decode(model, batch, canvas, cache))
                losses = F.cross_entropy(logits.reshape(-1, vocab), batch.canvas_ids.reshape(-1),
                                         reduction="none").view(shape)
                hits = logits.argmax(-1) == batch.canvas_ids
                answer = batch.answer_mask
                sums[t][0] += float(losses[answer].sum())
                sums[t][1] += int(hits[answer].sum())
                sums[t][2] += int(answer.sum())
                if t == 1.0:
                    exact += int((hits | ~answer).all(-1).sum())
            # Left to right: the decoder never writes the cache, so one encoding serves every k.
            noise = torch.randint(0, vocab, batch.canvas_ids.shape, generator=left_generator).to(device)
            answer, columns = batch.answer_mask, torch.arange(batch.canvas_ids.shape[1], device=device)
            for k in range(int(answer.sum(-1).max())):
                canvas = torch.where(columns < k, batch.canvas_ids, noise)
                guess = softcapped_logits(model, _decode(model, batch, canvas, cache)[:, k]).argmax(-1)
                left_hits += int(((guess == batch.canvas_ids[:, k]) & answer[:, k]).sum())
                left_count += int(answer[:, k].sum())
    figures = {"holes": len(examples), "exactAtT1": round(exact / len(examples), 4),
               "answerLossCausal": round(causal_sum / causal_count, 4),
               "answerAccuracyLeftToRight": round(left_hits / left_count, 4)}
    for t, (loss, hits, count) in sums.items():
        figures[f"answerAccuracyT{t:g}"] = round(hits / count, 4)
        figures[f"answerLossT{t:g}"] = round(loss / count, 4)
    return figures


def _decode(model, batch, canvas, cache):
    """The decoder's last hidden states for `canvas`, reading the cache of the batch's prompts."""
    import torch

    from ..model.cache_keyword import with_cache

    return model.model.decoder(
        decoder_input_ids=canvas, **with_cache(cache),
        decoder_attention_mask=torch.cat([batch.prompt_mask, torch.ones_like(canvas)], -1),
        decoder_position_ids=batch.prompt_mask.sum(-1, keepdim=True) + torch.arange(canvas.shape[1], device=canvas.device),
    ).last_hidden_state


def run_snapshots(run_dir: Path) -> list[Path]:
    """A run's snapshots in the order they were taken: cpu-NNNNNN.pt (CPU-seconds), then gpu-NNNNNN.pt
    (GPU-seconds: a run that went on on a GPU after a CPU)."""
    folder = run_dir / "snapshots"
    return sorted(folder.glob("cpu-*.pt")) + sorted(folder.glob("gpu-*.pt"))


def load_weights(run_dir: Path, path: Path):
    """The run's model (recipe from its training record or checkpoint) with the weights of `path`."""
    import torch
    from transformers import AutoTokenizer

    from .train import build_model

    recipe = json.loads((run_dir / "recipe.json").read_text())
    tokenizer = AutoTokenizer.from_pretrained(run_dir / "tokenizer")
    model = build_model(recipe, tokenizer, recipe["seed"])
    state = torch.load(path, weights_only=False)
    model.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in state["model"].items()})
    return model, tokenizer, recipe, state


def main(argv=None) -> int:
    import torch

    from .examples import end_of_turn_id

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run_dirs", nargs="+", type=Path)
    parser.add_argument("--holes", type=int, default=300)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu", help="where to score (cuda: the same figures, faster)")
    parser.add_argument("--latest", action="store_true", help="score only the newest snapshot of each run")
    parser.add_argument("--upto", type=float, help="score only snapshots of at most this many CPU-seconds "
                        "(GPU-seconds for a GPU run's gpu-NNNNNN.pt)")
    parser.add_argument("--layout", choices=("natural", "suffix-first"), default="natural",
                        help="the prompt layout of the holes (suffix-first: into validation-suffix-first.jsonl)")
    parser.add_argument("--set", choices=("held-out", "focus"), default="held-out",
                        help="focus: holes from focus.FOCUS_HELD_OUT, short functions no run trains on "
                             "(into validation-focus.jsonl)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    focus_path, focus_names = None, ()
    if args.set == "focus":
        from .focus import FOCUS_HELD_OUT, ensure_installed, package_names

        focus_path, focus_names = [str(ensure_installed(FOCUS_HELD_OUT))], package_names(FOCUS_HELD_OUT)
    cached, same = {}, {}
    for run_dir in args.run_dirs:
        name = "validation" + ("-focus" if args.set == "focus" else "")
        out = run_dir / (f"{name}.jsonl" if args.layout == "natural" else f"{name}-{args.layout}.jsonl")
        done = {json.loads(line)["snapshot"] for line in out.read_text().splitlines()} if out.exists() else set()
        snapshots = run_snapshots(run_dir)
        if args.upto is not None:
            snapshots = [s for s in snapshots if int(s.stem.split("-")[1]) <= args.upto]
        for snapshot in snapshots[-1:] if args.latest else snapshots:
            if snapshot.name in done:
                continue
            started = time.process_time()
            model, tokenizer, recipe, state = load_weights(run_dir, snapshot)
            key = (str((run_dir / "tokenizer" / "tokenizer.json").read_bytes().__hash__()), recipe["model"]["canvas"])
            if key not in cached:
                held_out = focus_names or tuple(recipe["data"]["heldOutSources"])
                holes = (tokenizer, recipe["model"]["canvas"], held_out, args.holes)
                cached[key] = validation_examples(*holes, layout=args.layout, python_path=focus_path)
                if args.layout != "natural":  # how many are the natural layout's holes, in order
                    natural = validation_examples(*holes, python_path=focus_path)
                    same[key] = sum(a.middle == b.middle for a, b in zip(natural, cached[key], strict=True))
            if args.device != "cpu":  # fp32 weights: CUDA's grouped GEMM takes bf16 only (accelerator.py)
                model.set_experts_implementation("eager")
            figures = score(model.to(args.device), cached[key], tokenizer.pad_token_id, end_of_turn_id(tokenizer))
            if key in same:
                figures["sameHolesAsNatural"] = same[key]
            line = {"snapshot": snapshot.name, "cpuSeconds": round(state.get("cpuSeconds") or 0.0, 1),
                    **{key: state[key] for key in ("gpuSeconds", "flops") if key in state}, "step": state["step"],
                    "answerTokens": state["answerTokens"], **figures,
                    "scoreCpuSeconds": round(time.process_time() - started, 1)}
            with out.open("a") as file:
                file.write(json.dumps(line) + "\n")
            sys.stdout.write(f"{run_dir.name} {json.dumps(line)}\n")
            sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
