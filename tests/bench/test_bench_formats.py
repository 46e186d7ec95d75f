"""`bench formats` runs (so it is not dead code) and keeps its central finding: a GGUF Q4_K_M repacked into
symmetric int4 loses more than Q4_K itself lost, and an asymmetric int4 layout of groups of 32 (bf16 scale and
min, Q4_K's sub-block) would hold it with a small fraction of that."""

from dgemma_lsp.bench.formats import format_table, run_benchmark


def test_bench_formats_measures_a_q4_k_m_gguf_against_bf16_and_against_itself():
    report = run_benchmark(["gguf-Q4_K_M"])
    (figure,) = report.figures
    assert figure.label == "GGUF Q4_K_M" and figure.mode == "int4"
    assert 0 < figure.gate_up_format_error < 0.2 and figure.gate_up_repack_error > figure.gate_up_format_error
    assert figure.asymmetric_repack_error < 0.2 * figure.gate_up_format_error
    assert figure.asymmetric_fp32_repack_error == 0.0  # the affine layout with float32 scales and mins: exact
    assert 0.0 <= figure.top1_ours <= 1.0
    assert "GGUF Q4_K_M" in format_table(report)
