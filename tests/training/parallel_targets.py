"""Targets for parallel.launch in the tests: module-level, so that spawned ranks can import them."""

import atexit
import os
import resource
import signal
import threading
from pathlib import Path

import torch


def average_gradients(ranks) -> int:
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


def one_rank_fails(how: str, ranks) -> int:
    """Rank 1 fails (`how`: "raises" or "aborts", as a C++ `std::terminate` does) once both ranks have met.

    Rank 0 traps SIGTERM as a training rank does (train.py's stop request) and then waits for something
    that never comes: only a kill ends it, as only a kill ends a rank blocked in a collective with a rank
    that is alive but stuck."""
    if ranks.rank == 0:
        signal.signal(signal.SIGTERM, lambda signum, frame: None)
    ranks.barrier()  # rank 0's trap is set before rank 1 can fail
    if ranks.rank == 1:
        if how == "aborts":
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core file left in the working directory
            os.abort()
        raise RuntimeError("rank 1 fails on purpose")
    threading.Event().wait()
    return 0


def build_the_model(report: str, ranks) -> int:
    """Build the tiny DiffusionGemma in each rank once the ranks have met, as train.py builds its model (transformers
    then imports parts of torch.distributed), and write the threads still alive at the interpreter's shutdown
    (atexit runs after parallel.py's teardown) to `report`-RANK."""
    from dgemma_lsp.engine.model.tiny_model import build_tiny_model

    build_tiny_model()
    ranks.sum([1.0])
    atexit.register(_write_thread_names, Path(f"{report}-{ranks.rank}"))
    return 0


def _write_thread_names(path: Path) -> None:
    tasks = Path("/proc/self/task")
    path.write_text("\n".join(sorted((task / "comm").read_text().strip() for task in tasks.iterdir())) + "\n")
