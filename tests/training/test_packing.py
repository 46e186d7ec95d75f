"""Examples cut ahead into shards (engine/training/packing.py, shards.py) and a run that trains from them on a time budget:
shard k is the same whatever the timing, the trainer's batches hold every fresh example once in prompts of like
length and repeat rather than wait, and a run stopped by its budget saves, snapshots, exports and starts the next
run from its weights."""

import json
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from dgemma_lsp.engine.model.tiny_model import build_tiny_tokenizer
from dgemma_lsp.engine.training.corpus import CodeFile
from dgemma_lsp.engine.training.examples import ExampleMaker, end_of_turn_id
from dgemma_lsp.engine.training.objective import collate
from dgemma_lsp.engine.training.packing import pack
from dgemma_lsp.engine.training.shards import (
    BUCKET_TOKENS,
    SHARD_EXAMPLES,
    ShardSource,
    collate_arrays,
    cut_shard,
    read_shard,
    write_shard,
)
from tests.training.conftest import MICRO
from tests.training.test_training import SAMPLE


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_tokenizer()


def _maker(tokenizer):
    return ExampleMaker(tokenizer, 16, max_prompt_tokens=256, context_tokens=(32, 160))


def test_a_shard_holds_the_examples_its_seed_cuts_and_collates_as_the_objective_does(tokenizer, tmp_path):
    files = [CodeFile(source="sample", path="sample.py", language="python", text=SAMPLE)]
    arrays = cut_shard(_maker(tokenizer), files, [], 0.0, seed=3, index=7, count=40)
    again = cut_shard(_maker(tokenizer), files, [], 0.0, seed=3, index=7, count=40)
    other = cut_shard(_maker(tokenizer), files, [], 0.0, seed=3, index=8, count=40)
    assert all(np.array_equal(arrays[key], again[key]) for key in arrays)
    assert not np.array_equal(arrays["prompt"], other["prompt"])
    prompts, canvases = read_shard(write_shard(tmp_path, 7, arrays))
    assert len(prompts) == 40 and canvases.shape == (40, 16)
    end = end_of_turn_id(tokenizer)
    assert all(end in row for row in canvases.tolist())
    mine = collate_arrays(prompts[:5], canvases[:5], tokenizer.pad_token_id, end)
    theirs = collate([p.tolist() for p in prompts[:5]], canvases[:5].tolist(), tokenizer.pad_token_id, end)
    for name in ("prompt_ids", "prompt_mask", "canvas_ids", "answer_mask"):
        assert torch.equal(getattr(mine, name), getattr(theirs, name)), name


def _shard(folder: Path, index: int, lengths: list[int], canvas: int = 8) -> None:
    prompts = [np.full(length, 10 + index, dtype=np.int32) for length in lengths]
    rows = np.asarray([[5, 1] + [0] * (canvas - 2)] * len(lengths), dtype=np.int32)
    write_shard(folder, index, {"prompt": np.concatenate(prompts),
                                "offsets": np.concatenate([[0], np.cumsum(lengths)]),
                                "canvas": rows, "kind": np.zeros(len(lengths), np.int8), "index": np.asarray(index)})


def test_batches_give_every_fresh_example_once_in_prompts_of_like_length_then_repeat(tmp_path):
    rng = random.Random(0)
    _shard(tmp_path, 0, [rng.randrange(20, 600) for _ in range(300)])
    source = ShardSource(tmp_path, 8, pad_id=0, end_id=1, seed=0)
    widths, padding = [], []
    while source.repeats == 0:
        batch = source.next_batch()
        lengths = batch.prompt_mask.sum(-1)
        widths.append(batch.prompt_ids.shape[1])
        padding.append(int(lengths.max() - lengths.min()))
    assert source.examples % 8 == 0 and source.examples > 300 - 10 * 8  # a few left in unfilled buckets
    assert max(padding) < BUCKET_TOKENS  # like lengths: a batch is padded by less than a bucket
    assert len(set(widths)) > 5  # and the buckets take turns
    # New shards are taken as they appear, and fresh batches come before repeats again.
    _shard(tmp_path, 1, [100] * 16)
    before = source.repeats
    assert source.next_batch().prompt_ids[0, -1].item() == 11 and source.repeats == before
    assert source.counters() == {"shards": 2, "freshExamples": source.examples, "repeatedBatches": before}


def test_a_source_without_shards_waits_then_says_why(tmp_path):
    clock = [0.0]

    def sleep(seconds):
        clock[0] += seconds

    source = ShardSource(tmp_path, 4, pad_id=0, end_id=1, seed=0, wait_s=5.0, sleep=sleep, clock=lambda: clock[0])
    with pytest.raises(TimeoutError):
        source.next_batch()
    assert clock[0] >= 5.0


