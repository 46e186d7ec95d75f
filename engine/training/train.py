"""`dgemma-lsp train RUN_DIR [--config FILE]`: train a small DiffusionGemma that writes code.

One run folder holds everything: `corpus.json` (the manifest: every source, its licence and
token count, and what was left out), `tokenizer/` (a byte-level BPE trained on the same
corpus), `recipe.json` (a resume reads it), `checkpoint.pt` (model, optimizer, step, RNG: a run
resumes where it stopped; the optimizer's moments in bf16, so that a long run's checkpoint is small
enough to commit: the machine that trains it is not kept between sessions, see runs/README.md), and
at the end `model/` — a `save_pretrained` folder loadable like any checkpoint (`--model
RUN_DIR/model`), with the manifest and the training record beside the weights.

Cost is counted in CPU-seconds of the training processes (`time.process_time`, summed over every
rank and every session of the run), not wall time: the machine is shared. `--procs N` trains in N
data-parallel processes of one thread each (parallel.py: on 2 cores, 1.5-1.8x the steps an hour
of one process, for up to a fifth more CPU-seconds a step). The checkpoint keeps the CPU-seconds
and the answer tokens the decoder has been trained on; `log.jsonl` gets one line per
checkpoint (step, CPU-seconds, tokens, answer tokens, the window's mean losses), and
`snapshots/cpu-NNNNNN.pt` keeps the weights every `snapshotEveryCpuS` and when the schedule
ends, for a curve of quality per CPU-hour (bench/tiny_code.py and validation.py read them). A recipe's
`checkpointEveryCpuS` saves by CPU time instead of by step.

The model is transformers' own DiffusionGemmaForBlockDiffusion from a config (the recipe's
`model` section); examples come from examples.py, the loss from objective.py. Deterministic
by seed: the corpus sample, the tokenizer, the initial weights and example i of the stream.
Knows torch, transformers and tokenizers; knows nothing of LSP.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import random
import sys
import time
from importlib import resources
from pathlib import Path

from .parallel import STOPPED, Ranks, launch

log = logging.getLogger(__name__)

SPECIAL_TOKENS = ["<pad>", "<eos>", "<bos>", "<unk>", "<|turn>", "<turn|>"]
"""Pinned ids: pad 0, eos 1, bos 2, as in the real checkpoint; the turn markers of Gemma's chat template."""
DEFAULT_CONFIG = "tiny-code.json"


def load_recipe(path: str | None) -> dict:
    if path is None:
        text = resources.files("dgemma_lsp.engine.training").joinpath(f"configs/{DEFAULT_CONFIG}").read_text()
    else:
        text = Path(path).read_text()
    return json.loads(text)


def train_tokenizer(texts: list[str], vocab_size: int, chat_template: str):
    """A byte-level BPE over the corpus, special ids pinned, wrapped for transformers."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(texts, trainer=trainer)
    for token_id, token in enumerate(SPECIAL_TOKENS):
        assert tokenizer.token_to_id(token) == token_id, f"special token {token} must have id {token_id}"
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", eos_token="<eos>",
                                   bos_token="<bos>", unk_token="<unk>", chat_template=chat_template)


def build_model(recipe: dict, tokenizer, seed: int):
    """The recipe's DiffusionGemma, seeded, with generation defaults that end a turn like the real checkpoint."""
    import torch
    from transformers import DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion, DiffusionGemmaTextConfig
    from transformers.models.diffusion_gemma.generation_diffusion_gemma import (
        DiffusionGemmaGenerationConfig,
        EntropyBoundSamplerConfig,
    )

    from ..model.tiny_model import VISION_CONFIG
    from .examples import end_of_turn_id

    shape = recipe["model"]
    vocab = len(tokenizer) + shape.get("spareIds", 64)  # image/boi/eoi ids live above the tokenizer's
    from transformers import Gemma4VisionConfig

    text_config = DiffusionGemmaTextConfig(
        vocab_size=vocab, hidden_size=shape["hidden"], intermediate_size=shape["intermediate"],
        num_hidden_layers=shape["layers"], num_attention_heads=shape["heads"],
        num_key_value_heads=shape["kvHeads"], head_dim=shape["headDim"], global_head_dim=shape["headDim"],
        sliding_window=shape["slidingWindow"],
        layer_types=["sliding_attention"] * (shape["layers"] - 1) + ["full_attention"],
        num_experts=shape["experts"], top_k_experts=shape["topK"], moe_intermediate_size=shape["moeIntermediate"],
        pad_token_id=0, eos_token_id=1, bos_token_id=2,
    )
    config = DiffusionGemmaConfig(
        text_config=text_config.to_dict(), vision_config=Gemma4VisionConfig(**VISION_CONFIG),
        canvas_length=shape["canvas"], image_token_id=vocab - 1, boi_token_id=vocab - 2, eoi_token_id=vocab - 3,
    )
    torch.manual_seed(seed)
    model = DiffusionGemmaForBlockDiffusion(config)
    generation = recipe.get("generation", {})
    model.generation_config = DiffusionGemmaGenerationConfig(
        sampler_config=EntropyBoundSamplerConfig(entropy_bound=generation.get("entropyBound", 0.1)),
        max_denoising_steps=generation.get("steps", 16), t_min=0.4, t_max=0.8, stability_threshold=1,
        confidence_threshold=0.005, eos_token_id=[1, end_of_turn_id(tokenizer)], pad_token_id=0, bos_token_id=2,
    )
    return model


