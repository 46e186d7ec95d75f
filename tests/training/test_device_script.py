"""The GPU session's script, rehearsed on the CPU (issue 51): bench/device/train-tiny.sh with a CPU device, a micro
recipe and a budget of minutes runs every stage (packer, probe, a training cut by its budget, validation, what
comes back), bench/device/train-tiny-unpack.sh makes a run folder of what came back, and `ship` makes it a model
the product loads. So the GPU minutes are not spent on a bug the CPU could show."""

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
REHEARSAL = {
    "seed": 0,
    "data": {"languages": ["python"], "corpusBytes": 1_000_000, "tokenizerVocab": 8192, "maxPromptTokens": 320,
             "contextTokens": [48, 256], "suffixFirstShare": 0.5,
             "heldOutSources": ["rich", "click", "attrs", "pluggy", "h11"],
             "kindWeights": {"line": 0.4, "statement": 0.4, "lines": 0.2}},
    "model": {"hidden": 32, "intermediate": 64, "layers": 2, "heads": 2, "kvHeads": 1, "headDim": 16,
              "slidingWindow": 128, "experts": 4, "topK": 2, "moeIntermediate": 32, "canvas": 16, "spareIds": 64},
    "train": {"device": "auto", "precision": "bf16", "steps": 10**6, "batch": 4, "lr": 0.002, "warmup": 5,
              "weightDecay": 0.1, "clipNorm": 1.0, "selfConditioning": 0.5, "encoderLossWeight": 1.0, "eps": 0.001,
              "checkpointEvery": 10**6, "checkpointEveryCpuS": 15, "snapshotEveryCpuS": 15, "padWeight": 0.1,
              "answerEncoderWeight": 1.0, "cleanWeight": 0.3},
    "generation": {"steps": 4, "entropyBound": 0.1},
}


@pytest.mark.timeout(1200)
def test_the_gpu_script_runs_every_stage_on_a_cpu_and_what_comes_back_ships(tmp_path):
    recipe = tmp_path / "rehearsal.json"
    recipe.write_text(json.dumps(REHEARSAL))
    out, run = tmp_path / "out", tmp_path / "device-run"
    out.mkdir()
    env = dict(os.environ, OUT=str(out), DEVICE="cpu", SKIP_INSTALL="1", PY=sys.executable, PROBE_ARGS="",
               PROBE_S="60", PROBE_STEPS="1", BUDGET_S="240", RESERVE_S="90", VALIDATION_HOLES="12",
               VALIDATION_S="40", WORKERS="1", RECIPE=str(recipe), RUN=str(run), SHARDS=str(tmp_path / "shards"),
               DGEMMA_LSP_CACHE=str(tmp_path / "cache"))
    done = subprocess.run(["bash", "bench/device/train-tiny.sh"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    log = (out / "log.txt").read_text()
    assert done.returncode == 0, log[-3000:]
    # What comes back fits $OUT's rules: few files, none over 16 MiB, names of letters, digits, '.', '_' and '-'.
    sent = sorted(p.name for p in out.iterdir())
    assert "log.txt" in sent and "run.tgz" in sent and "model.safetensors.part-aa" in sent and len(sent) <= 8, sent
    assert all(p.stat().st_size <= 16 * 2**20 for p in out.iterdir())
    with tarfile.open(out / "run.tgz") as archive:
        names = set(archive.getnames())
    assert {"./model/training.json", "./corpus.json", "./log.jsonl", "./validation.jsonl",
            "./validation-focus.jsonl", "./model.safetensors.sha256"} <= names
    assert not any(name.endswith((".safetensors", ".pt")) for name in names)  # the weights travel as parts

    here = tmp_path / "runs" / "tiny-code-gpu"
    subprocess.run(["bash", "bench/device/train-tiny-unpack.sh", str(out), str(here)], cwd=ROOT, check=True,
                   env=dict(os.environ, PY=sys.executable), timeout=300)
    record = json.loads((here / "model" / "training.json").read_text())
    assert record["stoppedBy"] == "time" and record["precision"] == "bf16" and record["flops"] > 0
    assert record["examples"]["shards"] >= 1
    snapshot = sorted((here / "snapshots").iterdir())[-1]
    assert snapshot.name.startswith("cpu-")  # a CPU rehearsal counts CPU-seconds; a GPU run writes gpu-NNNNNN.pt
    lines = [json.loads(line) for line in (here / "validation.jsonl").read_text().splitlines()]
    assert lines and lines[-1]["holes"] == 12 and lines[-1]["step"] == record["steps"]

    # Shipped as a model folder the product loads, naming the context it was trained on.
    target = tmp_path / "tiny"
    subprocess.run([sys.executable, "-m", "dgemma_lsp.engine.training.ship", str(here), "--snapshot", snapshot.name,
                    "--to", str(target)], cwd=ROOT, check=True, timeout=300)
    tokenizer_config = json.loads((target / "tokenizer_config.json").read_text())
    assert tokenizer_config["dgemma_context_tokens"] == 256
    assert json.loads((target / "training.json").read_text())["steps"] == record["steps"]
    answer = subprocess.run(
        [sys.executable, "-m", "dgemma_lsp.server.cli", "complete", "examples/fib.py:8:12", "--model", str(target),
         "--steps", "2", "--json"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert answer.returncode == 0, answer.stderr[-2000:]


def test_the_probe_times_the_recipes_model_and_another_shape(tmp_path):
    recipe = tmp_path / "rehearsal.json"
    recipe.write_text(json.dumps(REHEARSAL))
    done = subprocess.run([sys.executable, "bench/device/train_probe.py", str(recipe), "runs/tiny-code-cpu/tokenizer",
                           "--device", "cpu", "--steps", "1", "--batch", "2", "--shape", "shallow:32,64,1,2,1,32"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert [line["variant"] for line in lines] == ["recipe", "shallow"]
    recipe_line, shallow = lines
    assert "error" not in recipe_line and "error" not in shallow, lines
    assert recipe_line["batch"] == 2 and recipe_line["steps"] == 1 and recipe_line["secondsPerStep"] > 0
    assert shallow["flopParameters"] < recipe_line["flopParameters"]  # one layer of the same width instead of two
    assert recipe_line["tflops6ND"] >= 0 and recipe_line["peakMemoryGiB"] is None  # no card to read it from
