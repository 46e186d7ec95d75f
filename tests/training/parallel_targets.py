"""Targets for parallel.launch in the tests: module-level, so that spawned ranks can import them."""

import torch


def average_gradients(args, ranks) -> int:
    """Each rank gives its own gradients; after averaging every rank must hold the expected ones."""
    both, first_only, neither = (torch.nn.Parameter(torch.zeros(3)) for _ in range(3))
    both.grad = torch.full((3,), float(ranks.rank + 1))  # 1 and 2: mean 1.5
    first_only.grad = torch.full((3,), 4.0) if ranks.rank == 0 else None  # mean with a zero: 2
    ranks.average_gradients([both, first_only, neither])
    summed = ranks.sum([1.0, float(ranks.rank)])  # every rank calls every collective, whatever it finds
    checks = [torch.equal(both.grad, torch.full((3,), 1.5)), torch.equal(first_only.grad, torch.full((3,), 2.0)),
              neither.grad is None, summed == [2.0, 1.0],
              list(ranks.share(5)) == ([0, 1] if ranks.rank == 0 else [2, 3, 4])]
    ok = all(checks)
    if not ok:
        print(f"rank {ranks.rank}: {checks}", flush=True)  # noqa: T201 - the test reads the exit status
    return 0 if ok else 3


def one_rank_fails(args, ranks) -> int:
    """Rank 1 dies; rank 0 would wait for it in the barrier until gloo's timeout (hours)."""
    if ranks.rank == 1:
        raise RuntimeError("rank 1 fails on purpose")
    ranks.barrier()
    return 0