class ExampleStream:
    """Example i of the run, for any i: a file picked and a hole cut by an RNG seeded with (seed, i).

    With `focus_files` and a `focus_share` > 0, that share of examples (drawn by the same RNG) comes
    from the focus corpus (focus.py) instead; without them the stream is what it always was."""

    def __init__(self, files, maker, seed: int, focus_files=(), focus_share: float = 0.0) -> None:
        self.files, self.maker, self.seed = files, maker, seed
        self.focus_files, self.focus_share = list(focus_files), focus_share if focus_files else 0.0

    def example(self, index: int):
        rng = random.Random(self.seed * 1_000_003 + index)
        files = self.focus_files if self.focus_share and rng.random() < self.focus_share else self.files
        for _ in range(16):
            found = self.maker.make(files[rng.randrange(len(files))], rng)
            if found is not None:
                return found
        raise RuntimeError("no example in 16 files: the corpus has no holes that fit the canvas")


def run(args: argparse.Namespace) -> int:
    """`dgemma-lsp train`: in this process, or in `--procs` data-parallel ones (parallel.py)."""
    recipe = run_recipe(args)  # read here, once: rank 0 rewrites recipe.json while the others would read it
    if args.procs > 1:
        return launch(train, (args, recipe), args.procs)
    return train(args, recipe)


def run_recipe(args: argparse.Namespace) -> dict:
    """The recipe the run trains by: a resume's own recipe.json unless --config names one, --steps applied."""
    recipe_file = Path(args.run_dir) / "recipe.json"
    if args.config is None and recipe_file.exists():  # a resume keeps its own recipe
        recipe = json.loads(recipe_file.read_text())
    else:
        recipe = load_recipe(args.config)
    if args.steps:  # the schedule's length (its cosine reads it): kept, so a plain resume follows the same schedule
        recipe["train"]["steps"] = args.steps
    return recipe


