"""`dgemma-lsp bench humaneval`: pass@1 on OpenAI's HumanEval-Infilling.

For each problem the middle comes from the engine through the same path as the
server: a SyntaxDocument of prompt + suffix, prepare_infill at the hole,
InfillService.denoise, finish_candidates, the top candidate inserted at the
cursor (replacing what it says it replaces). `--middle canonical` and
`--middle empty` check the harness itself: the canonical middle must pass
every problem, the empty one about 2.6% on single-line. Programs run in
bench/executor.py's sandbox. Knows the data format, not the model or LSP.
"""

from __future__ import annotations

import gzip
import json
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from importlib import resources
from pathlib import Path

import msgspec

from .executor import DEFAULT_TIMEOUT_S, ExecutionResult, run_programs
from .report import say

SUBSETS = {
    "single-line": "HumanEval-SingleLineInfilling.jsonl.gz",
    "multi-line": "HumanEval-MultiLineInfilling.jsonl.gz",
    "random-span-light": "HumanEval-RandomSpanInfillingLight.jsonl.gz",
}
MIDDLES = ("model", "canonical", "empty")
DATA_ENV_HINT = "pass --data DIR (a folder with HumanEval-*.jsonl.gz), or reinstall the package"


class Problem(msgspec.Struct, frozen=True):
    task_id: str
    entry_point: str
    prompt: str
    suffix: str
    canonical_solution: str
    test: str


