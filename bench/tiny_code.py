"""Does a trained tiny model write code? One checkpoint (or snapshot) of a training run, scored
next to the random model and the empty middle.

`python -m dgemma_lsp.bench.tiny_code RUN_DIR [--snapshot cpu-NNNNNN.pt] [--sample 150]`

- HumanEval-Infilling single-line pass@1 (bench/humaneval.py's path: the server's own
  prepare_infill, denoise, finish_candidates), on `--sample` problems spread over all 1,033
  (the full set takes too long on a shared 2-core machine);
- simple held-out holes (SIMPLE_HOLES: `def square(n):\\n    return █` and the like, written
  for this bench; none is in the main corpus, and one is in the focus corpus (engine/training/
  focus.py): toolz's tests define `double(x)` as `2 * x`): share of holes where one of three
  candidates is an answer a person would accept;
- share of candidates that parse in place (the engine's own syntax check, over every
  candidate asked for: an empty or dropped one does not parse);
- line completion on held-out code (`line_completion`): CodeXGLUE's line-level metrics, exact
  match (`pred.split() == gt.split()`) and edit similarity (the Levenshtein ratio, 0-100, that
  CodeXGLUE's evaluator takes from fuzzywuzzy; rapidfuzz's `fuzz.ratio` is the same measure), on
  the top candidate for holes cut from files of the sources the recipe holds out: the cursor at a
  token boundary of a code line, the rest of the line removed (training's "line" kind). Unlike
  CodeXGLUE, the model sees the code after the line too: it is an infill model. `truth=True` hands
  the true rest of the line to the same pipeline in the model's place: what it loses there, it
  loses for every model.
- what the weights know, read left to right (`CausalReader`): the encoder and LM head write each
  answer greedily, token by token, and the same pipeline finishes it (simple holes, line holes and
  HumanEval).
  No diffusion sampler is involved: where this reader fails too, the weights lack the answer and
  no sampler can find it; where it succeeds and `generate` does not, look at the sampler.
Every prompt gets the context the server would give this model: the default budget cut to the
model's own `dgemma_context_tokens` (infill.context_budget). `--model tiny` (or any model name/path)
scores that model instead of a run's snapshot.
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


class CausalReader:
    """The weights' own answer read left to right: greedy next tokens from the encoder and its LM head.

    The prompt is built as the runtime builds it (PromptBuilder); the answer ends at the chat
    template's end-of-turn or after `max_tokens`. Re-encodes the whole prompt each token (no cache):
    simple, and quick enough for a bench of tiny models."""

    def __init__(self, model: str, max_tokens: int = 32) -> None:
        from dgemma_lsp.engine.model.prompting import PromptBuilder
        from dgemma_lsp.engine.training.examples import end_of_turn_id
        from dgemma_lsp.engine.weights.loading import load_model_and_tokenizer

        self.model, self.tokenizer, _ = load_model_and_tokenizer(model, device="cpu", dtype="float32")
        self.prompts = PromptBuilder(self.tokenizer)
        self.end_id = end_of_turn_id(self.tokenizer)
        self.max_tokens = max_tokens

    def status(self):
        """The engine's status fields this bench reads: the model's own context limit."""
        from dgemma_lsp.engine.api import EngineStatus

        return EngineStatus(state="ready", model="", context_tokens=self.prompts.layout.context_tokens)

    def denoise(self, request):
        """The greedy answer to a DenoiseRequest, shaped as the model's output for finish_candidates."""
        import torch

        from dgemma_lsp.engine.runtime.denoising import CONTROL_CHARACTERS
        from dgemma_lsp.engine.training.objective import softcapped_logits

        from .oracle import as_model_output

        ids = self.prompts.build(request.context, layout=request.settings.prompt_layout).all
        answer: list[int] = []
        with torch.no_grad():
            for _ in range(self.max_tokens):
                hidden = self.model.model.encoder(input_ids=torch.tensor([ids + answer])).last_hidden_state
                token = int(softcapped_logits(self.model, hidden[:, -1]).argmax(-1))
                if token == self.end_id:
                    break
                answer.append(token)
        text = self.tokenizer.decode(answer, skip_special_tokens=True)
        return as_model_output(text.translate(CONTROL_CHARACTERS))  # as the runtime decodes an answer


