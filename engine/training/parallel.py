"""Data-parallel training on one machine's cores: W processes of one torch thread, one batch split between them.

Why: on the 2-core development machine the long run's recipe took 1.43-1.62 CPU-s (and wall
seconds) a step in one process of one thread; in two ranks it takes 0.84-1.08 wall seconds a step
for 1.5-2.0 CPU-s (bench/RESULTS.md, "Training speed"): 1.5-1.8x the steps an hour, for up to a fifth
more CPU a step. (Two threads in one process: 1.5x for a third more, before the examples, which
one thread cuts.) torch.distributed's gloo backend carries one all-reduce of the flattened
gradients a step and the step's counters.
DistributedDataParallel is not used: the objective calls the model's encoder and decoder directly,
around the forward hooks DDP relies on.

`Ranks` is a world of one when training is not distributed; every call is then the identity, so a
one-process run is exactly what it was. `launch` starts the ranks (spawn start method), forwards
SIGINT/SIGTERM to them (the ranks agree to stop at the same step; rank 0 saves), ends them
together (a last barrier before any tears its connections down), kills the others when one fails,
and returns the first failed rank's status, else rank 0's. Knows torch; knows nothing of the recipe.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass
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


STOPPED = 130
"""A rank's exit status when a stop request (SIGINT/SIGTERM) ended the run: every rank agreed on the step
(train.py) and rank 0 saved, so it is a clean end, as 0 is."""


@dataclass(frozen=True)
class RankEnd:
    """How one rank's process ended."""

    rank: int
    exitcode: int
    """The process's exit status; negative: the signal that killed it (multiprocessing's convention)."""
    stopped_by_launch: bool
    """launch killed it because another rank had failed first."""

    @property
    def failed(self) -> bool:
        return not self.stopped_by_launch and self.exitcode not in (0, STOPPED)

    @property
    def status(self) -> int:
        """As a shell reports it: 128 + the signal for a rank a signal killed."""
        return 128 - self.exitcode if self.exitcode < 0 else self.exitcode

    def __str__(self) -> str:
        if self.exitcode < 0:
            return f"rank-{self.rank} died of {signal.Signals(-self.exitcode).name}"
        return f"rank-{self.rank} exited with status {self.exitcode}"


@dataclass(frozen=True)
class Outcome:
    """Every rank's end, in the order launch saw them end."""

    ends: tuple[RankEnd, ...]

    @property
    def first_failure(self) -> RankEnd | None:
        return next((end for end in self.ends if end.failed), None)

    @property
    def status(self) -> int:
        """The run's exit status: the first failed rank's, else rank 0's (every rank's: 0, or 130 after a stop)."""
        failure = self.first_failure
        return failure.status if failure else next(end.status for end in self.ends if end.rank == 0)


def launch(target: Callable, args: tuple, world: int) -> int:
    """Run `target(*args, ranks=...)` in `world` spawned processes; the run's exit status (`Outcome.status`)."""
    return run_ranks(target, args, world).status


def run_ranks(target: Callable, args: tuple, world: int) -> Outcome:
    """Run `target(*args, ranks=...)` in `world` spawned processes until every one has ended.

    SIGINT/SIGTERM sent to this process are forwarded to the ranks, which agree on a step to stop at.
    When a rank fails, the others are killed at once (SIGKILL): a rank waits for every other in each
    collective, and train.py's ranks trap SIGTERM to stop at a step all of them agree on, which a dead
    rank never joins; so SIGTERM (what `Process.terminate` sends) would leave them blocked, and a grace
    would only delay the same kill. Nothing is lost that a resume needs: a checkpoint is replaced by a
    rename (train.py), so a rank killed while saving leaves the previous one."""
    import multiprocessing
    from multiprocessing.connection import wait

    context = multiprocessing.get_context("spawn")
    port = _free_port()
    processes = [context.Process(target=_rank_main, args=(target, args, rank, world, port), name=f"rank-{rank}")
                 for rank in range(world)]
    for process in processes:
        process.start()

    def forward(signum, frame) -> None:
        for rank in list(running.values()):
            if processes[rank].exitcode is None:
                os.kill(processes[rank].pid, signum)

    running = {process.sentinel: rank for rank, process in enumerate(processes)}
    ends: list[RankEnd] = []
    killed: set[int] = set()
    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        while running:
            # Woken by each end as it happens, so `ends` is in the order the ranks ended (two ends seen at one
            # wake-up go in rank order). The forwarding handler runs during the wait.
            for rank in sorted(running.pop(sentinel) for sentinel in wait(list(running))):
                processes[rank].join()
                code = processes[rank].exitcode
                ends.append(RankEnd(rank, code, stopped_by_launch=rank in killed and code == -signal.SIGKILL))
            if not killed and any(end.failed for end in ends):
                log.error("%s: stopping the other ranks", next(end for end in ends if end.failed))
                for rank in running.values():
                    processes[rank].kill()
                    killed.add(rank)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return Outcome(tuple(ends))


def _rank_main(target: Callable, args: tuple, rank: int, world: int, port: int) -> None:
    import torch
    import torch.distributed as dist

    # Before the process group exists: torch.distributed.nn's functions take `group=group.WORLD` as a default
    # argument, bound when the module is imported. Imported later (transformers does, building the model), ten
    # of them hold the process group past destroy_process_group, so gloo's threads (and rank 0's store server)
    # run on into the interpreter's shutdown, where now and then one aborts the rank ("terminate called
    # without an active exception", SIGABRT) after its work is done. Imported here, they hold None.
    import torch.distributed.nn  # noqa: F401

    logging.basicConfig(level=logging.INFO if rank == 0 else logging.WARNING, stream=sys.stderr,
                        format=f"%(asctime)s %(levelname)s rank {rank} %(name)s: %(message)s")
    torch.set_num_threads(1)
    # Generous: rank 0 alone trains a new run's tokenizer while the others wait at a barrier.
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(hours=2))
    try:
        code = target(*args, ranks=Ranks(rank, world))
        # One end for all: no rank tears its connections down while another still works (rank 0 saving
        # and exporting) or is still inside a collective with it.
        dist.barrier()
    finally:
        # On failure too (it is local): the last reference to the process group, whose release joins gloo's
        # threads, so that none is left when the interpreter shuts down.
        dist.destroy_process_group()
    sys.exit(code)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