class ProblemResult(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    task_id: str
    outcome: str
    """passed, failed or timeout."""
    middle: str
    """What was inserted at the hole."""
    replaced_chars: int = 0
    """Characters of the suffix the middle replaced (e.g. an auto-closed bracket)."""
    generate_ms: float = 0.0
    """prepare_infill + denoise + finish_candidates (0 for canonical/empty)."""
    detail: str = ""
    """Last stderr line of a failure."""


class HumanEvalReport(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    subset: str
    middle: str
    model: str
    problems: int
    passed: int
    pass_at_1: float
    timeouts: int
    generate_ms: dict[str, float] | None
    """p50/p99 of the per-problem engine time (model middles only)."""
    seconds: float
    """Wall time of the whole run."""
    results: list[ProblemResult]


def default_data_dir() -> Path:
    """The copy shipped inside this package (bench/data: the three files and their MIT licence)."""
    folder = resources.files("dgemma_lsp.bench.data")
    # An installed package is a plain folder (wheel or editable), never a zip: Path() is safe.
    return Path(str(folder))


def load_problems(data_dir: Path, subset: str, limit: int | None = None, sample: int | None = None) -> list[Problem]:
    """The subset's problems in file order: the first `limit`, or `sample` spread evenly over all of them
    (the file is grouped by task, so a spread sample covers every task where the first N covers few)."""
    path = data_dir / SUBSETS[subset]
    problems = []
    with gzip.open(path, "rt", encoding="utf-8") as file:
        for line in file:
            if line.strip():
                problems.append(msgspec.convert(json.loads(line), Problem, strict=False))
            if limit is not None and len(problems) >= limit:
                break
    if sample is not None and sample < len(problems):
        problems = [problems[i * len(problems) // sample] for i in range(sample)]
    return problems


def program_for(problem: Problem, middle: str, replaced_chars: int = 0) -> str:
    """What runs: the filled-in file, the tests, then the check of the entry point."""
    code = problem.prompt + middle + problem.suffix[replaced_chars:]
    return f"{code}\n{problem.test}\ncheck({problem.entry_point})\n"


class EngineInfiller:
    """The server's path for one infill at the hole, without LSP."""

    def __init__(
        self, model: str, *, device=None, dtype=None, steps=None, candidates=1, seed=0, max_tokens=256,
        entropy_bound=None, layout=None, t_max=None, t_min=None, service=None,
    ) -> None:
        """`service`: what denoises in the engine's place (has `denoise` and `status`: bench/tiny_code.py's
        CausalReader), else the engine's own InfillService on `model`."""
        from dgemma_lsp.engine.api import GenerationSettings
        from dgemma_lsp.engine.runtime.service import InfillService

        self.settings = GenerationSettings(
            steps=steps, candidates=candidates, seed=seed, max_tokens=max_tokens, entropy_bound=entropy_bound,
            prompt_layout=layout, t_max=t_max, t_min=t_min,
        )
        if service is None:
            service = InfillService(model, device=device, dtype=dtype)
            service.load()
        self.service = service

    def __call__(self, problem: Problem) -> tuple[str, int, float]:
        from dgemma_lsp.engine.syntax.document import SyntaxDocument
        from dgemma_lsp.engine.syntax.infill import context_budget, finish_candidates, prepare_infill

        started = time.perf_counter()
        doc = SyntaxDocument(problem.prompt + problem.suffix, "python")
        budget = context_budget(self.service.status().context_tokens)  # as the server cuts it for this model
        prepared = prepare_infill(doc, len(problem.prompt), self.settings, budget_tokens=budget)
        result = self.service.denoise(prepared.request)
        candidates = finish_candidates(prepared, doc, result)
        elapsed = (time.perf_counter() - started) * 1000
        if not candidates:
            return "", 0, elapsed
        best = candidates[0]
        return best.text, best.replace_chars, elapsed


def _middles(problems: list[Problem], middle: str, infill: Callable | None) -> Iterator[tuple[str, int, float]]:
    for problem in problems:
        if middle == "canonical":
            yield problem.canonical_solution, 0, 0.0
        elif middle == "empty":
            yield "", 0, 0.0
        else:
            yield infill(problem)


def evaluate(
    problems: list[Problem],
    middle: str,
    *,
    infill: Callable[[Problem], tuple[str, int, float]] | None = None,
    model: str = "",
    subset: str = "",
    timeout_s: float = DEFAULT_TIMEOUT_S,
    progress: Callable[[str], None] | None = None,
) -> HumanEvalReport:
    """Fill every problem's hole, run all programs in the sandbox, score pass@1 (one sample each)."""
    started = time.perf_counter()
    filled = []
    for index, item in enumerate(_middles(problems, middle, infill), 1):
        filled.append(item)
        if progress and middle == "model" and index % 10 == 0:
            progress(f"humaneval: {index}/{len(problems)} infilled")
    executions: list[ExecutionResult] = run_programs(
        [program_for(p, text, replaced) for p, (text, replaced, _) in zip(problems, filled, strict=True)],
        timeout_s=timeout_s,
    )
    results = [
        ProblemResult(
            task_id=problem.task_id,
            outcome=execution.outcome,
            middle=text,
            replaced_chars=replaced,
            generate_ms=round(ms, 2),
            detail=execution.detail,
        )
        for problem, (text, replaced, ms), execution in zip(problems, filled, executions, strict=True)
    ]
    passed = sum(r.outcome == "passed" for r in results)
    times = [r.generate_ms for r in results]
    return HumanEvalReport(
        subset=subset,
        middle=middle,
        model=model if middle == "model" else "",
        problems=len(results),
        passed=passed,
        pass_at_1=round(passed / len(results), 4) if results else 0.0,
        timeouts=sum(r.outcome == "timeout" for r in results),
        generate_ms=_p50_p99(times) if middle == "model" and times else None,
        seconds=round(time.perf_counter() - started, 2),
        results=results,
    )


def _p50_p99(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, int(round(0.99 * (len(ordered) - 1))))]
    return {"p50": round(statistics.median(ordered), 2), "p99": round(p99, 2)}


def summary_line(report: HumanEvalReport) -> str:
    source = f"model {report.model}" if report.middle == "model" else f"{report.middle} middle"
    timing = f", engine p50 {report.generate_ms['p50']} ms" if report.generate_ms else ""
    return (
        f"humaneval {report.subset} ({source}): pass@1 {report.pass_at_1:.2%} "
        f"({report.passed}/{report.problems}, {report.timeouts} timeouts{timing}, {report.seconds} s)"
    )


# -- command line -------------------------------------------------------------------------------


def add_arguments(parser) -> None:
    parser.add_argument("--subset", choices=sorted(SUBSETS), default="single-line")
    parser.add_argument("--limit", type=int, default=None, help="only the first N problems")
    parser.add_argument("--sample", type=int, default=None, help="N problems spread evenly over the subset")
    parser.add_argument("--middle", choices=MIDDLES, default="model",
                        help="model: the engine fills the hole; canonical/empty: check the harness")
    parser.add_argument("--data", type=Path, default=None,
                        help="folder with HumanEval-*.jsonl.gz (default: the copy shipped in the package)")
    parser.add_argument("--steps", type=int, default=None, help="denoising steps (default: the model's)")
    parser.add_argument("--entropy-bound", type=float, default=None, help="sampler budget (default: the model's)")
    parser.add_argument("--layout", choices=("natural", "suffix-first"), default=None,
                        help="prompt layout (default: the engine's)")
    parser.add_argument("--t-max", type=float, default=None, help="temperature at the first step (default: the model's)")
    parser.add_argument("--t-min", type=float, default=None, help="temperature at the last step (default: the model's)")
    parser.add_argument("--candidates", type=int, default=1, help="canvases per problem; the top-ranked one is scored")
    parser.add_argument("--max-tokens", type=int, default=256, help="answer length cap (whole canvases)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds per program")
    parser.add_argument("--details", action="store_true", help="include every problem's result in --json")


def run(args) -> int:
    report = run_from_args(args)
    if args.json:
        if not args.details:
            report = msgspec.structs.replace(report, results=[])
        sys.stdout.write(msgspec.json.encode(report).decode() + "\n")
    else:
        sys.stdout.write(summary_line(report) + "\n")
    return 0


def run_from_args(args) -> HumanEvalReport:
    data_dir = args.data or default_data_dir()
    if not (data_dir / SUBSETS[args.subset]).is_file():
        raise SystemExit(f"dgemma-lsp bench humaneval: no HumanEval-Infilling data found; {DATA_ENV_HINT}")
    problems = load_problems(data_dir, args.subset, args.limit, getattr(args, "sample", None))
    infill = None
    if args.middle == "model":
        infill = EngineInfiller(args.model, device=args.device, dtype=args.dtype, steps=args.steps,
                                candidates=args.candidates, seed=args.seed, max_tokens=args.max_tokens,
                                entropy_bound=getattr(args, "entropy_bound", None), layout=getattr(args, "layout", None),
                                t_max=getattr(args, "t_max", None), t_min=getattr(args, "t_min", None))
    return evaluate(problems, args.middle, infill=infill, model=args.model, subset=args.subset,
                    timeout_s=args.timeout, progress=say)

