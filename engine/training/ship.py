"""`python -m dgemma_lsp.engine.training.ship RUN_DIR [--snapshot FILE]`: a run's snapshot becomes `--model tiny`.

The snapshot is exported (train.export: bf16 weights, tokenizer, the corpus manifest with every
source's licence, and a training record with the CPU-seconds and tokens it cost) into a model
folder. `export_snapshot` is shared with bench/tiny_code.py, which scores snapshots the same
way; `ship` writes into the package's data/tiny/ (runtime/tiny_model.py loads it from there),
replacing what was there only once the new folder is complete. Knows torch and transformers;
knows nothing of LSP.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

MAX_SHIPPED_BYTES = 30 * 1024 * 1024
"""Issue 28: the package's weights stay small enough to ship in the wheel."""
PROMPT_LAYOUT = "suffix-first"
"""The layout an exported model asks for when a request names none (prompting.MODEL_LAYOUT_KEY). The
recipe trains on both; on the same 300 held-out holes the long run's snapshots at 3.0, 3.2, 3.3 and
6.2 CPU-hours read suffix-first with lower losses in all four (causal answer loss 0.03-0.06 lower) and
equal or higher accuracies in all but two of twelve figures (`validation --layout suffix-first`;
bench/RESULTS.md, "The tiny model"), and a keystroke then re-encodes ~35 prompt tokens instead of ~390."""


def export_snapshot(run_dir: Path, snapshot: Path, folder: Path, prompt_layout: str = PROMPT_LAYOUT) -> dict:
    """Write `snapshot` of the run as a loadable model folder that asks for `prompt_layout` and names the longest
    context it was trained on (MODEL_CONTEXT_KEY: the server cuts every request's context to it); its training
    record."""
    from ..model.prompting import MODEL_CONTEXT_KEY, MODEL_LAYOUT_KEY
    from .train import export
    from .validation import load_weights

    model, tokenizer, recipe, state = load_weights(run_dir, snapshot)
    record = {"recipe": recipe, "snapshot": snapshot.name, "steps": state["step"], "tokens": state["tokens"],
              "cpuSeconds": state.get("cpuSeconds"), "answerTokens": state.get("answerTokens"),
              **{key: state[key] for key in ("gpuSeconds", "flops") if key in state}}
    tokenizer.init_kwargs[MODEL_LAYOUT_KEY] = prompt_layout  # save_pretrained writes it to tokenizer_config.json
    tokenizer.init_kwargs[MODEL_CONTEXT_KEY] = max(recipe["data"]["contextTokens"])  # training drew budgets in [low, high]
    export(model, tokenizer, folder, record, run_dir / "corpus.json")
    return record


def ship(run_dir: Path, snapshot: Path, target: Path) -> dict:
    """Replace the model folder `target` with `snapshot` of the run; refuses one over MAX_SHIPPED_BYTES or one
    without the run's corpus manifest."""
    staging = target.with_name(target.name + ".new")
    shutil.rmtree(staging, ignore_errors=True)
    record = export_snapshot(run_dir, snapshot, staging)
    if not (staging / "corpus.json").exists():
        shutil.rmtree(staging)
        raise FileNotFoundError(f"{run_dir}/corpus.json is missing: a shipped model names every source it was "
                                "trained on, with its licence")
    size = sum(path.stat().st_size for path in staging.iterdir())
    if size > MAX_SHIPPED_BYTES:
        shutil.rmtree(staging)
        raise ValueError(f"{snapshot} exports to {size / 2**20:.1f} MiB, over the {MAX_SHIPPED_BYTES / 2**20:.0f} MiB "
                         "a shipped model may take")
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    return record


def snapshot_from_model(run_dir: Path, folder: Path | None = None) -> Path:
    """The run's exported model folder (what a GPU call brings back: bf16 weights and the training record) as a
    snapshot of the run, snapshots/gpu-NNNNNN.pt (cpu-NNNNNN.pt for a CPU run), so that validation,
    bench.tiny_code and `ship` read it as they read any snapshot. Returns its path."""
    import torch

    from .train import initial_state

    folder = folder or run_dir / "model"
    weights, counters = initial_state(folder)
    record = json.loads((folder / "training.json").read_text())
    clock = "gpu" if record.get("gpuSeconds") else "cpu"
    path = run_dir / "snapshots" / f"{clock}-{int(record.get(f'{clock}Seconds') or 0):06d}.pt"
    path.parent.mkdir(exist_ok=True)
    weights = {name: value.to(torch.bfloat16) if value.is_floating_point() else value for name, value in weights.items()}
    torch.save({"model": weights, **counters, "step": record["steps"]}, path)
    return path


def snapshot_path(run_dir: Path, name: str | None) -> Path:
    """`name` of RUN_DIR/snapshots (the newest when None), or `checkpoint.pt` (the run's latest state)."""
    if name == "checkpoint.pt":
        return run_dir / name
    if name is not None:
        return run_dir / "snapshots" / name
    from .validation import run_snapshots

    snapshots = run_snapshots(run_dir)
    if not snapshots:
        raise FileNotFoundError(f"{run_dir}/snapshots has no cpu-*.pt or gpu-*.pt")
    return snapshots[-1]



def main(argv=None) -> int:
    from ..model.tiny_model import shipped_tiny_dir

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--snapshot", help="a file of RUN_DIR/snapshots (default: the newest), or checkpoint.pt")
    parser.add_argument("--to", type=Path, help="the model folder to replace (default: the package's `tiny`)")
    args = parser.parse_args(argv)
    target = args.to or shipped_tiny_dir()
    record = ship(args.run_dir, snapshot_path(args.run_dir, args.snapshot), target)
    summary = {key: record[key] for key in ("snapshot", "steps", "tokens", "cpuSeconds", "answerTokens", "gpuSeconds")
               if key in record}
    sys.stderr.write(f"shipped to {target}: {json.dumps(summary)}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
