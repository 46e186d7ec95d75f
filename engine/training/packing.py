"""Examples cut ahead of a GPU, in parallel, into shard files; and the trainer's side that reads them (issue 51).

A GPU steps through a batch of a 10M-parameter model in a fraction of a second; one core cuts an example (a
hole, the product's prompt around it) in ~3-8 ms (the file's parse, its block nodes, the prompt's window and
template, the tokenizer). So the examples are cut by worker processes, the trainer reads them from files, and
nothing the GPU does waits for tree-sitter:

`python -m dgemma_lsp.engine.training.packing RUN_DIR --out DIR [--workers N] [--seconds S] [--shards K]`

collects the recipe's corpus once (corpus.py, its licence filter, held-out sources held out; the focus corpus
when the recipe draws from it), forks N workers that share it, and each worker writes shard after shard
(`shard-NNNNNN.npz`: SHARD_EXAMPLES examples, their prompt ids flat with offsets and their canvases) until
`--seconds` have passed or `--shards` are written. Shard k is cut by an RNG seeded with (seed, k), HOLES_PER_FILE
holes from each file it picks (`ExampleMaker.make_many`: one parse, the holes deleted from copies of it as an
editor's keystroke is reparsed): which shards exist depends on the time given, what shard k holds does not.
Meanwhile the parent writes the run's corpus manifest (train.py's: every source, its licence and tokens), which
the trainer copies beside the model it exports. RUN_DIR holds the recipe and the tokenizer (train.py's layout).

`ShardSource` is the trainer's end (`dgemma-lsp train --examples DIR`): it takes the shards as they appear,
makes a batch of examples of like prompt length (BUCKET_TOKENS), and gives each fresh batch once; when no
fresh one is ready (the GPU ahead of the workers) it gives an earlier batch again (`repeats`: the noise the
objective draws is new each time) rather than wait. So the order of batches depends on timing, not only on
the seed.
Knows the examples' layout and files; knows torch only to collate.
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing
import os
import random
import signal
import sys
import time
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

SHARD_EXAMPLES = 512
"""Examples a shard holds: a worker cuts one in a few seconds, so the first batches are ready at once."""
HOLES_PER_FILE = 8
"""Holes cut from one parsed file: 8 cut an example in 3.2 ms on the development CPU, where `make` (one hole
a parse) took 8.3 (issue 51's measure, 64-1,024-token contexts); a batch still draws on many files."""
BUCKET_TOKENS = 64
"""A batch's prompts differ in length by less than this: a batch is padded to its longest prompt, and the
recipes draw prompts of 50-1,150 tokens, so a batch of random lengths would be about half padding."""


def cut_shard(maker, files, focus_files, focus_share: float, seed: int, index: int,
              count: int = SHARD_EXAMPLES) -> dict[str, np.ndarray]:
    """Shard `index`: `count` examples, HOLES_PER_FILE at a time from files picked by an RNG of (seed, index)."""
    from .examples import KINDS

    rng = random.Random(f"shard:{seed}:{index}")
    examples = []
    while len(examples) < count:
        pool = focus_files if focus_files and rng.random() < focus_share else files
        examples += maker.make_many(pool[rng.randrange(len(pool))], rng, min(HOLES_PER_FILE, count - len(examples)))
    lengths = np.array([len(e.prompt_ids) for e in examples], dtype=np.int64)
    return {
        "prompt": np.concatenate([np.asarray(e.prompt_ids, dtype=np.int32) for e in examples]),
        "offsets": np.concatenate([[0], np.cumsum(lengths)]),
        "canvas": np.asarray([e.canvas_ids for e in examples], dtype=np.int32),
        "kind": np.asarray([KINDS.index(e.kind) for e in examples], dtype=np.int8),
        "index": np.asarray(index),
    }


def write_shard(folder: Path, index: int, arrays: dict[str, np.ndarray]) -> Path:
    """`shard-NNNNNN.npz`, renamed into place once whole: a reader never sees half a shard."""
    path = folder / f"shard-{index:06d}.npz"
    staging = folder / f".shard-{index:06d}.tmp.npz"
    np.savez(staging, **arrays)
    staging.replace(path)
    return path


def read_shard(path: Path) -> tuple[list[np.ndarray], np.ndarray]:
    """A shard's prompts (one array each) and canvases [N, C]."""
    with np.load(path) as data:
        prompt, offsets, canvas = data["prompt"], data["offsets"], data["canvas"]
    return [prompt[offsets[i]:offsets[i + 1]] for i in range(len(offsets) - 1)], canvas


def collate_arrays(prompts: list[np.ndarray], canvases: np.ndarray, pad_id: int, end_id: int):
    """objective.collate for arrays: left-padded prompts and clean canvases as a Batch (the same tensors)."""
    import torch

    from .objective import Batch, answer_positions

    width = max(len(p) for p in prompts)
    ids = np.full((len(prompts), width), pad_id, dtype=np.int64)
    mask = np.zeros((len(prompts), width), dtype=np.int64)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt):] = prompt
        mask[row, width - len(prompt):] = 1
    canvas = torch.from_numpy(np.ascontiguousarray(canvases, dtype=np.int64))
    return Batch(torch.from_numpy(ids), torch.from_numpy(mask), canvas, answer_positions(canvas, pad_id, end_id))


