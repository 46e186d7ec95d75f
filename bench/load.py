"""`dgemma-lsp bench load`: peak host memory and time of one model load, measured in this process.

Loads `--model` once with `--quantization` exactly as the engine does
(loading.load_model_and_tokenizer) and reports `peakRssBytes` (the process's
peak resident set, imports included: VmHWM), `baselineRssBytes`
(resident after the imports, before the load), `checkpointBytes` (the
safetensors shards on disk), `residentBytes` (the loaded model's parameters
and buffers, each tied tensor once), `loadMs` and `fromPackedCache` (a later
quantized start that read only the saved packed weights). `--fresh` removes the
saved packed weights first, to measure a first start. Weights on the CPU are
read once after the load (`page_in`): a mapped file counts only once read. One process per load:
peak RSS never goes down, so a second load in the same process would measure
nothing. Progress goes to stderr; the answer to stdout.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import sys
import time


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quantization", default=argparse.SUPPRESS, choices=["none", "fp8", "int8", "int4"],
                        help="weight-only quantization at load time (default none)")
    parser.add_argument("--fresh", action="store_true",
                        help="delete the saved packed weights first (measure a first quantized start)")


def run(args: argparse.Namespace) -> int:
    from dgemma_lsp.engine.errors import EngineError
    from dgemma_lsp.engine.progress import shard_progress_bar
    from dgemma_lsp.engine.runtime.denoising import _resident_bytes
    from dgemma_lsp.engine.weights.loading import (
        find_checkpoint,
        load_model_and_tokenizer,
        quantized_cache_dir,
        resolve_model_folder,
    )
    from dgemma_lsp.engine.weights.streaming import checkpoint_files

    quantization = getattr(args, "quantization", "none")
    try:
        folder = resolve_model_folder(args.model)
        found = find_checkpoint(args.model, folder)  # GGUF: its variant's file(s); else the safetensors shards
        checkpoint_bytes = sum(file.stat().st_size for file in (found.files or checkpoint_files(folder)))
        if args.fresh and quantization != "none":
            shutil.rmtree(quantized_cache_dir(folder, quantization), ignore_errors=True)
        baseline = current_rss_bytes()
        started = time.perf_counter()
        with shard_progress_bar() as progress:
            model, _, device = load_model_and_tokenizer(
                args.model, device=args.device, dtype=args.dtype, quantization=quantization, progress=progress
            )
        load_ms = (time.perf_counter() - started) * 1000
        page_in(model)
    except EngineError as error:
        sys.stderr.write(f"dgemma-lsp bench load: {error}\n")
        return 1
    report = {
        "model": args.model,
        "quantization": quantization,
        "device": str(device),
        "peakRssBytes": peak_rss_bytes(),
        "baselineRssBytes": baseline,
        "checkpointBytes": checkpoint_bytes,
        "format": found.label,
        "residentBytes": _resident_bytes(model),
        "loadMs": round(load_ms, 1),
        "fromPackedCache": bool(getattr(model, "loaded_from_packed_cache", False)),
    }
    if args.json:
        sys.stdout.write(json.dumps(report) + "\n")
    else:
        for key, value in report.items():
            shown = f"{value / 2**20:.1f} MiB" if key.endswith("Bytes") else value
            sys.stdout.write(f"{key:18} {shown}\n")
    return 0


def page_in(model) -> None:
    """Read every weight once. On a CPU `from_pretrained` maps the checkpoint file and reads
    pages only when a forward first touches them (every expert, for a 256-token canvas):
    without this the plain load's peak would leave out the weights it is about to read."""
    import torch

    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            if tensor.device.type == "cpu" and tensor.numel():
                tensor.view(-1)[:: max(1, 4096 // tensor.element_size())].sum()  # one element per page


def peak_rss_bytes() -> int:
    """Peak resident set of this process's memory: Linux's VmHWM, else ru_maxrss.

    Not ru_maxrss on Linux: it survives exec, so a benchmark started from a big parent
    (a test session holding models) reported the parent's size as its own peak.
    """
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # KiB on Linux, bytes on macOS


def current_rss_bytes() -> int:
    """Resident set now (Linux /proc; elsewhere the peak so far)."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * resource.getpagesize()
    except OSError:
        return peak_rss_bytes()