def _micro_run(run_dir: Path, **train) -> None:
    recipe = json.loads(json.dumps(MICRO))
    recipe["data"].update(corpusBytes=400_000, heldOutSources=["rich", "click"])
    recipe["train"].update(steps=10**6, checkpointEvery=10**6, snapshotEveryCpuS=10**6, precision="bf16", **train)
    run_dir.mkdir(parents=True)
    (run_dir / "recipe.json").write_text(json.dumps(recipe))
    build_tiny_tokenizer().save_pretrained(run_dir / "tokenizer")


def _train(run_dir: Path, shards: Path, seconds: int, *extra: str) -> None:
    done = subprocess.run([sys.executable, "-m", "dgemma_lsp.server.cli", "train", str(run_dir), "--examples",
                           str(shards), "--seconds", str(seconds), "--device", "cpu", "--threads", "1", "--quiet",
                           *extra], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.timeout(1500)
def test_a_run_trains_from_packed_shards_within_its_budget_and_the_next_starts_from_its_weights(tmp_path):
    run = tmp_path / "run"
    _micro_run(run)
    summary = pack(run, tmp_path / "shards", workers=2, shards=2)
    assert summary["shards"] == 2 and summary["failedWorkers"] == []
    assert sorted(p.name for p in (tmp_path / "shards").iterdir()) == ["shard-000000.npz", "shard-000001.npz"]
    assert len(read_shard(tmp_path / "shards" / "shard-000001.npz")[0]) == SHARD_EXAMPLES
    # The packer wrote the manifest (the trainer reads no corpus); the held-out sources are not in it.
    manifest = json.loads((run / "corpus.json").read_text())
    assert manifest["tokens"] > 0 and manifest["heldOut"] == ["rich", "click"]
    assert not {source["name"] for source in manifest["sources"]} & {"rich", "click"}

    _train(run, tmp_path / "shards", 20)
    record = json.loads((run / "model" / "training.json").read_text())
    assert record["stoppedBy"] == "time" and record["steps"] >= 1
    assert record["gpuSeconds"] == 0.0 and record["precision"] == "bf16" and record["device"] == "cpu"
    assert record["flops"] == pytest.approx(6 * record["flopParameters"] * record["tokens"])
    assert record["examples"]["freshExamples"] + 2 * record["examples"]["repeatedBatches"] >= 2 * record["steps"]
    lines = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    assert lines[-1]["step"] == record["steps"] and lines[-1]["flops"] == record["flops"]
    snapshots = sorted((run / "snapshots").iterdir())
    assert [p.name.split("-")[0] for p in snapshots] == ["cpu", "cpu"]  # the start and where the budget ended
    assert torch.load(snapshots[-1], weights_only=False)["step"] == record["steps"]

    # The next session: a new run from the exported weights, a fresh optimizer, the cost carried on.
    nxt = tmp_path / "next"
    _micro_run(nxt)
    (nxt / "corpus.json").write_text((run / "corpus.json").read_text())
    _train(nxt, tmp_path / "shards", 15, "--init", str(run / "model"))
    second = json.loads((nxt / "model" / "training.json").read_text())
    assert second["initFrom"] == str(run / "model") and second["tokens"] > record["tokens"]
    assert second["flops"] > record["flops"]
    start = torch.load(sorted((nxt / "snapshots").iterdir())[0], weights_only=False)
    assert start["step"] == 0
    from safetensors.torch import load_file

    exported = load_file(run / "model" / "model.safetensors")
    assert all(torch.equal(start["model"][name], value) for name, value in exported.items() if name in start["model"])


def test_ship_refuses_a_run_without_its_corpus_manifest(tmp_path):
    """A GPU run's trainer exports its weights even when the packer never wrote the manifest; ship does not."""
    from dgemma_lsp.engine.training.ship import ship
    from dgemma_lsp.engine.training.train import build_model

    run = tmp_path / "run"
    _micro_run(run)
    tokenizer = build_tiny_tokenizer()
    (run / "snapshots").mkdir()
    weights = {name: value.to(torch.bfloat16) if value.is_floating_point() else value
               for name, value in build_model(json.loads((run / "recipe.json").read_text()), tokenizer, 0)
               .state_dict().items()}
    torch.save({"model": weights, "step": 0, "tokens": 0, "answerTokens": 0}, run / "snapshots" / "gpu-000010.pt")
    target = tmp_path / "tiny"
    target.mkdir()
    (target / "model.safetensors").write_text("the model shipped before")
    with pytest.raises(FileNotFoundError):
        ship(run, run / "snapshots" / "gpu-000010.pt", target)
    assert (target / "model.safetensors").read_text() == "the model shipped before"
    (run / "corpus.json").write_text(json.dumps({"sources": [], "tokens": 0}))
    ship(run, run / "snapshots" / "gpu-000010.pt", target)
    assert json.loads((target / "corpus.json").read_text()) == {"sources": [], "tokens": 0}