def train(args: argparse.Namespace, recipe: dict, ranks: Ranks | None = None) -> int:
    """Train (or resume) the run by `recipe` (`run_recipe`); `ranks`: this process's place in a data-parallel run.

    In a data-parallel run every rank returns from here having made the same collective calls; rank 0
    then still saves and exports while the others wait for it in parallel.py's final barrier."""
    import torch

    from .accelerator import Accelerator, CostMeter, Deadline, active_parameters
    from .corpus import collect
    from .examples import ExampleMaker
    from .objective import LMHead, collate, diffusion_loss

    began = time.monotonic()  # the time budget and the GPU-seconds count from here (accelerator.py)
    ranks = ranks or Ranks()
    run_dir = Path(args.run_dir)
    recipe_file = run_dir / "recipe.json"
    seed = recipe["seed"]
    torch.set_num_threads(args.threads or torch.get_num_threads())
    data, schedule = recipe["data"], recipe["train"]

    shards = getattr(args, "examples", None)  # examples cut ahead by packing.py, which read the corpus (issue 51)
    files, focus_files = [], []
    if shards is None:
        files, manifest = collect(data["corpusBytes"], seed, languages=tuple(data["languages"]),
                                  held_out=tuple(data.get("heldOutSources", ())))
        focus_files, focus_manifest = _focus_corpus(data, seed, ranks)
    tokenizer_dir = run_dir / "tokenizer"
    if ranks.is_main:  # the others wait for its files
        run_dir.mkdir(parents=True, exist_ok=True)
        # What validation.py rebuilds and a resume reads; replaced by a rename, so a run killed mid-write keeps the old one.
        recipe_file.with_suffix(".tmp").write_text(json.dumps(recipe, indent=1) + "\n")
        recipe_file.with_suffix(".tmp").replace(recipe_file)
        if not (tokenizer_dir / "tokenizer.json").exists():
            assert shards is None, f"{tokenizer_dir} is missing: the shards were cut with a run's tokenizer"
            from ..model.tiny_model import CHAT_TEMPLATE

            tokenizer = train_tokenizer([f.text for f in files], data["tokenizerVocab"], CHAT_TEMPLATE)
            tokenizer.save_pretrained(tokenizer_dir)
    ranks.barrier()
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    if ranks.is_main and files and not (run_dir / "corpus.json").exists():  # a resume keeps it: a CPU-minute to count
        _write_manifest(run_dir / "corpus.json", manifest, files, tokenizer)
    if ranks.is_main and focus_files:
        _add_focus_manifest(run_dir / "corpus.json", focus_manifest, focus_files, tokenizer, data["focusShare"])

    # `--device` (every subcommand's: cpu, cuda, auto) over the recipe's train.device, else the CPU
    accelerator = Accelerator.from_recipe(schedule, getattr(args, "device", None))
    model = build_model(recipe, tokenizer, seed)
    params = sum(p.numel() for p in model.parameters())
    checkpoint = run_dir / "checkpoint.pt"
    state = torch.load(checkpoint, weights_only=False, map_location="cpu") if checkpoint.exists() else {}
    if not state and getattr(args, "init", None):  # a new run from earlier weights (a fresh optimizer): issue 51
        weights, state = initial_state(Path(args.init))
        model.load_state_dict(weights)
        state["initFrom"] = str(args.init)
    if "model" in state:
        model.load_state_dict(state["model"])
    model = accelerator.prepare(model)
    if shards is None:
        maker = ExampleMaker(tokenizer, recipe["model"]["canvas"], max_prompt_tokens=data["maxPromptTokens"],
                             context_tokens=tuple(data["contextTokens"]), suffix_first_share=data.get("suffixFirstShare", 0.0),
                             kind_weights=data.get("kindWeights"))
        stream, end_id = ExampleStream(files, maker, seed, focus_files, data.get("focusShare", 0.0)), maker.end_id
    else:
        from .examples import end_of_turn_id
        from .shards import ShardSource

        assert ranks.world == 1, "--examples trains in one process"
        end_id = end_of_turn_id(tokenizer)
        source = ShardSource(Path(shards), schedule["batch"], tokenizer.pad_token_id, end_id, seed)
    optimizer = accelerator.optimizer(model.parameters(), lr=schedule["lr"], betas=(0.9, 0.95),
                                      weight_decay=schedule["weightDecay"])
    step, tokens_seen = state.get("step", 0), state.get("tokens", 0)
    answer_seen, cpu_before = state.get("answerTokens", 0), state.get("cpuSeconds", 0.0)
    generator = accelerator.generator(seed)
    if "optimizer" in state:
        optimizer.load_state_dict(state["optimizer"])
        accelerator.restore_generator(generator, state["generator"], seed * 1_000_003 + step)
        log.info("resumed %s at step %d", run_dir, step)
    if not ranks.is_main:  # the checkpoint keeps rank 0's noise; another rank's is seeded by rank and start
        generator = accelerator.generator(seed * 1_000_003 + 7_919 * ranks.rank + step)
    meter = CostMeter(accelerator, active_parameters(model), gpu_seconds=state.get("gpuSeconds", 0.0),
                      flops=state.get("flops", 0.0), started=began)
    deadline = Deadline(getattr(args, "seconds", None) or schedule.get("maxWallS"), started=began)
    total_steps = schedule["steps"]
    batch_size = schedule["batch"]
    log.info("model: %.2fM parameters (%.2fM a token); %s; %d steps of %d examples in %d process(es); %s",
             params / 1e6, meter.flop_parameters / 1e6,
             f"{len(files)} files, {manifest['bytes'] / 1e6:.1f} MB of code" if files else f"examples from {shards}",
             total_steps, batch_size, ranks.world, json.dumps(accelerator.describe()))
    model.train()
    started, window, tokens_at_start, rate = time.perf_counter(), [], tokens_seen, 0.0
    cpu_started, cpu_spent = time.process_time(), 0.0  # cpu_spent: every rank's, since this start
    progress = _progress(total_steps, step, args.quiet or not ranks.is_main)
    stop = _StopRequest()
    draws, pad_weight = schedule.get("draws", 1), schedule.get("padWeight", 1.0)
    head = LMHead(model, compiled=schedule.get("compiledHead", False))
    every_cpu, snapshot_cpu = schedule.get("checkpointEveryCpuS"), schedule.get("snapshotEveryCpuS")

    def cpu_seconds() -> float:
        return cpu_before + cpu_spent

    def costs() -> dict:
        return {"cpuSeconds": cpu_seconds(), **meter.counters()}

    def spent() -> float:  # what the checkpoint and snapshot periods count: GPU-seconds on a GPU
        return meter.gpu_seconds() if accelerator.is_cuda else cpu_seconds()

    def save() -> None:
        ranks.check_in_step(model.parameters())
        if not ranks.is_main:
            return
        counters = {"cpuSeconds": cpu_seconds(), "answerTokens": answer_seen, **meter.counters()}
        _save_checkpoint(checkpoint, model, optimizer, generator, step, tokens_seen, counters)
        _log_line(run_dir / "log.jsonl", step=step, tokens=tokens_seen, window=window, **counters)
        log.info("step %d: %d tokens, answer loss %.3f, %.0f tokens/s this session", step, tokens_seen,
                 _window_means(window)["answerLoss"], rate)

    last_save, last_snapshot = spent(), spent() // snapshot_cpu * snapshot_cpu if snapshot_cpu else 0
    snapshot_name = "gpu" if accelerator.is_cuda else "cpu"
    if snapshot_cpu and step == 0 and ranks.is_main:
        _save_snapshot(run_dir, model, spent(), step, tokens_seen, answer_seen, snapshot_name, costs())
    while step < total_steps and deadline.allows_step(step):
        if ranks.any(stop.requested):  # Ctrl-C or SIGTERM: keep what was learned, resume later
            save()
            progress.close()
            log.info("stopped at step %d; checkpoint saved, run the same command to resume", step)
            return STOPPED
        if shards is None:
            examples = [stream.example(step * batch_size + k) for k in ranks.share(batch_size)]
            batch = collate([e.prompt_ids for e in examples], [e.canvas_ids for e in examples],
                            tokenizer.pad_token_id, end_id)
        else:
            batch = source.next_batch()
        batch = accelerator.to_device(batch)
        for group in optimizer.param_groups:
            group["lr"] = _learning_rate(schedule, step, deadline.lr_total(step, total_steps))
        with accelerator.autocast():
            parts = diffusion_loss(model, batch, generator, self_conditioning=schedule["selfConditioning"],
                                   encoder_loss_weight=schedule["encoderLossWeight"], eps=schedule["eps"],
                                   draws=draws, pad_weight=pad_weight, noise_floor=schedule.get("noiseFloor", 0.0),
                                   answer_encoder_weight=schedule.get("answerEncoderWeight", 0.0),
                                   clean_weight=schedule.get("cleanWeight", 1.0), head=head)
        optimizer.zero_grad(set_to_none=True)
        parts.total.backward()
        ranks.average_gradients(model.parameters())
        torch.nn.utils.clip_grad_norm_(model.parameters(), schedule["clipNorm"])
        optimizer.step()
        step += 1
        # Counters are summed over the ranks, losses averaged: every rank logs and decides alike.
        tokens, answers, cpu_spent, *losses = ranks.sum(
            [int(batch.prompt_mask.sum()) + batch.canvas_ids.numel(), parts.answer_tokens,
             time.process_time() - cpu_started, parts.diffusion, parts.encoder, parts.canvas_accuracy,
             parts.answer_loss, parts.answer_accuracy, parts.answer_encoder])
        tokens_seen += int(tokens)
        answer_seen += int(answers)
        meter.add_tokens(int(tokens))
        deadline.step_done(step)
        window = (window + [tuple(loss / ranks.world for loss in losses)])[-50:]  # floats: no graph kept
        rate = (tokens_seen - tokens_at_start) / max(time.perf_counter() - started, 1e-9)  # this session's rate
        progress.update(step, parts, rate, cpu_seconds())
        now = spent()
        if snapshot_cpu and now - last_snapshot >= snapshot_cpu:
            last_snapshot = now // snapshot_cpu * snapshot_cpu
            if ranks.is_main:
                _save_snapshot(run_dir, model, now, step, tokens_seen, answer_seen, snapshot_name, costs())
        due = now - last_save >= every_cpu if every_cpu else step % schedule["checkpointEvery"] == 0
        if due or step == total_steps or not deadline.allows_step(step):
            save()
            last_save = now
    progress.close()
    if not ranks.is_main:
        return 0
    if snapshot_cpu and (step == total_steps or deadline.ended):  # the model the schedule ends with, on the curve too
        _save_snapshot(run_dir, model, spent(), step, tokens_seen, answer_seen, snapshot_name, costs())
    record = {
        "recipe": recipe, "steps": step, "tokens": tokens_seen, "parameters": params,
        "cpuSeconds": cpu_seconds(), "answerTokens": answer_seen, "finalLoss": _window_means(window),
        **meter.counters(), "flopParameters": meter.flop_parameters, **accelerator.describe(),
        "stoppedBy": "time" if deadline.ended else "steps",
        **({"examples": source.counters()} if shards is not None else {}),
        **({"initFrom": state["initFrom"]} if "initFrom" in state else {}),
    }
    export(model, tokenizer, run_dir / "model", record, run_dir / "corpus.json")
    log.info("done: %s", json.dumps(record["finalLoss"]))
    return 0


