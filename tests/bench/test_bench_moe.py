"""`dgemma-lsp bench moe --json` on CPU: the interpreted kernels meet the op and error targets."""

import json
import os
import subprocess
import sys

USES_TRITON_INTERPRETER = True  # tests/conftest.py keeps TRITON_INTERPRET for this module's tests


def test_bench_moe_json_meets_the_op_and_error_targets():
    command = [sys.executable, "-m", "dgemma_lsp.server.cli", "bench", "moe", "--json", "--tokens", "64"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "TRITON_INTERPRET": "1"})  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert set(report["modes"]) == {"int4", "int8", "fp8"}
    for figure in report["modes"].values():
        assert figure["backend"] == "triton-interpreter"
        assert figure["tritonLaunches"] >= 3
        assert figure["opsPerLayer"] <= report["targets"]["opsPerLayer"]
        assert figure["opsPerLayer"] < figure["referenceOpsPerLayer"]
        assert figure["maxRelError"] <= report["targets"]["maxRelError"]
    assert (report["experts"], report["topK"], report["tokens"]) == (4, 2, 64)


def test_bench_moe_full_shape_refuses_without_cuda():
    done = subprocess.run([sys.executable, "-m", "dgemma_lsp.server.cli", "bench", "moe", "--shape", "full",
                           "--device", "cpu"], capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 2 and done.stdout == ""
