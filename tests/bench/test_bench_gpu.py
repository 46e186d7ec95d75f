"""The GPU benchmark's code path, run on CPU on the shrunk config; the full size refuses to run without CUDA."""

import subprocess
import sys

import msgspec
import pytest
import torch

from dgemma_lsp.bench import gpu


def test_tiny_scale_eager_reports_every_figure_for_each_prompt_and_batch():
    scale = msgspec.structs.replace(gpu.TINY, prompts=(32, 96), candidates=(2,), steps=2, autoregressive_tokens=4)
    report = gpu.run_benchmark(scale, "cpu", "float32", compiled=False)
    assert {(f.mode, f.prompt_tokens, f.candidates) for f in report.diffusion} == {
        ("eager", prompt, batch) for prompt in (32, 96) for batch in (1, 2)
    }
    assert all(f.ms_per_step > 0 and f.ms_per_canvas > 0 and f.steps == 2 for f in report.diffusion)
    assert [(f.mode, f.new_tokens) for f in report.autoregressive] == [("eager", 4)]
    assert set(report.speedup_vs_autoregressive) == {"eager"}
    assert "anchors" in gpu.format_table(report)


def test_tiny_scale_compiled_path_runs_static_cache_and_torch_compile():
    # Batch 1 only: each batch size is one more compilation (~30 s on this machine).
    scale = msgspec.structs.replace(gpu.TINY, prompts=(32, 96), candidates=(), steps=2, autoregressive_tokens=4)
    report = gpu.run_benchmark(scale, "cpu", "float32", compiled=True)
    compiled = [f for f in report.diffusion if f.mode == "compiled"]
    assert [f.prompt_tokens for f in compiled] == [32, 96]
    assert [f.mode for f in report.autoregressive] == ["eager", "compiled"]
    assert set(report.speedup_vs_autoregressive) == {"eager", "compiled"}


def test_full_size_configs_describe_the_26b_architecture():
    text = gpu.diffusion_config(gpu.FULL).text_config
    assert (text.num_hidden_layers, text.hidden_size, text.vocab_size) == (30, 2816, 262_144)
    assert (text.num_experts, text.top_k_experts, text.sliding_window) == (128, 8, 1024)
    assert text.layer_types.count("sliding_attention") == 25
    assert gpu.diffusion_config(gpu.FULL).canvas_length == 256
    baseline = gpu.autoregressive_config(gpu.FULL)
    assert (baseline.num_experts, baseline.enable_moe_block, baseline.final_logit_softcapping) == (128, True, 30.0)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_full_size_without_cuda_exits_with_one_line():
    done = subprocess.run([sys.executable, "-m", "dgemma_lsp.server.cli", "bench", "gpu"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert done.stdout == ""
    assert len(done.stderr.strip().splitlines()) == 1
