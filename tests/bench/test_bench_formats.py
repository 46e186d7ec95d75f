"""`bench formats` runs (so it is not dead code) and keeps its central finding: a GGUF Q4_K_M loads without loss
(Q4_K gate_up as affine int4, Q5_0 / Q8_0 down as int8: each repack error exactly 0), and the same affine layout
with bf16 scales and mins would lose only a small fraction of what Q4_K itself lost."""

from dgemma_lsp.bench.formats import format_table, run_benchmark


def test_bench_formats_measures_a_q4_k_m_gguf_against_bf16_and_against_itself():
    report = run_benchmark(["gguf-Q4_K_M"])
    (figure,) = report.figures
    assert figure.label == "GGUF Q4_K_M" and figure.mode == "int4"
    assert 0 < figure.gate_up_format_error < 0.2 and 0 < figure.down_format_error
    assert figure.gate_up_repack_error == 0.0 and figure.down_repack_error == 0.0  # "lose no more than the format"
    assert figure.asymmetric_repack_error < 0.2 * figure.gate_up_format_error
    assert figure.asymmetric_fp32_repack_error == 0.0  # the affine layout with float32 scales and mins: exact
    assert figure.top1_ours == figure.top1_format  # the same weights: the MoE layer differs by fp32 rounding only
    assert "GGUF Q4_K_M" in format_table(report)