def export(model, tokenizer, folder: Path, record: dict, manifest: Path) -> None:
    """A loadable checkpoint folder: bf16 safetensors (small enough to ship), tokenizer, manifest, record."""
    import shutil

    import torch

    folder.mkdir(parents=True, exist_ok=True)
    model.to(torch.bfloat16).save_pretrained(folder)
    model.to(torch.float32)
    tokenizer.save_pretrained(folder)
    if manifest.exists():
        shutil.copy(manifest, folder / "corpus.json")
    else:  # a GPU run whose packer was stopped before it counted the corpus: the weights still come back
        log.warning("%s is missing: the model is exported without its manifest, and ship refuses it", manifest)
    (folder / "training.json").write_text(json.dumps(record, indent=1) + "\n")


CARRIED_COUNTERS = ("tokens", "answerTokens", "cpuSeconds", "gpuSeconds", "flops")
"""What a run started from a shipped model (`train --init`) carries on from its training record: its cost."""


def initial_state(folder: Path) -> tuple[dict, dict]:
    """The fp32 weights of a model folder (the shipped `tiny`, a run's `model/`) and the cost its training record
    counts, for a new run that starts from them with a fresh optimizer (`dgemma-lsp train --init`): the next GPU
    session goes on from the last shipped weights, whose checkpoint (weights and AdamW's moments) stays behind."""
    import torch
    from transformers import DiffusionGemmaForBlockDiffusion

    model = DiffusionGemmaForBlockDiffusion.from_pretrained(folder, dtype=torch.float32)
    record_file = folder / "training.json"
    record = json.loads(record_file.read_text()) if record_file.exists() else {}
    counters = {key: record[key] for key in CARRIED_COUNTERS if record.get(key) is not None}
    return model.state_dict(), counters


