"""`dgemma-lsp bench ...` and `python -m dgemma_lsp.bench.cli all` (what `make bench` runs).

One subcommand per benchmark (BENCHMARKS: its module and the line `bench --help` shows for it),
and all (the CPU parts, one table). Only argument parsing and dispatch live
here; every benchmark module is imported when chosen, so the CLI starts
without torch. Tables and JSON go to stdout, progress to stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import json
import sys
import time

from .report import say

BENCHMARKS = {
    "latency": ("dgemma_lsp.bench.latency", "keystrokes through `dgemma-lsp --stdio`: first draft, final, cache hit, overhead"),
    "gpu": ("dgemma_lsp.bench.gpu", "the 26B-A4B architecture on CUDA (random weights) vs autoregressive Gemma 4"),
    "humaneval": ("dgemma_lsp.bench.humaneval", "pass@1 on HumanEval-Infilling through the server's pipeline"),
    "quant": ("dgemma_lsp.bench.quant_gpu", "per --quantization mode: resident memory, logits error, ms per step vs floor and bf16"),
    "syntax": ("dgemma_lsp.bench.syntax_bench", "per-keystroke syntax work (incremental parse, plan, context)"),
    "step": ("dgemma_lsp.bench.step_gpu", "per --quantization mode: the compiled denoising step (CUDA graphs + fused kernels)"),
    "moe": ("dgemma_lsp.bench.moe", "one quantized MoE layer: fused Triton kernels vs the per-expert loop (ops, error, ms)"),
    "load": ("dgemma_lsp.bench.load", "one model load: peak host memory, resident bytes, time (first vs cached start)"),
    "rewrite": ("dgemma_lsp.bench.rewrite", "share of a selection kept by \"Rewrite selection\", per strength"),
    "oracle": ("dgemma_lsp.bench.oracle", "the true middle through the infill pipeline, holes cut from real code (no model)"),
    "crossfile": ("dgemma_lsp.bench.crossfile", "model-free recall of cross-file context on real multi-file packages"),
    "nextedit": ("dgemma_lsp.bench.nextedit", "next-edit proposals vs the next real edit between two package releases"),
    "respawn": ("dgemma_lsp.bench.respawn", "kill -9 of the engine daemon -> the next completion served (s), by phase"),
    "soak": ("dgemma_lsp.bench.soak", "N documents opened, edited, completed, closed: does the server's RSS level off?"),
    "formats": ("dgemma_lsp.bench.formats", "each community format (GGUF, FP8-dynamic, NVFP4) loaded: error vs bf16 and vs the format, top-1"),
    "dryrun": ("dgemma_lsp.bench.dryrun", "the CUDA path at full size on virtual GPUs (fake tensors, no GPU): syncs, ops, memory"),
}


def _model_options() -> argparse.ArgumentParser:
    """--model/--device/--dtype again on each benchmark, so they may follow its name.

    SUPPRESS keeps a benchmark's parser from overwriting what the `bench` parser
    (server/cli.py adds the same options there) already set.
    """
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument("--model", default=argparse.SUPPRESS, help="'tiny', a local folder, or a Hugging Face id")
    parent.add_argument("--device", default=argparse.SUPPRESS, help="torch device")
    parent.add_argument("--dtype", default=argparse.SUPPRESS, choices=["bfloat16", "float16", "float32"])
    parent.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print one JSON object")
    return parent


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (f"{len(BENCHMARKS)} benchmarks, each below with what it measures, and `all`; "
                          "`dgemma-lsp bench BENCHMARK --help` for its options (docs/benchmarks.md)")
    parser.set_defaults(json=False)
    benchmarks = parser.add_subparsers(dest="benchmark", metavar="BENCHMARK")
    for name, (module_name, help_text) in BENCHMARKS.items():
        # "resolve": a benchmark may declare --json itself (syntax_bench does). A parent of its
        # own each time: "resolve" strips a conflicting option string from the parent's shared
        # action, which would drop --json from every benchmark added after that one.
        sub = benchmarks.add_parser(name, help=help_text, description=help_text, parents=[_model_options()],
                                    conflict_handler="resolve")
        try:
            module = _import(module_name)
            if module is not None:
                module.add_arguments(sub)
        except Exception as error:
            # This runs on every `dgemma-lsp` start, --stdio included: a broken
            # benchmark must cost only itself, never the language server.
            sub.description = f"{help_text} (unavailable: {type(error).__name__}: {error})"
    everything = benchmarks.add_parser("all", parents=[_model_options()],
                                       help="the CPU benchmarks on the tiny model, one table (`make bench`)")
    everything.add_argument("--limit", type=int, default=20, help="HumanEval problems in the smoke run")


def run(args: argparse.Namespace) -> int:
    name = getattr(args, "benchmark", None)
    if name is None:
        sys.stderr.write(f"dgemma-lsp bench: choose one of {', '.join([*BENCHMARKS, 'all'])} (`--help` says what each measures)\n")
        return 2
    if name == "all":
        return run_all(args)
    module = _import(BENCHMARKS[name][0])
    if module is None:
        sys.stderr.write(f"dgemma-lsp bench {name}: not available in this checkout\n")
        return 2
    return module.run(args)


def _import(module_name: str):
    """The benchmark module, or None while it does not exist (syntax_bench is written separately)."""
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if error.name == module_name:
            return None
        raise


# -- all ----------------------------------------------------------------------------------------


def run_all(args: argparse.Namespace) -> int:
    """Each CPU benchmark with its defaults on the tiny model; one row per figure, skips explained."""
    rows: list[tuple[str, str, str]] = []
    failures = 0
    for name, part in (("latency", _all_latency), ("syntax", _all_syntax),
                       ("humaneval", _all_humaneval), ("gpu --scale tiny", _all_gpu)):
        started = time.perf_counter()
        say(f"bench all: {name} ...")
        try:
            rows.extend(part(args))
        except _Skip as skip:
            rows.append((name, "skipped", str(skip)))
        except Exception as error:  # one broken benchmark must not hide the others' figures
            failures += 1
            rows.append((name, "FAILED", f"{type(error).__name__}: {error}"))
        say(f"bench all: {name} done in {time.perf_counter() - started:.1f} s")
    sys.stdout.write(format_rows(rows) + "\n")
    return 1 if failures else 0


class _Skip(Exception):
    """A part that cannot run here, with the reason."""


def _sub_args(module_name: str, argv: list[str], parent: argparse.Namespace) -> argparse.Namespace:
    """A benchmark's own defaults, as if `bench <name> argv` had been typed, plus the model options."""
    parser = argparse.ArgumentParser()
    module = _import(module_name)
    if module is None:
        raise _Skip(f"{module_name} is not in this checkout")
    module.add_arguments(parser)
    args = parser.parse_args(argv)
    for option in ("model", "device", "dtype", "quantization", "log_file", "log_level"):
        setattr(args, option, getattr(parent, option, None))
    args.model = args.model or "tiny"
    args.json = False
    return args


