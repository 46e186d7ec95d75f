"""The GPU benchmark's code path, run on CPU on the shrunk config; the full size refuses to run without CUDA."""

import subprocess
import sys

import msgspec
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

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



def test_only_one_model_measures_that_model_alone():
    # A lent GPU's minutes are few: the baseline can run without the diffusion model, and the other way round.
    scale = msgspec.structs.replace(gpu.TINY, prompts=(32,), candidates=(), steps=2, autoregressive_tokens=4)
    baseline = gpu.run_benchmark(scale, "cpu", "float32", compiled=False, models=("autoregressive",))
    assert baseline.diffusion == [] and [f.mode for f in baseline.autoregressive] == ["eager"]
    assert baseline.speedup_vs_autoregressive == {} and "autoregressive eager" in gpu.format_table(baseline)
    diffusion = gpu.run_benchmark(scale, "cpu", "float32", compiled=False, models=("diffusion",))
    assert [(f.prompt_tokens, f.candidates) for f in diffusion.diffusion] == [(32, 1)]
    assert diffusion.autoregressive == []

class _StorageBytes(TorchDispatchMode):
    """Bytes of every distinct storage an operator returns on the CPU: what building a model allocates there."""

    def __init__(self) -> None:
        super().__init__()
        self.bytes, self._seen = 0, set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(tensor, torch.Tensor) and tensor.device.type == "cpu":
                storage = tensor.untyped_storage()
                if storage.data_ptr() and storage.data_ptr() not in self._seen:
                    self._seen.add(storage.data_ptr())
                    self.bytes += storage.nbytes()
        return out


def test_random_model_allocates_its_tied_weights_once_and_keeps_them_tied():
    # The full model built straight on an H100 ran out of its 80 GB: the decoder allocated its own copy of every
    # layer before tying them to the encoder's (~100 GB at the peak). On the shrunk config that was 1.97x the model.
    from dgemma_lsp.bench.quant_gpu import _model_class

    config = gpu.diffusion_config(gpu.TINY)
    with _StorageBytes() as allocated:
        model = gpu.build_random(_model_class(), config, torch.device("cpu"), torch.bfloat16)
    tensors = {t.untyped_storage().data_ptr(): t for t in [*model.parameters(), *model.buffers()]}
    model_bytes = sum(t.untyped_storage().nbytes() for t in tensors.values())
    assert allocated.bytes < 1.1 * model_bytes
    decoder_layer, encoder_layer = model.model.decoder.layers[0], model.model.encoder.language_model.layers[0]
    assert decoder_layer.self_attn.q_proj.weight is encoder_layer.self_attn.q_proj.weight
    # Drawn, not left as allocated: weights spread, norms at their constructor's ones, the rotary tables computed.
    assert all(torch.isfinite(t).all() for t in tensors.values())
    assert encoder_layer.self_attn.q_proj.weight.float().std() > 0
    assert all(float(layer.layer_scalar) == 1.0 for layer in [*model.model.decoder.layers])
    rotary = model.model.decoder.rotary_emb
    assert torch.equal(rotary.sliding_attention_inv_freq, rotary.sliding_attention_original_inv_freq)


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
