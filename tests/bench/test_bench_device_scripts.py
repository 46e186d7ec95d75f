"""bench/device/'s GPU-session scripts run end to end on the tiny shapes (CPU, Triton's interpreter).

They are run by hand on a lent GPU machine, rarely; this keeps them from rotting between loans.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

USES_TRITON_INTERPRETER = True  # tests/conftest.py keeps TRITON_INTERPRET for this module's tests
DEVICE_SCRIPTS = Path(__file__).resolve().parents[2] / "bench" / "device"


def _run(script: str, *args: str) -> str:
    done = subprocess.run([sys.executable, str(DEVICE_SCRIPTS / script), *args], capture_output=True, text=True,
                          timeout=600, env={**os.environ, "TRITON_INTERPRET": "1"})  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_the_launch_sweep_changes_only_the_launch_not_the_answer():
    out = _run("sweep_moe.py", "int4", "--shape", "tiny", "--seconds", "8")
    assert "int4 default:" in out
    differences = [float(d) for d in re.findall(r"diff (\S+)", out)]
    assert differences, out
    assert max(differences) < 1e-3, out  # another tiling sums in another order, nothing more


def test_the_step_profile_times_the_step_and_names_the_operators():
    out = _run("profile_step.py", "int4", "--scale", "tiny", "--fused", "on")  # each interpreted step is slow
    assert re.search(r"int4 fused=True capture=False: median step [\d.]+ ms", out), out
    assert "device kernels per step (profiler, 2 - 1 steps) 0" in out  # none on a CPU: the count is the GPU's
    assert "top operators by self_cpu_time_total" in out
    assert "dgemma::sample_logits" in out  # the fused sampler: the product's path, not a stand-in
    assert "dgemma::post_attention" in out  # the fused decoder's norms, with fused=True
    assert re.search(r"fused vs transformers' decoder: max \|diff\| \S+ .*argmax agreement 100.0%", out), out
