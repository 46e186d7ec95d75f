"""Example shards: what packing.py's workers write and the trainer reads (issue 51).

A shard (`shard-NNNNNN.npz`) holds SHARD_EXAMPLES examples cut by an RNG of (seed, index): their prompt ids flat
with offsets, their canvases and kinds. `ShardSource` is the trainer's end (`dgemma-lsp train --examples DIR`): it
takes the shards as they appear, makes a batch of examples of like prompt length (BUCKET_TOKENS), and gives each
fresh batch once; when no fresh one is ready (the GPU ahead of the workers) it gives an earlier batch again
(`repeats`: the noise the objective draws is new each time) rather than wait. So the order of batches depends on
timing, not only on the seed. Knows the examples' layout and files; knows torch only to collate.
"""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

import numpy as np

SHARD_EXAMPLES = 512
"""Examples a shard holds: a worker cuts one in a few seconds, so the first batches are ready at once."""
HOLES_PER_FILE = 8
"""Holes cut from one parsed file: 8 cut an example in 3.2 ms on the development CPU, where `make` (one hole
a parse) took 8.3 (issue 51's measure, 64-1,024-token contexts); a batch still draws on many files."""
BUCKET_TOKENS = 64
"""A batch's prompts differ in length by less than this: a batch is padded to its longest prompt, and the
recipes draw prompts of 50-1,150 tokens, so a batch of random lengths would be about half padding."""


def cut_shard(maker, files, focus_files, focus_share: float, seed: int, index: int,
              count: int = SHARD_EXAMPLES) -> dict[str, np.ndarray]:
    """Shard `index`: `count` examples, HOLES_PER_FILE at a time from files picked by an RNG of (seed, index)."""
    from .examples import KINDS

    rng = random.Random(f"shard:{seed}:{index}")
    examples = []
    while len(examples) < count:
        pool = focus_files if focus_files and rng.random() < focus_share else files
        examples += maker.make_many(pool[rng.randrange(len(pool))], rng, min(HOLES_PER_FILE, count - len(examples)))
    lengths = np.array([len(e.prompt_ids) for e in examples], dtype=np.int64)
    return {
        "prompt": np.concatenate([np.asarray(e.prompt_ids, dtype=np.int32) for e in examples]),
        "offsets": np.concatenate([[0], np.cumsum(lengths)]),
        "canvas": np.asarray([e.canvas_ids for e in examples], dtype=np.int32),
        "kind": np.asarray([KINDS.index(e.kind) for e in examples], dtype=np.int8),
        "index": np.asarray(index),
    }


def write_shard(folder: Path, index: int, arrays: dict[str, np.ndarray]) -> Path:
    """`shard-NNNNNN.npz`, renamed into place once whole: a reader never sees half a shard."""
    path = folder / f"shard-{index:06d}.npz"
    staging = folder / f".shard-{index:06d}.tmp.npz"
    np.savez(staging, **arrays)
    staging.replace(path)
    return path


def read_shard(path: Path) -> tuple[list[np.ndarray], np.ndarray]:
    """A shard's prompts (one array each) and canvases [N, C]."""
    with np.load(path) as data:
        prompt, offsets, canvas = data["prompt"], data["offsets"], data["canvas"]
    return [prompt[offsets[i]:offsets[i + 1]] for i in range(len(offsets) - 1)], canvas


def collate_arrays(prompts: list[np.ndarray], canvases: np.ndarray, pad_id: int, end_id: int):
    """objective.collate for arrays: left-padded prompts and clean canvases as a Batch (the same tensors)."""
    import torch

    from .objective import Batch, answer_positions

    width = max(len(p) for p in prompts)
    ids = np.full((len(prompts), width), pad_id, dtype=np.int64)
    mask = np.zeros((len(prompts), width), dtype=np.int64)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt):] = prompt
        mask[row, width - len(prompt):] = 1
    canvas = torch.from_numpy(np.ascontiguousarray(canvases, dtype=np.int64))
    return Batch(torch.from_numpy(ids), torch.from_numpy(mask), canvas, answer_positions(canvas, pad_id, end_id))


class ShardSource:
    """Batches of `batch_size` examples from the shards in `folder`, as the packer writes them (module docstring).

    Fresh examples wait in buckets of BUCKET_TOKENS of prompt length; a bucket that holds a batch gives it.
    `wait_s`: how long `next_batch` waits for the first batch before it gives up (a packer that never started)."""

    def __init__(self, folder: Path, batch_size: int, pad_id: int, end_id: int, seed: int, *,
                 wait_s: float = 600.0, sleep=time.sleep, clock=time.monotonic) -> None:
        self.folder, self.batch_size = Path(folder), batch_size
        self.pad_id, self.end_id = pad_id, end_id
        self.rng = random.Random(f"batches:{seed}")
        self.wait_s, self.sleep, self.clock = wait_s, sleep, clock
        self.seen: set[str] = set()
        self.buckets: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {}  # length // BUCKET_TOKENS -> fresh
        self.given: list[list[tuple[np.ndarray, np.ndarray]]] = []  # batches given once: what a repeat draws on
        self.shards = 0
        self.examples = 0
        """Fresh examples given (each once)."""
        self.repeats = 0
        """Batches given again for want of a fresh one."""

    def next_batch(self):
        """The next Batch (CPU tensors): a fresh one when a bucket holds one, else an earlier one again."""
        self._absorb()
        rows = self._fresh_batch()
        if rows is None and not self.given:  # nothing to train on yet: the packer is starting
            deadline = self.clock() + self.wait_s
            while rows is None:
                if self.clock() > deadline:
                    raise TimeoutError(f"no batch of {self.batch_size} examples in {self.folder} "
                                       f"after {self.wait_s:.0f} s: is the packer running?")
                self.sleep(0.2)
                self._absorb()
                rows = self._fresh_batch()
        if rows is not None:
            self.given.append(rows)
            self.examples += len(rows)
        else:
            rows = self.given[self.rng.randrange(len(self.given))]
            self.repeats += 1
        return collate_arrays([p for p, _ in rows], np.stack([c for _, c in rows]), self.pad_id, self.end_id)

    def counters(self) -> dict:
        return {"shards": self.shards, "freshExamples": self.examples, "repeatedBatches": self.repeats}

    def _absorb(self) -> None:
        names = sorted(entry.name for entry in os.scandir(self.folder)
                       if entry.name.startswith("shard-") and entry.name.endswith(".npz") and entry.name not in self.seen)
        for name in names:
            prompts, canvases = read_shard(self.folder / name)
            for prompt, canvas in zip(prompts, canvases, strict=True):
                self.buckets.setdefault(len(prompt) // BUCKET_TOKENS, []).append((prompt, canvas))
            self.seen.add(name)
            self.shards += 1

    def _fresh_batch(self) -> list | None:
        """A batch from the fullest bucket that holds one (its examples drawn at random), or None."""
        key, bucket = max(self.buckets.items(), key=lambda item: len(item[1]), default=(None, []))
        if len(bucket) < self.batch_size:
            return None
        self.rng.shuffle(bucket)
        rows, self.buckets[key] = bucket[:self.batch_size], bucket[self.batch_size:]
        return rows