def _learning_rate(schedule: dict, step: int, total: int) -> float:
    """Linear warm-up, then cosine down to a tenth."""
    warmup = schedule["warmup"]
    if step < warmup:
        return schedule["lr"] * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return schedule["lr"] * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def _save_checkpoint(path: Path, model, optimizer, generator, step: int, tokens: int, counters=None) -> None:
    """Weights in fp32, AdamW's moments in bf16: a third smaller, for a checkpoint that is committed to git.

    `Optimizer.load_state_dict` casts the moments back to the weights' fp32; a resumed run then differs
    from an unbroken one by bf16's rounding of the moments, a relative 0.4% of one step's update."""
    import torch

    optimizer_state = optimizer.state_dict()
    optimizer_state["state"] = {  # on the CPU: a GPU run's checkpoint loads anywhere
        index: {key: value.to("cpu", torch.bfloat16) if key != "step" and value.is_floating_point() else value.cpu()
                for key, value in moments.items()}
        for index, moments in optimizer_state["state"].items()
    }
    staging = path.with_suffix(".tmp")
    weights = {name: value.detach().cpu() for name, value in model.state_dict().items()}
    torch.save({"model": weights, "optimizer": optimizer_state,
                "generator": generator.get_state(), "step": step, "tokens": tokens, **(counters or {})}, staging)
    staging.replace(path)  # a run killed mid-save keeps the previous checkpoint


