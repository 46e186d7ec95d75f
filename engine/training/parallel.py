"""Data-parallel training on one machine's cores: W processes of one torch thread, one batch split between them.

Why: on the 2-core development machine the long run's recipe took 1.43-1.62 CPU-s (and wall
seconds) a step in one process of one thread; in two ranks it takes 0.84-1.08 wall seconds a step
for 1.5-2.0 CPU-s (session 44, bench/RESULTS.md): 1.5-1.8x the steps an hour, for up to a fifth
more CPU a step. (Two threads in one process: 1.5x for a third more, before the examples, which
one thread cuts.) torch.distributed's gloo backend carries one all-reduce of the flattened
gradients a step and the step's counters.
DistributedDataParallel is not used: the objective calls the model's encoder and decoder directly,
around the forward hooks DDP relies on.

`Ranks` is a world of one when training is not distributed; every call is then the identity, so a
one-process run is exactly what it was. `launch` starts the ranks (spawn start method), forwards
SIGINT/SIGTERM to them (the ranks agree to stop at the same step; rank 0 saves), stops the others
when one fails, and returns rank 0's exit status. Knows torch; knows nothing of the recipe.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
from collections.abc import Callable
from datetime import timedelta

log = logging.getLogger(__name__)


class Ranks:
    """This process's place among the ranks, and the few collective operations training needs."""

    def __init__(self, rank: int = 0, world: int = 1) -> None:
        self.rank, self.world = rank, world

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def share(self, batch: int) -> range:
        """The indices of a batch's examples this rank trains on (a world of one: all of them)."""
        return range(self.rank * batch // self.world, (self.rank + 1) * batch // self.world)

    def barrier(self) -> None:
        if self.world > 1:
            import torch.distributed as dist

            dist.barrier()

    def any(self, flag: bool) -> bool:
        """True on every rank when it is true on one (a stop request)."""
        if self.world == 1:
            return flag
        import torch
        import torch.distributed as dist

        value = torch.tensor([int(flag)])
        dist.all_reduce(value, op=dist.ReduceOp.MAX)
        return bool(value.item())

    def sum(self, values: list[float]) -> list[float]:
        """Each value summed over the ranks, in float64."""
        if self.world == 1:
            return values
        import torch
        import torch.distributed as dist

        summed = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(summed)
        return summed.tolist()

    def average_gradients(self, parameters) -> None:
        """Every rank's gradients replaced by their mean over the ranks: each rank's loss is a mean over its
        share of the batch, so the mean of the ranks' gradients is the whole batch's, as one process gets it.
        A parameter no rank gave a gradient (an expert no token was routed to) keeps none, so AdamW skips it
        as it would in one process; one some ranks gave a gradient gets the mean with zeros for the others."""
        if self.world == 1:
            return
        import torch
        import torch.distributed as dist

        parameters = [p for p in parameters if p.requires_grad]
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in parameters]
                         + [torch.tensor([float(p.grad is not None) for p in parameters])])
        dist.all_reduce(flat)
        flat[: -len(parameters)] /= self.world
        offset = 0
        for parameter, had in zip(parameters, flat[-len(parameters):].tolist(), strict=True):
            size = parameter.numel()
            parameter.grad = flat[offset:offset + size].view_as(parameter).clone() if had else None
            offset += size

    def check_in_step(self, parameters) -> None:
        """Raise if the ranks' weights have drifted apart (they take the same steps from the same start)."""
        if self.world == 1:
            return
        import torch
        import torch.distributed as dist

        total = torch.stack([p.detach().double().sum() for p in parameters]).sum().reshape(1)
        low, high = total.clone(), total.clone()
        dist.all_reduce(low, op=dist.ReduceOp.MIN)
        dist.all_reduce(high, op=dist.ReduceOp.MAX)
        if low.item() != high.item():
            raise RuntimeError(f"rank {self.rank}: the ranks' weights differ ({low.item()} against {high.item()})")


def launch(target: Callable, args, world: int) -> int:
    """Run `target(args, ranks)` in `world` spawned processes; rank 0's exit status."""
    import multiprocessing
    import time

    context = multiprocessing.get_context("spawn")
    port = _free_port()
    processes = [context.Process(target=_rank_main, args=(target, args, rank, world, port), name=f"rank-{rank}")
                 for rank in range(world)]
    for process in processes:
        process.start()

    def forward(signum, frame) -> None:
        for process in processes:
            if process.is_alive():
                os.kill(process.pid, signum)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        while any(process.is_alive() for process in processes):
            failed = [p for p in processes if p.exitcode not in (None, 0, 130)]
            if failed:  # the others would wait for it in their next all-reduce until gloo's timeout
                log.error("%s failed (exit %s): stopping the other ranks", failed[0].name, failed[0].exitcode)
                for process in processes:
                    if process.is_alive():
                        process.terminate()
            time.sleep(0.2)
        for process in processes:
            process.join()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    codes = [process.exitcode for process in processes]
    return codes[0] if all(code == codes[0] for code in codes) else next(c for c in codes if c != 0) or 1


def _rank_main(target: Callable, args, rank: int, world: int, port: int) -> None:
    import torch
    import torch.distributed as dist

    logging.basicConfig(level=logging.INFO if rank == 0 else logging.WARNING, stream=sys.stderr,
                        format=f"%(asctime)s %(levelname)s rank {rank} %(name)s: %(message)s")
    torch.set_num_threads(1)
    # Generous: rank 0 alone trains a new run's tokenizer while the others wait at a barrier.
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(hours=2))
    try:
        code = target(args, Ranks(rank, world))
    finally:
        dist.destroy_process_group()
    sys.exit(code)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
