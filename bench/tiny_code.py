"""Does a trained tiny model write code? One checkpoint (or snapshot) of a training run, scored
next to the random model and the empty middle.

`python -m dgemma_lsp.bench.tiny_code RUN_DIR [--snapshot cpu-NNNNNN.pt] [--sample 150]`

- HumanEval-Infilling single-line pass@1 (bench/humaneval.py's path: the server's own
  prepare_infill, denoise, finish_candidates), on `--sample` problems spread over all 1,033
  (the full set takes too long on a shared 2-core machine);
- simple held-out holes (SIMPLE_HOLES: `def square(n):\\n    return █` and the like, written
  for this bench, never in any corpus): share of holes where one of three candidates is an
  answer a person would accept;
- share of candidates that parse in place (the engine's own syntax check, over every
  candidate asked for: an empty or dropped one does not parse).
`--model tiny` (or any model name/path) scores that model instead of a run's snapshot.
The snapshot is exported to RUN_DIR/eval-model/ (a loadable model folder) first. Knows the
engine's public path and the training run's layout; knows nothing of LSP.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

SIMPLE_HOLES = [
    ("def square(n):\n    return ", "\n", ["n * n", "n ** 2"]),
    ("def add(a, b):\n    return ", "\n", ["a + b", "b + a"]),
    ("def is_even(n):\n    return ", "\n", ["n % 2 == 0", "not n % 2"]),
    ("def first(items):\n    return ", "\n", ["items[0]"]),
    ("def last(items):\n    return ", "\n", ["items[-1]"]),
    ("def size(items):\n    return ", "\n", ["len(items)"]),
    ("def double(x):\n    return ", "\n", ["x * 2", "2 * x", "x + x"]),
    ("def greet(name):\n    return 'Hello, ' + ", "\n", ["name"]),
    ("def total(values):\n    result = 0\n    for value in values:\n        result += ", "\n    return result\n",
     ["value"]),
    ("def maximum(a, b):\n    if a > b:\n        return a\n    return ", "\n", ["b"]),
    ("def count(items):\n    n = 0\n    for item in items:\n        ", "\n    return n\n", ["n += 1", "n = n + 1"]),
    ("import os\n\n\ndef join(folder, name):\n    return os.path.", "\n", ["join(folder, name)"]),
]
"""(prefix, suffix, accepted answers): compared with all whitespace removed."""


def _squash(text: str) -> str:
    return "".join(text.split())


def simple_holes(model: str, *, candidates: int = 3, seed: int = 0, steps=None) -> dict:
    """Share of SIMPLE_HOLES with an accepted answer among `candidates`, what was written, and parse share."""
    from dgemma_lsp.engine.api import GenerationSettings
    from dgemma_lsp.engine.runtime.service import InfillService
    from dgemma_lsp.engine.syntax.document import SyntaxDocument
    from dgemma_lsp.engine.syntax.infill import finish_candidates, prepare_infill

    service = InfillService(model)
    service.load()
    settings = GenerationSettings(candidates=candidates, seed=seed, max_tokens=32, steps=steps)
    accepted, parsed, written = 0, 0, []
    for prefix, suffix, answers in SIMPLE_HOLES:
        doc = SyntaxDocument(prefix + suffix, "python")
        prepared = prepare_infill(doc, len(prefix), settings)
        found = finish_candidates(prepared, doc, service.denoise(prepared.request))
        texts = [c.text for c in found]
        accepted += any(_squash(t) in {_squash(a) for a in answers} for t in texts)
        parsed += sum(c.syntax_ok is True for c in found)
        written.append(texts)
    return {"holes": len(SIMPLE_HOLES), "accepted": accepted, "acceptedShare": round(accepted / len(SIMPLE_HOLES), 4),
            "parseShare": round(parsed / (candidates * len(SIMPLE_HOLES)), 4), "written": written}


def humaneval_single_line(model: str, sample: int, seed: int = 0) -> dict:
    from .humaneval import EngineInfiller, default_data_dir, evaluate, load_problems

    problems = load_problems(default_data_dir(), "single-line", sample=sample)
    infill = EngineInfiller(model, seed=seed, max_tokens=32)
    report = evaluate(problems, "model", infill=infill, model=model, subset="single-line")
    empty = evaluate(problems, "empty", subset="single-line")
    return {"problems": report.problems, "passed": report.passed, "passAt1": report.pass_at_1,
            "emptyMiddlePassAt1": empty.pass_at_1,
            "middles": [r.middle for r in report.results[:12]]}


def export_snapshot(run_dir: Path, snapshot: Path) -> tuple[Path, dict]:
    from dgemma_lsp.engine.training.train import export
    from dgemma_lsp.engine.training.validation import load_weights

    model, tokenizer, recipe, state = load_weights(run_dir, snapshot)
    record = {"recipe": recipe, "snapshot": snapshot.name, "steps": state["step"], "tokens": state["tokens"],
              "cpuSeconds": state.get("cpuSeconds"), "answerTokens": state.get("answerTokens")}
    folder = run_dir / "eval-model"
    export(model, tokenizer, folder, record, run_dir / "corpus.json")
    return folder, record


def main(argv=None) -> int:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run_dir", type=Path, nargs="?")
    parser.add_argument("--snapshot", help="a file of RUN_DIR/snapshots (default: the newest), or checkpoint.pt")
    parser.add_argument("--model", help="score this model (tiny, a folder) instead of a run")
    parser.add_argument("--sample", type=int, default=150, help="HumanEval single-line problems, spread over all")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--steps", type=int, default=None, help="denoising steps for the simple holes")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    started = time.process_time()
    if args.model:
        model, record = args.model, {"model": args.model}
    else:
        snapshots = sorted((args.run_dir / "snapshots").glob("cpu-*.pt"))
        chosen = args.run_dir / ("snapshots/" + args.snapshot if args.snapshot and args.snapshot != "checkpoint.pt"
                                 else "checkpoint.pt") if args.snapshot else snapshots[-1]
        folder, record = export_snapshot(args.run_dir, chosen)
        model = str(folder)
    line = {**{k: v for k, v in record.items() if k != "recipe"},
            "simple": simple_holes(model, steps=args.steps),
            "humanevalSingleLine": humaneval_single_line(model, args.sample) if args.sample else None,
            "measureCpuSeconds": round(time.process_time() - started, 1),
            "wallClock": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    text = json.dumps(line)
    if args.run_dir:
        with (args.run_dir / "measure.jsonl").open("a") as file:
            file.write(text + "\n")
    sys.stdout.write(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
