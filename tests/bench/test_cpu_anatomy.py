"""Who had the cores in a window (bench/cpu_anatomy.py): a process's threads read from outside it."""

import subprocess
import sys
import time

import pytest

from dgemma_lsp.bench import cpu_anatomy

pytestmark = pytest.mark.skipif(not cpu_anatomy.available(), reason="needs Linux's per-thread schedstat")

SPINNER = """
import sys, threading, time
def spin():
    while time.thread_time() < 0.3:  # 0.3 s of this thread's own CPU, however busy the machine is
        pass
print("ready", flush=True)
sys.stdin.readline()
worker = threading.Thread(target=spin)
worker.start()
worker.join()
print("spun", flush=True)
sys.stdin.readline()
"""


def test_a_worker_threads_cpu_is_told_apart_from_the_main_threads():
    child = subprocess.Popen([sys.executable, "-c", SPINNER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "ready\n"
        watch = cpu_anatomy.CpuWatch(child.pid)
        before, started = watch.read(), time.perf_counter()
        child.stdin.write("go\n")
        child.stdin.flush()
        assert child.stdout.readline() == "spun\n"
        window = watch.anatomy(before, watch.read(), time.perf_counter() - started)
    finally:
        child.stdin.close()
        child.wait(timeout=60)
    # The worker has ended by the second reading: its spin is known from /proc/PID/stat, whole clock ticks
    # truncated at both readings, so at least the spin less two ticks.
    assert window.server_other_cpu_ms >= 300 - 2 * cpu_anatomy.TICK_NS / 1e6
    assert window.loop_cpu_ms < window.server_other_cpu_ms  # the main thread only waited for it
    assert window.daemon_cpu_ms == 0 and window.wall_ms > 0
