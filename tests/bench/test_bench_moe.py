"""`dgemma-lsp bench moe --json` on CPU: the interpreted kernels meet the op and error targets."""

import json
import os
import subprocess
import sys

import pytest

USES_TRITON_INTERPRETER = True  # tests/conftest.py keeps TRITON_INTERPRET for this module's tests


def _bench_moe_tiny(variants: str | None = None) -> dict:
    """`bench moe --json` on the tiny layer at 64 tokens in Triton's interpreter (all product modes, or
    `variants`): its report."""
    command = [sys.executable, "-m", "dgemma_lsp.server.cli", "bench", "moe", "--json", "--tokens", "64"]
    done = subprocess.run(command + (["--variants", variants] if variants else []), capture_output=True, text=True,
                          timeout=600, env={**os.environ, "TRITON_INTERPRET": "1"})  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_bench_moe_json_meets_the_op_and_error_targets():
    report = _bench_moe_tiny()
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


def test_bench_moe_times_the_gguf_q4_k_m_layout_against_its_own_dequantized_weights():
    """Q4_K_M as the GGUF loader holds it (affine int4 gate_up with uint8 sc and m per 32 under fp16 d and
    -dmin, int8 down with an fp16 scale per 32 and int8 activations): the kernels agree with the fp32 loop on
    the same weights, the format costs less than symmetric int4 in groups of 128, and the floor counts
    every byte of it."""
    report = _bench_moe_tiny("int4,gguf-q4_k_m")
    figure = report["variants"]["gguf-q4_k_m"]
    assert figure["backend"] == "triton-interpreter" and figure["tritonLaunches"] >= 3
    assert figure["maxRelError"] <= report["targets"]["maxRelError"]
    assert 0 < figure["errorVsBf16"] < min(0.3, report["variants"]["int4"]["errorVsBf16"])
    hidden, width = report["hidden"], report["expertWidth"]
    super_group = min(256, hidden)  # the tiny shape's hidden (64) is one short super-block
    gate_up = 2 * width * (hidden // 2 + 2 * hidden // 32 + 2 * 2 * hidden // super_group)  # codes, sc + m, d + dmin
    down = hidden * (width + 2 * width // 32)  # int8 codes, an fp16 scale per 32
    assert figure["weightBytes"] == report["routedExperts"] * (gate_up + down)


def test_the_q4_k_m_rows_are_the_loaders_exact_form(tmp_path):
    """The bench's Q8_0 rows are gguf's own quantizer's blocks through the loader's conversion, bit for bit;
    its Q4_K rows have the loader's fields (dtypes, shapes) and lose about what llama.cpp's reference
    quantizer loses (they fit each 32 by its min and max, without llama.cpp's search)."""
    import gguf
    import numpy as np
    import torch

    from dgemma_lsp.bench import format_writers, moe
    from dgemma_lsp.engine.weights.formats import gguf as ours

    kinds = gguf.GGMLQuantizationType
    values = torch.randn(16, 512, generator=torch.Generator().manual_seed(5)) * 0.02
    values[3, :32] = 0.0  # an all-zero group: no division by zero

    def loader_rows(kind, blocks):
        path = tmp_path / f"{kind.name}.bin"
        blocks.tofile(path)
        tensor = ours.GgufTensor(path, kind.name, int(kind), tuple(values.shape), 0, blocks.nbytes)
        return ours._exact_rows(tensor, 0, values.shape[0])

    q8_blocks = gguf.quants.quantize(values.numpy(), kinds.Q8_0)
    for bench_part, loader_part in zip(moe.gguf_rows(values, "Q8_0"), loader_rows(kinds.Q8_0, q8_blocks), strict=True):
        assert bench_part.dtype == loader_part.dtype and torch.equal(bench_part, loader_part)
    q4_blocks = format_writers.encode(values.numpy(), kinds.Q4_K)
    bench_q4, loader_q4 = moe.gguf_rows(values, "Q4_K"), loader_rows(kinds.Q4_K, q4_blocks)
    assert [(t.dtype, t.shape) for t in bench_q4] == [(t.dtype, t.shape) for t in loader_q4]

    def error(codes, sc, m, d, neg_dmin):  # d * sc * q - dmin * m, per 32 and 256 inputs
        scale = sc.float().repeat_interleave(32, -1) * d.float().repeat_interleave(256, -1)
        low = m.float().repeat_interleave(32, -1) * neg_dmin.float().repeat_interleave(256, -1)
        return float((scale * codes.float() + low - values).norm() / values.norm())

    reference = np.asarray(gguf.quants.dequantize(q4_blocks, kinds.Q4_K)).reshape(values.shape)
    assert error(*loader_q4) == pytest.approx(float((torch.from_numpy(reference) - values).norm() / values.norm()))
    assert 0.5 * error(*loader_q4) < error(*bench_q4) < 1.5 * error(*loader_q4)


def test_bench_moe_runs_int4_weights_under_int8_activations_beside_int4():
    """int4-w4a8 (the int4 weights, activations quantized to int8 per row in the kernels: the int8 MMA) agrees with
    its fp32 loop on the same weights with the same activation rounding, costs next to nothing beyond int4's own
    error against the unquantized weights, and is not the int4 launch under another name (its rounding shows)."""
    report = _bench_moe_tiny("int4,int4-w4a8")
    int4, w4a8 = report["variants"]["int4"], report["variants"]["int4-w4a8"]
    assert w4a8["backend"] == "triton-interpreter" and w4a8["tritonLaunches"] == int4["tritonLaunches"] == 3
    assert w4a8["maxRelError"] <= report["targets"]["maxRelError"]
    assert w4a8["weightBytes"] == int4["weightBytes"]  # the same packed weights
    assert w4a8["errorVsBf16"] != int4["errorVsBf16"]
    assert abs(w4a8["errorVsBf16"] - int4["errorVsBf16"]) < 0.1 * int4["errorVsBf16"]


def test_bench_moe_runs_the_activations_rounded_once_beside_the_loop_that_rounds_them():
    """int8-codes (`launch_settings(activation_codes=True)`: a launch rounds each GEMM's activations, the GEMM reads
    the codes; the gate_up launch stores the down's): the same output as int8's in-loop rounding, hence the same
    errors, with one launch more."""
    report = _bench_moe_tiny("int8,int8-codes")
    int8, codes = report["variants"]["int8"], report["variants"]["int8-codes"]
    assert int8["tritonLaunches"] == 3 and codes["tritonLaunches"] == 4
    assert codes["maxRelError"] == int8["maxRelError"] and codes["errorVsBf16"] == int8["errorVsBf16"]