def _save_snapshot(run_dir: Path, model, cpu: float, step: int, tokens: int, answer_tokens: int,
                   clock: str = "cpu", counters: dict | None = None) -> None:
    """The weights alone (bf16: half the size), named by the seconds spent (`clock`: cpu-NNNNNN.pt by CPU-seconds,
    gpu-NNNNNN.pt by GPU-seconds), for a curve of quality per hour; `counters`: the run's cost so far (its
    CPU-seconds, the CostMeter's GPU-seconds and FLOPs)."""
    import torch

    folder = run_dir / "snapshots"
    folder.mkdir(exist_ok=True)
    path = folder / f"{clock}-{int(cpu):06d}.pt"
    weights = {name: value.to("cpu", torch.bfloat16) if value.is_floating_point() else value.cpu()
               for name, value in model.state_dict().items()}
    torch.save({"model": weights, "cpuSeconds": cpu, **(counters or {}), "step": step, "tokens": tokens,
                "answerTokens": answer_tokens}, path.with_suffix(".tmp"))
    path.with_suffix(".tmp").replace(path)


def _window_means(window) -> dict:
    names = ("diffusion", "encoder", "canvasAccuracy", "answerLoss", "answerAccuracy", "answerEncoder")
    means = {name: _mean(w[i] for w in window) for i, name in enumerate(names)}
    if math.isnan(means["answerEncoder"]):  # a recipe without the encoder's answer loss
        del means["answerEncoder"]
    return means


def _log_line(path: Path, *, step: int, tokens: int, window, cpuSeconds: float, answerTokens: int,  # noqa: N803
              **cost) -> None:
    line = {"step": step, "cpuSeconds": round(cpuSeconds, 1), "tokens": tokens, "answerTokens": answerTokens, **cost,
            "wallClock": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **_window_means(window)}
    with path.open("a") as file:
        file.write(json.dumps(line) + "\n")


def _write_manifest(path: Path, manifest: dict, files, tokenizer) -> None:
    _count_tokens(manifest, files, tokenizer)
    path.write_text(json.dumps(manifest, indent=1) + "\n")


def _count_tokens(manifest: dict, files, tokenizer) -> None:
    """Fill in each source's tokens, and the total, in a manifest from corpus.collect."""
    tokens: dict[str, int] = {}
    for file in files:
        tokens[file.source] = tokens.get(file.source, 0) + len(tokenizer(file.text, add_special_tokens=False)["input_ids"])
    for source in manifest["sources"]:
        source["tokens"] = tokens.get(source["name"], 0)
    manifest["tokens"] = sum(tokens.values())


