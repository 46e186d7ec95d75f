"""The `dgemma-lsp` command line: argument parsing and dispatch, nothing else.

`dgemma-lsp [--stdio]` serves LSP (the default). Subcommands:
  complete / rewrite  one-shot infill or rewrite in a file (oneshot.py)
  fetch-model         download the real checkpoint into the Hugging Face cache (oneshot.py)
  engine              start/stop/status of the resident engine daemon (daemon_cli.py)
  doctor              what this machine can run and what is missing (doctor.py)
  bench               benchmarks (dgemma_lsp.bench.cli)
Each subcommand module offers `add_arguments(parser)` and `run(args) -> int`;
they are imported only when chosen, so `--stdio` starts without torch.
Logs go to stderr or --log-file; stdout belongs to the protocol or the answer.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys

from dgemma_lsp.engine.model.folders import DEFAULT_MODEL_ID

from . import package_version

SUBCOMMANDS = {
    "complete": ("dgemma_lsp.server.oneshot", "complete", "infill at FILE:LINE:COL (1-based)"),
    "rewrite": ("dgemma_lsp.server.oneshot", "rewrite", "rewrite FILE:L:C-L:C (1-based)"),
    "fetch-model": ("dgemma_lsp.server.oneshot", "fetch_model", "download the model into the HF cache"),
    "engine": ("dgemma_lsp.server.daemon_cli", None, "start|stop|status the resident engine daemon"),
    "bench": ("dgemma_lsp.bench.cli", None, "benchmarks (`dgemma-lsp bench --help` lists them)"),
    "doctor": ("dgemma_lsp.server.doctor", None, "what this machine can run, what is missing, and how to fix it"),
    "stats": ("dgemma_lsp.server.stats", None, "accepted share and latency of inline completions (local only)"),
    "train": ("dgemma_lsp.engine.training.train", None, "train a small DiffusionGemma on local code"),
}


def _add_model_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model", default=DEFAULT_MODEL_ID,
        help=f"a Hugging Face id (default {DEFAULT_MODEL_ID}), a local folder, 'tiny' (built in, trained on a CPU) "
             "or 'tiny-random' (built in, random weights: for tests); "
             "with --engine vllm, the name the server serves",
    )
    parser.add_argument("--device", default=None, help="torch device (default: cuda if present, else cpu)")
    parser.add_argument("--dtype", default=None, choices=["bfloat16", "float16", "float32"])
    parser.add_argument(
        "--quantization", default="none", choices=["none", "fp8", "int8", "int4"],
        help="weight-only quantization of the experts and linears at load time",
    )
    parser.add_argument(
        "--compile", default=None, choices=["auto", "on", "off"],
        help="denoising steps as CUDA graph replays (auto: on for CUDA); passed to the engine as DGEMMA_LSP_COMPILE",
    )
    parser.add_argument(
        "--cpu-threads", type=_at_least_one, default=None, metavar="N",
        help="torch CPU threads of the engine (default: all cores but one for the engine that serves "
             "the editor, torch's own for one-shot commands); passed to a daemon as DGEMMA_LSP_CPU_THREADS",
    )


def _at_least_one(value: str) -> int:
    if not value.strip().isdigit() or int(value) < 1:
        raise argparse.ArgumentTypeError(f"wants a whole number of at least 1, got {value!r}")
    return int(value)


def _add_logging_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--log-file", default=None, help="write logs here instead of stderr")
    parser.add_argument("--log-level", default="WARNING", type=str.upper,  # `debug` or `Debug` too
                        choices=["DEBUG", "INFO", "WARNING", "ERROR"])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dgemma-lsp", description="Language server for live code infill from DiffusionGemma."
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")
    # Serving options live on the top-level parser: `dgemma-lsp --stdio` is what editors run.
    from . import serve

    serve.add_arguments(parser)
    _add_model_arguments(parser)
    _add_logging_arguments(parser)
    subparsers = parser.add_subparsers(dest="command")
    for name, (module_name, function, help_text) in SUBCOMMANDS.items():
        sub = subparsers.add_parser(name, help=help_text, description=help_text)
        _add_model_arguments(sub)
        _add_logging_arguments(sub)
        module = importlib.import_module(module_name)
        add_arguments = getattr(module, f"add_{function}_arguments" if function else "add_arguments")
        add_arguments(sub)
        sub.set_defaults(_module=module_name, _function=function)
    return parser


def configure_logging(level: str, log_file: str | None) -> None:
    handler = logging.FileHandler(log_file) if log_file else logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except KeyboardInterrupt:
        # Ctrl-C: what was stopped needs no traceback, but a word (a bare 130 looks like a crash).
        sys.stderr.write("dgemma-lsp: interrupted\n")
        return 130
    except BrokenPipeError:
        # The reader closed the pipe (`dgemma-lsp complete ... | head -c1`): end quietly, as a
        # command killed by SIGPIPE would; stdout goes to devnull so the exit flush cannot fail.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


def _main(argv: list[str] | None) -> int:
    args = build_parser().parse_args(argv)
    configure_logging(args.log_level, args.log_file)
    if args.compile is not None:
        # Through the environment, so an engine daemon this process spawns inherits it too.
        os.environ["DGEMMA_LSP_COMPILE"] = args.compile
    if getattr(args, "cpu_threads", None) is not None:
        os.environ["DGEMMA_LSP_CPU_THREADS"] = str(args.cpu_threads)
    if args.command is None:
        from . import serve

        return serve.run(args)
    module = importlib.import_module(args._module)
    run = getattr(module, f"run_{args._function}" if args._function else "run")
    status = run(args)
    sys.stdout.flush()  # a command's answer: a reader that left early is noticed here, not at exit
    return status


if __name__ == "__main__":
    sys.exit(main())
