"""Examples cut ahead of a GPU, in parallel, into shard files (issue 51).

A GPU steps through a batch of a 10M-parameter model in a fraction of a second; one core cuts an example (a
hole, the product's prompt around it) in ~3-8 ms (the file's parse, its block nodes, the prompt's window and
template, the tokenizer). So the examples are cut by worker processes, the trainer reads them from files, and
nothing the GPU does waits for tree-sitter:

`python -m dgemma_lsp.engine.training.packing RUN_DIR --out DIR [--workers N] [--seconds S] [--shards K]`

collects the recipe's corpus once (corpus.py, its licence filter, held-out sources held out; the focus corpus
when the recipe draws from it), forks N workers that share it, and each worker writes shard after shard
(`shard-NNNNNN.npz`: SHARD_EXAMPLES examples, their prompt ids flat with offsets and their canvases) until
`--seconds` have passed or `--shards` are written. Shard k is cut by an RNG seeded with (seed, k), HOLES_PER_FILE
holes from each file it picks (shards.py) (`ExampleMaker.make_many`: one parse, the holes deleted from copies of it as an
editor's keystroke is reparsed): which shards exist depends on the time given, what shard k holds does not.
Meanwhile the parent writes the run's corpus manifest (train.py's: every source, its licence and tokens), which
the trainer copies beside the model it exports. RUN_DIR holds the recipe and the tokenizer (train.py's layout).

The trainer reads them with shards.ShardSource (`dgemma-lsp train --examples DIR`). Knows processes and the
corpus; the shards' layout is shards.py's.
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing
import os
import signal
import sys
import time
from pathlib import Path

from .shards import SHARD_EXAMPLES, cut_shard, write_shard

log = logging.getLogger(__name__)


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