class ShardSource:
    """Batches of `batch_size` examples from the shards in `folder`, as the packer writes them (module docstring).

    Fresh examples wait in buckets of BUCKET_TOKENS of prompt length; a bucket that holds a batch gives it.
    `wait_s`: how long `next_batch` waits for the first batch before it gives up (a packer that never started)."""

    def __init__(self, folder: Path, batch_size: int, pad_id: int, end_id: int, seed: int, *,
                 wait_s: float = 600.0, sleep=time.sleep, clock=time.monotonic) -> None:
        self.folder, self.batch_size = Path(folder), batch_size
        self.pad_id, self.end_id = pad_id, end_id
        self.rng = random.Random(f"batches:{seed}")
        self.wait_s, self.sleep, self.clock = wait_s, sleep, clock
        self.seen: set[str] = set()
        self.buckets: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {}  # length // BUCKET_TOKENS -> fresh
        self.given: list[list[tuple[np.ndarray, np.ndarray]]] = []  # batches given once: what a repeat draws on
        self.shards = 0
        self.examples = 0
        """Fresh examples given (each once)."""
        self.repeats = 0
        """Batches given again for want of a fresh one."""

    def next_batch(self):
        """The next Batch (CPU tensors): a fresh one when a bucket holds one, else an earlier one again."""
        self._absorb()
        rows = self._fresh_batch()
        if rows is None and not self.given:  # nothing to train on yet: the packer is starting
            deadline = self.clock() + self.wait_s
            while rows is None:
                if self.clock() > deadline:
                    raise TimeoutError(f"no batch of {self.batch_size} examples in {self.folder} "
                                       f"after {self.wait_s:.0f} s: is the packer running?")
                self.sleep(0.2)
                self._absorb()
                rows = self._fresh_batch()
        if rows is not None:
            self.given.append(rows)
            self.examples += len(rows)
        else:
            rows = self.given[self.rng.randrange(len(self.given))]
            self.repeats += 1
        return collate_arrays([p for p, _ in rows], np.stack([c for _, c in rows]), self.pad_id, self.end_id)

    def counters(self) -> dict:
        return {"shards": self.shards, "freshExamples": self.examples, "repeatedBatches": self.repeats}

    def _absorb(self) -> None:
        names = sorted(entry.name for entry in os.scandir(self.folder)
                       if entry.name.startswith("shard-") and entry.name.endswith(".npz") and entry.name not in self.seen)
        for name in names:
            prompts, canvases = read_shard(self.folder / name)
            for prompt, canvas in zip(prompts, canvases, strict=True):
                self.buckets.setdefault(len(prompt) // BUCKET_TOKENS, []).append((prompt, canvas))
            self.seen.add(name)
            self.shards += 1

    def _fresh_batch(self) -> list | None:
        """A batch from the fullest bucket that holds one (its examples drawn at random), or None."""
        key, bucket = max(self.buckets.items(), key=lambda item: len(item[1]), default=(None, []))
        if len(bucket) < self.batch_size:
            return None
        self.rng.shuffle(bucket)
        rows, self.buckets[key] = bucket[:self.batch_size], bucket[self.batch_size:]
        return rows


# -- the packer -----------------------------------------------------------------------------------------


def _worker(run_dir: Path, recipe: dict, out: Path, worker: int, workers: int, deadline: float | None,
            shards: int | None, files, focus_files) -> None:
    """Shards worker, worker + workers, ... until the deadline (wall clock) or `shards` are written."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops the workers (SIGTERM) after its own cleanup
    from transformers import AutoTokenizer

    from .examples import ExampleMaker

    tokenizer = AutoTokenizer.from_pretrained(run_dir / "tokenizer")
    data = recipe["data"]
    maker = ExampleMaker(tokenizer, recipe["model"]["canvas"], max_prompt_tokens=data["maxPromptTokens"],
                         context_tokens=tuple(data["contextTokens"]),
                         suffix_first_share=data.get("suffixFirstShare", 0.0), kind_weights=data.get("kindWeights"))
    index = worker
    while (shards is None or index < shards) and (deadline is None or time.time() < deadline):
        arrays = cut_shard(maker, files, focus_files, data.get("focusShare", 0.0), recipe["seed"], index)
        write_shard(out, index, arrays)
        index += workers


def pack(run_dir: Path, out: Path, *, workers: int, seconds: float | None = None, shards: int | None = None,
         config: str | None = None) -> dict:
    """Cut shards into `out` with `workers` processes until `seconds` pass or `shards` are written; the run's
    manifest is written meanwhile. Returns what was done."""
    from transformers import AutoTokenizer

    from .corpus import collect
    from .parallel import Ranks
    from .train import _add_focus_manifest, _focus_corpus, _write_manifest, load_recipe

    assert seconds is not None or shards is not None, "give the packer a time (--seconds) or a count (--shards)"
    started = time.time()
    deadline = None if seconds is None else started + seconds
    recipe_file = run_dir / "recipe.json"
    recipe = load_recipe(config) if config or not recipe_file.exists() else json.loads(recipe_file.read_text())
    assert (run_dir / "tokenizer" / "tokenizer.json").exists(), (
        f"{run_dir}/tokenizer is missing: the packer cuts with the run's tokenizer (copy one in, or start the run once)")
    if not recipe_file.exists():
        recipe_file.write_text(json.dumps(recipe, indent=1) + "\n")
    data = recipe["data"]
    files, manifest = collect(data["corpusBytes"], recipe["seed"], languages=tuple(data["languages"]),
                              held_out=tuple(data.get("heldOutSources", ())))
    focus_files, focus_manifest = _focus_corpus(data, recipe["seed"], Ranks())
    log.info("packer: %d files (%.1f MB), %d focus files, collected in %.1f s; %d workers",
             len(files), manifest["bytes"] / 1e6, len(focus_files), time.time() - started, workers)
    out.mkdir(parents=True, exist_ok=True)
    # Forked: the workers share the corpus's texts with the parent instead of reading them again.
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # the Rust tokenizer's threads do not survive a fork
    context = multiprocessing.get_context("fork")
    processes = [context.Process(target=_worker, name=f"packer-{w}",
                                 args=(run_dir, recipe, out, w, workers, deadline, shards, files, focus_files))
                 for w in range(workers)]
    for process in processes:
        process.start()

    def stop(signum, frame) -> None:
        for process in processes:
            if process.is_alive():
                process.terminate()

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        if not (run_dir / "corpus.json").exists():  # while the workers cut: a CPU-minute of counting tokens
            tokenizer = AutoTokenizer.from_pretrained(run_dir / "tokenizer")
            _write_manifest(run_dir / "corpus.json", manifest, files, tokenizer)
            if focus_files:
                _add_focus_manifest(run_dir / "corpus.json", focus_manifest, focus_files, tokenizer,
                                    data["focusShare"])
            log.info("packer: manifest written, %.1f s in", time.time() - started)
        for process in processes:
            process.join()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    written = len(list(out.glob("shard-*.npz")))
    failed = [p.name for p in processes if p.exitcode not in (0, -signal.SIGTERM)]
    summary = {"shards": written, "examples": written * SHARD_EXAMPLES, "workers": workers,
               "seconds": round(time.time() - started, 1), "failedWorkers": failed}
    log.info("packer: %s", json.dumps(summary))
    return summary


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run_dir", type=Path, help="the run's folder: its recipe.json (or --config) and tokenizer/")
    parser.add_argument("--out", type=Path, required=True, help="folder for the shards")
    parser.add_argument("--config", help="recipe JSON (default: the run's recipe.json)")
    parser.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) - 2),
                        help="processes cutting examples (default: the cores but two: the trainer and the manifest)")
    parser.add_argument("--seconds", type=float, help="stop cutting after this many wall seconds")
    parser.add_argument("--shards", type=int, help=f"stop after this many shards of {SHARD_EXAMPLES} examples")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s: %(message)s")
    summary = pack(args.run_dir, args.out, workers=args.workers, seconds=args.seconds, shards=args.shards,
                   config=args.config)
    return 1 if summary["failedWorkers"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
