"""The compiled denoising path's CPU-checkable parts, on the real tiny DiffusionGemma.

Proves: a stable prefix snapshotted once and restored by copies into a
reused (dirty) StaticCache gives the decoder exactly the logits of a fresh
prefill, below and beyond the sliding window and for 2 candidates; the
step loop (run eagerly here; CUDA graphs replay the same step) gives the
drafts of transformers' own `generate` when both are deterministic (near-zero
temperature, every token accepted, the same starting canvas), with the fused
decoder kernels and with transformers' decoder; the step's
self-conditioning signal, its softmax a slice of rows at a time, gives the
decoder bit for bit what transformers' own gives it; `--compile`
resolves to on only for CUDA and refuses `on` without it.
"""

from __future__ import annotations

import os
import subprocess
import sys

os.environ.setdefault("TRITON_INTERPRET", "1")  # the loop's fused sampler runs in Triton's interpreter here
USES_TRITON_INTERPRETER = True  # tests/conftest.py keeps TRITON_INTERPRET for this module's tests

import pytest  # noqa: E402
import torch  # noqa: E402
from transformers.cache_utils import DynamicCache, StaticCache  # noqa: E402
from transformers.generation.streamers import BaseStreamer  # noqa: E402
from transformers.models.diffusion_gemma.generation_diffusion_gemma import EntropyBoundSamplerConfig  # noqa: E402

from dgemma_lsp.engine.errors import ModelLoadError  # noqa: E402
from dgemma_lsp.engine.kernels import fused_sampler, moe_kernels  # noqa: E402,F401 - their @triton.jit reads TRITON_INTERPRET now
from dgemma_lsp.engine.kernels.compiled_step import (  # noqa: E402
    CompiledDenoiser,
    StaticPromptCache,
    bucket_for,
    compile_enabled,
    self_conditioning_signal,
    soft_embeddings,
)
from dgemma_lsp.engine.model.cache_keyword import with_cache  # noqa: E402
from dgemma_lsp.engine.model.tiny_model import build_tiny_model  # noqa: E402


@pytest.fixture(scope="module")
def model():
    return build_tiny_model().eval()


def _ids(count: int, seed: int) -> list[int]:
    return torch.randint(4, 1000, (count,), generator=torch.Generator().manual_seed(seed)).tolist()


def _decoder_logits(model, cache: StaticCache, canvas: torch.Tensor) -> torch.Tensor:
    length = cache.get_seq_length()
    batch, canvas_length = canvas.shape
    masks = model.model.decoder.create_diffusion_decoder_attention_mask(  # positional: the cache's name changed in 5.24
        model.config, canvas.unsqueeze(-1), cache, torch.ones((batch, length + canvas_length), dtype=torch.bool),
    )  # fmt: skip
    positions = torch.arange(length, length + canvas_length, dtype=torch.int32)[None]
    hidden = model.model.decoder(decoder_input_ids=canvas, past_key_values=cache, decoder_attention_mask=masks,
                                 decoder_position_ids=positions).last_hidden_state  # fmt: skip
    return model.lm_head(hidden)  # [B, L, V]


@pytest.mark.parametrize(("stable_tokens", "batch"), [(30, 1), (90, 1), (90, 2)])
def test_restored_prefix_gives_the_logits_of_a_fresh_prefill(model, stable_tokens, batch):
    stable, tail = _ids(stable_tokens, 1), _ids(5, 2)
    canvas = torch.randint(4, 1000, (batch, 32), generator=torch.Generator().manual_seed(3))
    bucket = bucket_for(stable_tokens + 5 + 32)
    with torch.no_grad():
        fresh = StaticCache(config=model.config.get_text_config(decoder=True), max_cache_len=bucket)
        model.model.encoder(input_ids=torch.tensor([stable] * batch), past_key_values=fresh)
        model.model.encoder(input_ids=torch.tensor([tail] * batch), past_key_values=fresh)
        expected = _decoder_logits(model, fresh, canvas)

        prompts = StaticPromptCache(model)
        prompts.checkout("other", _ids(70, 9), batch, bucket)  # the live cache now holds someone else's prefix
        live, reused = prompts.checkout("doc", stable, batch, bucket)
        assert reused == 0
        model.model.encoder(input_ids=torch.tensor([tail] * batch), past_key_values=live)
        live, reused = prompts.checkout("doc", stable, batch, bucket)  # the next keystroke: restored, not encoded
        assert reused == stable_tokens
        model.model.encoder(input_ids=torch.tensor([tail] * batch), past_key_values=live)
        restored = _decoder_logits(model, live, canvas)
    torch.testing.assert_close(restored, expected, rtol=0, atol=1e-5)