def simple_holes(model: str, *, candidates: int = 3, seed: int = 0, steps=None, causal: bool = False,
                 layout: str | None = None) -> dict:
    """Share of SIMPLE_HOLES with an accepted answer among `candidates`, what was written, and parse share.

    `causal`: the weights' greedy left-to-right answer (CausalReader), one candidate."""
    from dgemma_lsp.engine.api import GenerationSettings
    from dgemma_lsp.engine.syntax.document import SyntaxDocument
    from dgemma_lsp.engine.syntax.infill import context_budget, finish_candidates, prepare_infill

    service = _infiller(model, causal)
    budget = context_budget(service.status().context_tokens)  # as the server cuts it for this model
    candidates = 1 if causal else candidates
    settings = GenerationSettings(candidates=candidates, seed=seed, max_tokens=32, steps=steps, prompt_layout=layout)
    accepted, parsed, written = 0, 0, []
    for prefix, suffix, answers in SIMPLE_HOLES:
        doc = SyntaxDocument(prefix + suffix, "python")
        prepared = prepare_infill(doc, len(prefix), settings, budget_tokens=budget)
        found = finish_candidates(prepared, doc, service.denoise(prepared.request))
        texts = [c.text for c in found]
        accepted += any(_squash(t) in {_squash(a) for a in answers} for t in texts)
        parsed += sum(c.syntax_ok is True for c in found)
        written.append(texts)
    return {"holes": len(SIMPLE_HOLES), "accepted": accepted, "acceptedShare": round(accepted / len(SIMPLE_HOLES), 4),
            "parseShare": round(parsed / (candidates * len(SIMPLE_HOLES)), 4), "written": written}


LINE_SEED = 20261126
"""The line holes' seed: the same holes for every model and snapshot."""
HELD_OUT = ("rich", "click", "attrs", "pluggy", "h11")
"""tiny-code-cpu.json's held-out sources: what a run that names none is scored on."""


def exact_match(predicted: str, truth: str) -> bool:
    """CodeXGLUE line level: the same whitespace-separated tokens."""
    return predicted.split() == truth.split()


def edit_similarity(predicted: str, truth: str) -> float:
    """CodeXGLUE line level: the Levenshtein ratio of the stripped texts, 0-100."""
    from rapidfuzz import fuzz

    return fuzz.ratio(predicted.strip(), truth.strip())


def line_holes(count: int, held_out: tuple[str, ...] = HELD_OUT) -> list[tuple[str, int, int]]:
    """`count` (text, start, end) line holes from the held-out sources' Python files, fixed by LINE_SEED."""
    import random

    from dgemma_lsp.engine.syntax.document import SyntaxDocument
    from dgemma_lsp.engine.training.corpus import collect
    from dgemma_lsp.engine.training.examples import choose_hole

    files, _ = collect(8_000_000, LINE_SEED, languages=("python",), only=held_out)
    assert files, f"no files of the held-out sources {held_out} on this machine"
    holes, index = [], 0
    while len(holes) < count and index < 50 * count:
        rng = random.Random(LINE_SEED * 1_000_003 + index)
        index += 1
        text = files[rng.randrange(len(files))].text
        hole = choose_hole(SyntaxDocument(text, "python"), "line", rng)
        if hole is not None and text[hole.start:hole.end].strip():
            holes.append((text, hole.start, hole.end))
    return holes


def _infiller(model: str, causal: bool):
    """What answers a DenoiseRequest: the engine's own service, or the weights read left to right."""
    if causal:
        return CausalReader(model)
    from dgemma_lsp.engine.runtime.service import InfillService

    service = InfillService(model)
    service.load()
    return service


