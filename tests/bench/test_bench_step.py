"""`dgemma-lsp bench step` runs its code on CPU at tiny scale (times meaningless there) and refuses full size without CUDA."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # the fused sampler runs in Triton's interpreter on CPU
USES_TRITON_INTERPRETER = True  # tests/conftest.py keeps TRITON_INTERPRET for this module's tests

from dgemma_lsp.bench import step_gpu  # noqa: E402
from dgemma_lsp.engine.kernels import fused_sampler, moe_kernels  # noqa: E402,F401 - their @triton.jit reads TRITON_INTERPRET now


def test_bench_step_reports_every_figure_at_tiny_scale():
    report = step_gpu.run_benchmark("tiny", "cpu", ["int4"], steps=1, repeats=1)
    (figure,) = report.figures
    assert (figure.mode, figure.candidates, figure.steps) == ("int4", 1, 1)
    assert figure.ms_per_step > 0 and figure.first_draft_ms > 0 and figure.ms_per_canvas >= figure.ms_per_step
    assert figure.floor_ms > 0 and figure.weight_bytes > 0 and figure.peak_bytes is None


def test_bench_step_measures_the_fused_decoder_and_transformers_decoder_for_an_a_b():
    report = step_gpu.run_benchmark("tiny", "cpu", ["int4"], steps=1, repeats=1, fused_settings=(True, False))
    assert [(f.mode, f.fused) for f in report.figures] == [("int4", True), ("int4", False)]
    assert all(f.ms_per_step > 0 for f in report.figures)


def test_bench_step_full_scale_refuses_without_cuda():
    import argparse

    args = argparse.Namespace(scale="full", modes="int4", steps=16, repeats=1, device="cpu", json=False)
    assert step_gpu.run(args) == 2


def test_bench_step_runs_the_bench_only_w4a8_mode_with_every_int4_module_taking_int8_activations():
    """`--modes int4-w4a8`: int4 weights whose modules quantize activations into the MMA (in Triton's interpreter
    here, through the product's whole step), measured beside int4 until a GPU shows its agreement."""
    from dgemma_lsp.bench import quant_gpu
    from dgemma_lsp.engine.model.tiny_model import build_tiny_model

    report = step_gpu.run_benchmark("tiny", "cpu", ["int4-w4a8"], steps=1, repeats=1)
    assert [(f.mode, f.fused) for f in report.figures] == [("int4-w4a8", True)]
    model = build_tiny_model()
    quant_gpu.quantize_bench_mode(model, "int4-w4a8")
    kinds = [m.int4_activations for m in model.modules() if hasattr(m, "int4_activations")]
    assert kinds and set(kinds) == {"int8"}
    quant_gpu.quantize_bench_mode(model := build_tiny_model(), "int4")
    assert {m.int4_activations for m in model.modules() if hasattr(m, "int4_activations")} == {"none"}


def test_bench_step_times_w8a8_with_activations_rounded_once_a_gemm():
    """`--activation-codes` runs the step under `launch_settings(activation_codes=True)` and says so in its report
    (test_fused_layer shows that step's w8a8 GEMMs reading codes, with the same output)."""
    report = step_gpu.run_benchmark("tiny", "cpu", ["int8"], steps=1, repeats=1, activation_codes=True)
    assert report.activation_codes and [f.mode for f in report.figures] == ["int8"]
    assert "activations rounded once a GEMM" in step_gpu.format_table(report)


def test_bench_step_times_attention_over_repeated_key_value_heads_as_the_a_b_of_the_folded_default():
    """`--attention repeated` runs the step under `attention_settings(fold_groups=False)` and says so in its report
    (test_fused_layer shows both layouts give transformers' decoder output bit for bit)."""
    report = step_gpu.run_benchmark("tiny", "cpu", ["int8"], steps=1, repeats=1, attention="repeated")
    assert report.attention == "repeated" and [f.mode for f in report.figures] == ["int8"]
    assert "attention repeated" in step_gpu.format_table(report)