def _all_latency(parent):
    latency = _import("dgemma_lsp.bench.latency")
    if latency is None:
        raise _Skip("bench/latency.py is not in this checkout")
    report = latency.run_from_args(_sub_args("dgemma_lsp.bench.latency", [], parent))
    return latency.table_rows(report)


def _all_syntax(parent):
    syntax = _import("dgemma_lsp.bench.syntax_bench")
    if syntax is None:
        raise _Skip("bench/syntax_bench.py is not in this checkout yet")
    args = _sub_args("dgemma_lsp.bench.syntax_bench", [], parent)
    args.json = True
    captured = io.StringIO()
    with contextlib.redirect_stdout(captured):
        status = syntax.run(args)
    try:
        results = json.loads(captured.getvalue())["results"]
        return [(f"syntax {r['language']} x{r['keystrokes']}", "ms per keystroke",
                 f"p50 {r['p50_ms']:.2f}  p99 {r['p99_ms']:.2f}") for r in results]
    except (ValueError, KeyError, TypeError):
        # Its JSON changed shape: show what it printed rather than guess.
        sys.stdout.write(captured.getvalue())
        return [("syntax", "exit status", f"{status} (its own output is above)")]


def _all_humaneval(parent):
    from . import humaneval

    rows = []
    limit = str(getattr(parent, "limit", 20))
    for middle in ("canonical", "empty", "model"):
        # A smoke run: the tiny model writes random text, so few steps and one canvas suffice.
        argv = ["--limit", limit, "--middle", middle, "--steps", "4", "--max-tokens", "32"]
        args = _sub_args("dgemma_lsp.bench.humaneval", argv, parent)
        report = humaneval.run_from_args(args)
        source = f"model {report.model}" if middle == "model" else f"{middle} middle"
        rows.append((f"humaneval single-line x{report.problems}", f"pass@1 ({source})",
                     f"{report.pass_at_1:.1%} ({report.passed}/{report.problems})"))
        if report.generate_ms:
            rows.append((f"humaneval single-line x{report.problems}", "engine ms per problem",
                         f"p50 {report.generate_ms['p50']}  p99 {report.generate_ms['p99']}"))
    return rows


def _all_gpu(parent):
    from . import gpu

    report = gpu.run_benchmark(gpu.TINY, getattr(parent, "device", None) or "cpu", "float32",
                               compiled=False, log=say)
    rows = []
    for figure in report.diffusion:
        rows.append((f"gpu tiny {figure.mode} prompt {figure.prompt_tokens} x{figure.candidates}",
                     "ms/step, ms/canvas", f"{figure.ms_per_step:.1f}, {figure.ms_per_canvas:.1f}"))
    for figure in report.autoregressive:
        rows.append((f"gpu tiny autoregressive {figure.mode}", "ms/token", f"{figure.ms_per_token:.1f}"))
    return rows


def format_rows(rows: list[tuple[str, str, str]]) -> str:
    header = ("benchmark", "figure", "value")
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(3)]
    line = "  ".join("-" * width for width in widths)
    out = ["  ".join(cell.ljust(width) for cell, width in zip(header, widths, strict=True)), line]
    out += ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)) for row in rows]
    return "\n".join(out)



def main(argv: list[str] | None = None) -> int:
    """Stand-alone entry (`python -m dgemma_lsp.bench.cli all`), with the model options the main CLI adds."""
    parser = argparse.ArgumentParser(prog="python -m dgemma_lsp.bench.cli")
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--device", default=None)
    parser.add_argument("--dtype", default=None, choices=["bfloat16", "float16", "float32"])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