class _Drafts(BaseStreamer):
    def __init__(self) -> None:
        self.drafts: list[list[int]] = []

    def put(self, value) -> None:
        pass

    def put_draft(self, value) -> None:
        self.drafts.append(value[0].tolist())

    def end(self) -> None:
        pass


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "transformers-decoder"])
def test_step_loop_gives_the_drafts_of_transformers_generate_when_deterministic(model, fused):
    prompt = _ids(20, 4)
    start = torch.randint(0, 1024, (1, 32), generator=torch.Generator().manual_seed(5))
    steps, t_min, t_max, bound = 3, 1e-7, 2e-7, 1e6  # logit gaps / T >> 1: argmax sampling; all accepted
    streamer = _Drafts()
    with torch.no_grad():
        cache = DynamicCache(config=model.config.get_text_config(decoder=True))
        model.model.encoder(input_ids=torch.tensor([prompt[:-1]]), past_key_values=cache)
        model.generate(torch.tensor([prompt[-1:]]), past_key_values=cache, streamer=streamer,
                       decoder_input_ids=start.clone(), max_new_tokens=32, max_denoising_steps=steps,
                       t_min=t_min, t_max=t_max, confidence_threshold=1e-9,
                       sampler_config=EntropyBoundSamplerConfig(entropy_bound=bound))  # fmt: skip
    ours: list[list[int]] = []
    denoiser = CompiledDenoiser(model, capture=False, eos_ids={1}, pad_id=0, fused=fused)
    assert (denoiser.fused is not None) == fused
    output = denoiser.denoise(stable=prompt[:-1], tail=prompt[-1:], cache_key=None, batch=1, steps=steps,
                              max_tokens=32, entropy_bound=bound, t_min=t_min, t_max=t_max,
                              confidence_threshold=None, seed=0, start=start,
                              on_step=lambda step, ids: ours.append(ids))  # fmt: skip
    assert ours == streamer.drafts
    assert output.answers[0][:32] == streamer.drafts[-1] and output.steps == steps
    assert output.confidences.shape == (1, 32) and bool(((output.confidences > 0) & (output.confidences <= 1)).all())


@pytest.mark.parametrize("slices", [16, 5])
def test_the_sliced_self_conditioning_signal_gives_the_decoder_exactly_transformers_own(slices):
    model = build_tiny_model().to(torch.bfloat16).eval()  # bf16 as on a GPU: the softmax's upcast matters
    decoder = model.model.decoder
    generator = torch.Generator().manual_seed(6)
    canvas = torch.randint(4, 1000, (3, 32), generator=generator)
    logits = (torch.randn((3, 32, 1024), generator=generator) * 8).to(torch.bfloat16)
    mask = torch.tensor([True, False, True])  # a row without self-conditioning yet
    with torch.no_grad():
        cache = StaticCache(config=model.config.get_text_config(decoder=True), max_cache_len=bucket_for(40 + 32))
        model.model.encoder(input_ids=torch.tensor([_ids(40, 7)] * 3), **with_cache(cache))
        masks = model.model.decoder.create_diffusion_decoder_attention_mask(
            model.config, canvas.unsqueeze(-1), cache, torch.ones((3, 40 + 32), dtype=torch.bool),
        )  # fmt: skip
        positions = torch.arange(40, 40 + 32, dtype=torch.int32)[None]
        expected = decoder(decoder_input_ids=canvas, self_conditioning_logits=logits, self_conditioning_mask=mask,
                           **with_cache(cache), decoder_attention_mask=masks,
                           decoder_position_ids=positions).last_hidden_state  # fmt: skip
        with self_conditioning_signal(decoder, soft_embeddings(decoder, logits, mask, slices)):
            ours = decoder(decoder_input_ids=canvas, **with_cache(cache), decoder_attention_mask=masks,
                           decoder_position_ids=positions).last_hidden_state  # fmt: skip
        without = decoder(decoder_input_ids=canvas, **with_cache(cache), decoder_attention_mask=masks,
                          decoder_position_ids=positions).last_hidden_state  # fmt: skip
    assert torch.equal(ours, expected)
    assert not torch.equal(without, expected), "the signal reached the decoder (the hook is gone after the block)"
    assert torch.equal(without[1], expected[1]), "a row whose mask is off gets no self-conditioning"