def _focus_corpus(data: dict, seed: int, ranks: Ranks):
    """The focus corpus's files and manifest when the recipe draws from it (`data.focusShare`), else none."""
    if not data.get("focusShare"):
        return [], None
    from .corpus import collect
    from .focus import FOCUS_HELD_OUT, FOCUS_PACKAGES, ensure_installed, focus_folder, package_names

    packages = tuple(data.get("focusPackages", FOCUS_PACKAGES))
    held_out = {name.lower() for name in (*package_names(FOCUS_HELD_OUT), *data.get("heldOutSources", ()))}
    trained_on_held_out = sorted(name for name in package_names(packages) if name.lower() in held_out)
    if trained_on_held_out:  # validation cuts its holes from these: training on them would grade the model on its homework
        raise ValueError(f"data.focusPackages names held-out sources {trained_on_held_out}: drop them from the recipe")
    if ranks.is_main:  # one pip at a time; the other ranks wait for its folder
        ensure_installed(packages)
    ranks.barrier()
    files, manifest = collect(data["corpusBytes"], seed, languages=("python",),
                              python_path=[str(focus_folder(packages))])
    assert files, f"the focus packages {packages} gave no files"
    manifest["packages"] = list(packages)
    return files, manifest


def _add_focus_manifest(path: Path, focus_manifest: dict, files, tokenizer, share: float) -> None:
    """Add the focus sources (each with its licence) to the run's manifest, once: what ships lists them."""
    from .focus import FOCUS_HELD_OUT

    manifest = json.loads(path.read_text())
    if manifest.get("focus", {}).get("packages") == focus_manifest["packages"]:
        return
    _count_tokens(focus_manifest, files, tokenizer)
    manifest["focus"] = {"packages": focus_manifest["packages"], "share": share, "heldOut": list(FOCUS_HELD_OUT),
                         "bytes": focus_manifest["bytes"], "tokens": focus_manifest["tokens"],
                         "sources": focus_manifest["sources"], "leftOut": focus_manifest["leftOut"]}
    path.write_text(json.dumps(manifest, indent=1) + "\n")


def _mean(values) -> float:
    values = list(values)
    return sum(values) / len(values) if values else float("nan")


class _StopRequest:
    """Turns SIGINT/SIGTERM into a flag the loop checks between steps, so a stop never tears a step."""

    def __init__(self) -> None:
        import signal

        self.requested = False
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._request)

    def _request(self, signum, frame) -> None:
        self.requested = True


class _progress:
    """A progress bar on stderr with loss and tokens/s (tqdm), or nothing with --quiet."""

    def __init__(self, total: int, start: int, quiet: bool) -> None:
        from tqdm import tqdm

        self.bar = None if quiet else tqdm(total=total, initial=start, file=sys.stderr, unit="step")

    def update(self, step: int, parts, rate: float, cpu: float) -> None:
        if self.bar is not None:
            self.bar.n = step
            self.bar.set_postfix(ans_loss=f"{parts.answer_loss:.3f}", ans_acc=f"{parts.answer_accuracy:.2f}",
                                 loss=f"{parts.diffusion:.3f}", enc=f"{parts.encoder:.3f}",
                                 enc_ans=f"{parts.answer_encoder:.3f}", tok_s=f"{rate:.0f}", cpu_h=f"{cpu / 3600:.2f}")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", help="folder for the run: tokenizer, checkpoint, and model/ at the end")
    parser.add_argument("--config", help="recipe JSON (default: the run folder's own recipe.json when it has one, "
                                         f"else the shipped {DEFAULT_CONFIG})")
    parser.add_argument("--steps", type=int, help="the schedule's length in optimizer steps: training stops "
                        "there and the learning rate's cosine ends there (default: the recipe's; kept in the run's "
                        "recipe.json for later resumes)")
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's; 1 in each of --procs)")
    parser.add_argument("--procs", type=int, default=1,
                        help="data-parallel processes, each with its share of every batch (default 1)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.add_argument("--seconds", type=float, help="a time budget in wall seconds: the run saves and exports "
                        "its model before it is spent, and its learning rate's cosine ends there (default: the "
                        "recipe's train.maxWallS, else none)")
    parser.add_argument("--examples", help="a folder of example shards that `python -m "
                        "dgemma_lsp.engine.training.packing` writes as the run goes, instead of cutting them here")
    parser.add_argument("--init", help="a model folder (e.g. the shipped tiny model) whose weights a new run "
                        "starts from, with a fresh optimizer; its training.json's cost is carried on")
