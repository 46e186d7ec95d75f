"""Who had the machine's cores during a time window: the server's threads, the engine daemon, the benchmark,
or everything else. For `bench latency --anatomy`: is a slow keystroke the server's or the machine's?

Linux's scheduler statistics, read from outside the measured processes (no code runs in them):
`/proc/PID/task/TID/schedstat` gives each living thread's nanoseconds on a core and nanoseconds runnable
but waiting for one; `/proc/PID/stat` gives the whole process's user and system time, threads that have
ended included (to a clock tick; a thread that starts and ends inside a window has no schedstat left to
read at its end, so a process's CPU is the larger of the two); `/proc/stat` gives the cores' busy time (in clock ticks, 10 ms: the coarse figure here)
and the time the hypervisor gave to other machines (steal). Between two readings of a window:
- the server's event-loop thread (its main thread): on a core, and waiting for one;
- the server's other threads (the syntax worker, pygls' pool) on a core;
- the engine daemon's threads on a core (the model's work);
- the benchmark's own process (it plays the editor) on a core;
- everything else: what the cores ran beyond all of the above (other processes, the kernel's threads);
- steal: time a virtual machine's cores were taken by the hypervisor.
A window in which the loop thread waited for a core while other processes ran is the machine's; one in
which the loop thread ran, or waited while our own threads held the cores, is ours. Knows /proc; knows
nothing of LSP.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import msgspec

TICK_NS = 1e9 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 1e7


def available() -> bool:
    return Path("/proc/stat").is_file() and Path(f"/proc/{os.getpid()}/task/{os.getpid()}/schedstat").is_file()


@dataclass(frozen=True)
class _Reading:
    threads: dict[str, dict[int, tuple[int, int]]]
    """Per watched process: thread id -> (ns on a core, ns waiting for one)."""
    process_cpu_ns: dict[str, float]
    """Per watched process: user + system time of all its threads, ended ones included (clock ticks)."""
    cores_busy_ns: float
    steal_ns: float


class Anatomy(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """Milliseconds of core time in one window, by who used it."""

    wall_ms: float
    loop_cpu_ms: float
    """The server's event-loop thread on a core."""
    loop_wait_ms: float
    """The server's event-loop thread runnable, waiting for a core."""
    server_other_cpu_ms: float
    """The server's other threads on a core."""
    daemon_cpu_ms: float
    """The engine daemon's threads on a core (0 when the engine runs in the server's process)."""
    client_cpu_ms: float
    """The benchmark process (the editor's stand-in) on a core."""
    others_cpu_ms: float
    """Everything else the cores ran: other processes, the kernel (to a clock tick, 10 ms)."""
    steal_ms: float
    """The cores' time the hypervisor gave to other machines (to a clock tick)."""


class CpuWatch:
    """Readings of the server (`server_pid`, its loop on its main thread), the daemon and this process."""

    def __init__(self, server_pid: int, daemon_pid: int | None = None) -> None:
        self.processes = {"server": server_pid, "client": os.getpid()}
        if daemon_pid is not None:
            self.processes["daemon"] = daemon_pid
        self.server_pid = server_pid

    def read(self) -> _Reading:
        return _Reading({name: _threads(pid) for name, pid in self.processes.items()},
                        {name: _process_cpu(pid) for name, pid in self.processes.items()}, *_cores())

    def anatomy(self, before: _Reading, after: _Reading, wall_s: float) -> Anatomy:
        def spent(name: str) -> dict[int, tuple[int, int]]:
            old, new = before.threads.get(name, {}), after.threads.get(name, {})
            return {tid: (cpu - old.get(tid, (0, 0))[0], wait - old.get(tid, (0, 0))[1])
                    for tid, (cpu, wait) in new.items()}

        def whole(name: str) -> float:
            """The process's CPU, ended threads included: /proc/PID/stat's figure when it is the larger."""
            threads = sum(cpu for cpu, _ in spent(name).values())
            return max(threads, after.process_cpu_ns.get(name, 0.0) - before.process_cpu_ns.get(name, 0.0))

        loop_cpu, loop_wait = spent("server").get(self.server_pid, (0, 0))
        other_server = max(0.0, whole("server") - loop_cpu)
        daemon = whole("daemon")
        client = whole("client")
        ours = loop_cpu + other_server + daemon + client
        busy = after.cores_busy_ns - before.cores_busy_ns
        return Anatomy(wall_ms=_ms(wall_s * 1e9), loop_cpu_ms=_ms(loop_cpu), loop_wait_ms=_ms(loop_wait),
                       server_other_cpu_ms=_ms(other_server), daemon_cpu_ms=_ms(daemon), client_cpu_ms=_ms(client),
                       others_cpu_ms=_ms(max(0.0, busy - ours)), steal_ms=_ms(after.steal_ns - before.steal_ns))


def verdict(anatomy: Anatomy) -> str:
    """Whose a slow window was, by the largest share of the time the loop thread did not run."""
    if anatomy.loop_cpu_ms >= anatomy.loop_wait_ms:
        return "server: its event loop was running"
    if anatomy.others_cpu_ms + anatomy.steal_ms > anatomy.server_other_cpu_ms + anatomy.daemon_cpu_ms + anatomy.client_cpu_ms:
        return "machine: the loop waited for a core while other processes (or the hypervisor) had them"
    ours = {"the server's other threads": anatomy.server_other_cpu_ms, "the engine daemon": anatomy.daemon_cpu_ms,
            "the benchmark": anatomy.client_cpu_ms}
    most = max(ours, key=ours.__getitem__)
    return f"ours: the loop waited for a core while our own threads ran, most of all {most}"


def _threads(pid: int) -> dict[int, tuple[int, int]]:
    found = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return found
    for tid in tids:
        try:
            cpu, wait, _ = Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()
        except (FileNotFoundError, ValueError):
            continue  # the thread ended between the listing and the read
        found[int(tid)] = (int(cpu), int(wait))
    return found


def _process_cpu(pid: int) -> float:
    """utime + stime of the whole process (fields 14 and 15 of /proc/PID/stat), in ns."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return 0.0
    fields = text.rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
    return (int(fields[11]) + int(fields[12])) * TICK_NS


def _cores() -> tuple[float, float]:
    """The cores' busy and stolen time so far, from /proc/stat's first line (clock ticks)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    return (user + nice + system + irq + softirq) * TICK_NS, steal * TICK_NS


def _ms(ns: float) -> float:
    return round(ns / 1e6, 2)