def test_the_sliced_softmax_gives_the_probabilities_of_the_whole_one_at_the_real_vocabulary():
    vocab, hidden = 262144, 8
    generator = torch.Generator().manual_seed(8)
    embed = torch.nn.Embedding(vocab, hidden).to(torch.bfloat16)
    embed.embed_scale = torch.tensor(hidden**0.5)
    decoder = torch.nn.Module()
    decoder.embed_tokens = embed
    logits = (torch.randn((2, 12, vocab), generator=generator) * 8).to(torch.bfloat16)
    with torch.no_grad():
        expected = torch.matmul(logits.softmax(dim=-1, dtype=torch.float32).to(torch.bfloat16), embed.weight)
        expected = expected * embed.embed_scale.to(torch.bfloat16)
        assert torch.equal(soft_embeddings(decoder, logits, None, slices=7), expected)


def test_warm_up_prepares_the_step_a_typical_request_uses(model):
    denoiser = CompiledDenoiser(model, capture=False, eos_ids={1}, pad_id=0)
    denoiser.warm_up(prompt_tokens=90, batches=(1,))  # past the tiny model's 64-token window
    assert [key[:2] for key in denoiser.graphs] == [(1, bucket_for(90 + 32))]
    assert not denoiser.prompt_cache.snapshots, "the dummy prompt is not kept as a document's prefix"


def test_compile_mode_resolves_on_only_for_cuda():
    assert not compile_enabled("auto", torch.device("cpu"))
    assert compile_enabled("auto", torch.device("cuda"))
    assert not compile_enabled("off", torch.device("cuda"))
    with pytest.raises(ModelLoadError):
        compile_enabled("on", torch.device("cpu"))
    with pytest.raises(ModelLoadError):
        compile_enabled("sometimes", torch.device("cuda"))


def test_a_cpu_install_without_triton_loads_and_runs_the_quantized_model():
    script = (
        "import sys; sys.modules['triton'] = None\n"  # what `import triton` does where it is not installed
        "import torch\n"
        "from dgemma_lsp.engine.runtime.denoising import DenoisingRuntime\n"
        "from dgemma_lsp.engine.weights.quantization import quantize_model\n"
        "from dgemma_lsp.engine.model.tiny_model import build_tiny_model\n"
        "model = build_tiny_model().eval(); quantize_model(model, 'int4')\n"
        "with torch.no_grad(): logits = model(input_ids=torch.tensor([[5, 6, 7]]),"
        " decoder_input_ids=torch.tensor([[8] * 32])).logits\n"
        "assert logits.shape == (1, 32, 1024) and bool(torch.isfinite(logits).all())\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr


def test_loading_serves_the_unfused_step_when_the_fused_one_fails_on_the_card(monkeypatch):
    """A card where the fused decoder kernels fail to capture (a Triton compile error, say) still gets
    CUDA-graph steps, with transformers' decoder; only when both fail does `generate` serve."""
    from dgemma_lsp.engine.runtime import denoising

    attempts: list[bool | None] = []

    class Capturing:
        def __init__(self, model, *, capture, eos_ids, pad_id, fused=None) -> None:
            attempts.append(fused)
            self.fused = "fused decoder" if fused is None else None

        def warm_up(self) -> None:
            if self.fused is not None or fail_unfused:
                raise RuntimeError("the kernels do not compile on this card")

        def clear(self) -> None:
            pass

    monkeypatch.setattr(denoising, "CompiledDenoiser", Capturing)
    monkeypatch.setattr(denoising, "compile_enabled", lambda mode, device: True)
    fail_unfused = False
    runtime = denoising.DenoisingRuntime.load("tiny-random")
    assert attempts == [None, False]
    assert runtime.compiled is not None and runtime.compiled.fused is None
    attempts.clear()
    fail_unfused = True
    assert denoising.DenoisingRuntime.load("tiny-random").compiled is None
    assert attempts == [None, False]