def line_completion(model: str | None, count: int = 100, *, held_out: tuple[str, ...] = HELD_OUT, seed: int = 0,
                    truth: bool = False, causal: bool = False, layout: str | None = None) -> dict:
    """Exact match and edit similarity of the top candidate on `count` held-out line holes.

    `layout`: the prompt layout (None: the model's own, prompting.MODEL_LAYOUT_KEY).
    `truth`: no model; the true rest of the line goes through the pipeline in the model's place.
    `causal`: the weights' greedy left-to-right answer (CausalReader) in the model's place."""
    from dgemma_lsp.engine.api import GenerationSettings
    from dgemma_lsp.engine.syntax.document import SyntaxDocument
    from dgemma_lsp.engine.syntax.infill import context_budget, finish_candidates, prepare_infill

    from .oracle import as_model_output

    service = None if truth else _infiller(model, causal)
    budget = context_budget(None if service is None else service.status().context_tokens)
    settings = GenerationSettings(candidates=1, seed=seed, max_tokens=32, prompt_layout=layout)
    matched, similarity, parsed, written = 0, 0.0, 0, []
    holes = line_holes(count, held_out)
    for text, start, end in holes:
        doc = SyntaxDocument(text[:start] + text[end:], "python")
        prepared = prepare_infill(doc, start, settings, budget_tokens=budget)
        result = as_model_output(text[start:end]) if truth else service.denoise(prepared.request)
        found = finish_candidates(prepared, doc, result)
        top = found[0].text if found else ""
        matched += exact_match(top, text[start:end])
        similarity += edit_similarity(top, text[start:end])
        parsed += bool(found) and found[0].syntax_ok is True
        written.append(top)
    return {"holes": len(holes), "exactMatch": round(matched / len(holes), 4),
            "editSimilarity": round(similarity / len(holes), 2), "parseShare": round(parsed / len(holes), 4),
            "written": written[:12]}


def humaneval_single_line(model: str, sample: int, seed: int = 0, causal: bool = False) -> dict:
    """pass@1 on `sample` single-line problems; `causal`: the weights' greedy left-to-right answer (CausalReader)."""
    from .humaneval import EngineInfiller, default_data_dir, evaluate, load_problems

    problems = load_problems(default_data_dir(), "single-line", sample=sample)
    infill = EngineInfiller(model, seed=seed, max_tokens=32, service=CausalReader(model) if causal else None)
    report = evaluate(problems, "model", infill=infill, model=model, subset="single-line")
    empty = evaluate(problems, "empty", subset="single-line")
    return {"problems": report.problems, "passed": report.passed, "passAt1": report.pass_at_1,
            "emptyMiddlePassAt1": empty.pass_at_1,
            "middles": [r.middle for r in report.results[:12]]}


def export_snapshot(run_dir: Path, snapshot: Path) -> tuple[Path, dict]:
    from dgemma_lsp.engine.training import ship

    folder = run_dir / "eval-model"
    return folder, ship.export_snapshot(run_dir, snapshot, folder)


def main(argv=None) -> int:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run_dir", type=Path, nargs="?")
    parser.add_argument("--snapshot", help="a file of RUN_DIR/snapshots (default: the newest), or checkpoint.pt")
    parser.add_argument("--model", help="score this model (tiny, a folder) instead of a run")
    parser.add_argument("--sample", type=int, default=150, help="HumanEval single-line problems, spread over all")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--steps", type=int, default=None, help="denoising steps for the simple holes")
    parser.add_argument("--lines", type=int, default=100, help="held-out line holes (0: none)")
    parser.add_argument("--layout", choices=("natural", "suffix-first"),
                        help="prompt layout of the simple and line holes (default: the model's own)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    started = time.process_time()
    held_out = HELD_OUT
    if args.model:
        model, record = args.model, {"model": args.model}
    else:
        from dgemma_lsp.engine.training.ship import snapshot_path

        chosen = snapshot_path(args.run_dir, args.snapshot)
        folder, record = export_snapshot(args.run_dir, chosen)
        model = str(folder)
        held_out = tuple(record["recipe"]["data"].get("heldOutSources") or HELD_OUT)
    layout = args.layout
    line = {**{k: v for k, v in record.items() if k != "recipe"}, "layout": layout or "the model's own",
            "simple": simple_holes(model, steps=args.steps, layout=layout),
            "lineCompletion": line_completion(model, args.lines, held_out=held_out, layout=layout)
            if args.lines else None,
            "simpleCausal": simple_holes(model, causal=True, layout=layout),
            "lineCompletionCausal": line_completion(model, args.lines, held_out=held_out, causal=True, layout=layout)
            if args.lines else None,
            "humanevalSingleLine": humaneval_single_line(model, args.sample) if args.sample else None,
            "humanevalSingleLineCausal": humaneval_single_line(model, args.sample, causal=True) if args.sample else None,
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
