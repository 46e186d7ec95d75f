"""The fused sampling kernel (Triton interpreter on CPU) against transformers' own sampler code.

Proves: one pass yields transformers' argmax, temperature-scaled logits,
entropy (Categorical) and our confidence (top probability at temperature 1)
with a vocabulary that is not a multiple of the chunk; the entropy-bound
acceptance picks exactly the positions transformers' EntropyBoundSampler
accepts; the temperature follows transformers' linear schedule; Gumbel-max
samples follow softmax(logits / T), are reproducible by seed and differ across
seeds; a near-zero temperature samples the argmax.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernel is imported: its decorator reads it
USES_TRITON_INTERPRETER = True  # tests/conftest.py keeps TRITON_INTERPRET for this module's tests

import torch  # noqa: E402
from transformers.models.diffusion_gemma.generation_diffusion_gemma import (  # noqa: E402
    EntropyBoundSampler,
    EntropyBoundSamplerConfig,
    LinearTemperatureScheduleLogitsProcessor,
)

from dgemma_lsp.engine.kernels.fused_sampler import (  # noqa: E402
    SampledLogits,
    accept_and_renoise,
    accept_and_update,
    sample_logits,
    temperature,
)


def _device_scalars(inv_temperature: float, seed: int):
    return torch.tensor([inv_temperature], dtype=torch.float32), torch.tensor([seed], dtype=torch.int64)


def _logits(batch: int, length: int, vocab: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    sharpness = torch.logspace(-1, 1.5, length)[None, :, None]  # from flat to peaked: entropies spread out
    return torch.randn(batch, length, vocab, generator=generator) * sharpness  # [B, L, V]


def test_one_pass_matches_transformers_processed_logits_argmax_entropy_and_confidence():
    logits = _logits(2, 8, 300, seed=0)
    steps, cur_step = 16, 11
    processed = LinearTemperatureScheduleLogitsProcessor(0.4, 0.8, steps)(None, logits, cur_step=cur_step)
    inv_t, seed = _device_scalars(1.0 / temperature(cur_step, steps, 0.4, 0.8), 3)
    scaled = torch.empty_like(logits)
    out = sample_logits(logits, inv_t, seed, scaled_out=scaled, block_v=128)
    torch.testing.assert_close(scaled, processed)
    assert torch.equal(out.argmax, processed.argmax(dim=-1))
    entropy = torch.distributions.Categorical(logits=processed).entropy()
    torch.testing.assert_close(out.entropy, entropy, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(out.confidence, logits.softmax(dim=-1).amax(dim=-1), rtol=1e-5, atol=1e-6)
    assert out.sample.shape == (2, 8) and bool(((out.sample >= 0) & (out.sample < 300)).all())


def test_softcap_in_registers_equals_transformers_fp32_softcap():
    logits = _logits(1, 4, 200, seed=5) * 20  # [1, 4, 200], raw lm_head values well past the cap
    capped = torch.tanh(logits.float() / 30.0) * 30.0  # DiffusionGemmaForBlockDiffusion.forward
    inv_t, seed = _device_scalars(1.0 / 0.7, 1)
    scaled = torch.empty_like(logits)
    fused = sample_logits(logits, inv_t, seed, scaled_out=scaled, softcap=30.0, block_v=64)
    reference = sample_logits(capped, inv_t, seed, block_v=64)
    torch.testing.assert_close(scaled, capped / 0.7, rtol=1e-5, atol=1e-5)
    assert torch.equal(fused.argmax, capped.argmax(dim=-1))
    torch.testing.assert_close(fused.entropy, reference.entropy, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(fused.confidence, capped.softmax(dim=-1).amax(dim=-1), rtol=1e-5, atol=1e-6)


def test_acceptance_keeps_exactly_the_positions_transformers_accepts():
    logits = _logits(3, 16, 64, seed=1)
    inv_t, seed = _device_scalars(1.0, 9)
    out = sample_logits(logits, inv_t, seed, block_v=64)
    current = torch.randint(0, 64, (3, 16), generator=torch.Generator().manual_seed(2))
    sampler = EntropyBoundSampler(EntropyBoundSamplerConfig(entropy_bound=0.5), 16, 64, 8)
    accepted_canvas = sampler.accept_canvas(current, out.sample, logits, 1)
    following, accepted = accept_and_renoise(current, out, 0.5, 64)
    assert torch.equal(accepted, sampler.accepted_token_mask)
    assert 0 < int(accepted.sum()) < accepted.numel(), "the case must accept some positions and renoise others"
    assert torch.equal(torch.where(accepted, following, current), accepted_canvas)


def test_samples_follow_the_tempered_softmax_and_are_reproducible_by_seed():
    base = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0, 1.5, 0.2])
    logits = base.expand(1, 256, 8).contiguous()  # [1, 256, 8]: one distribution, many draws
    inv_t, seed = _device_scalars(1.0 / 0.5, 11)
    first = sample_logits(logits, inv_t, seed).sample
    assert torch.equal(sample_logits(logits[:, :64], inv_t, seed).sample, first[:, :64])
    assert not torch.equal(sample_logits(logits[:, :64], inv_t, torch.tensor([12])).sample, first[:, :64])
    frequencies = torch.bincount(first.view(-1), minlength=8).float() / first.numel()
    expected = (base / 0.5).softmax(dim=-1)
    # 256 draws: 4 standard deviations of a frequency are at most 4 * sqrt(0.25 / 256) = 0.125; ignoring
    # the temperature would be off by 0.23 on the first class, always sampling the argmax by 0.37.
    assert float((frequencies - expected).abs().max()) < 0.125


def test_near_zero_temperature_samples_the_argmax():
    logits = _logits(1, 32, 100, seed=4)
    inv_t, seed = _device_scalars(1e4, 1)
    out = sample_logits(logits, inv_t, seed, block_v=32)
    assert torch.equal(out.sample, out.argmax)


def test_sampler_is_a_custom_op_whose_fake_matches_the_kernel():
    """opcheck: the schema says it writes `scaled_out` and nothing else, the fake matches the launch."""
    logits = _logits(1, 4, 300, seed=9).reshape(4, 300)
    inv_t, seed = _device_scalars(1.25, 2)
    torch.library.opcheck(torch.ops.dgemma.sample_logits.default, (logits, torch.empty_like(logits), inv_t, seed,
                                                                     30.0, 128))  # fmt: skip
    torch.library.opcheck(torch.ops.dgemma.sample_logits.default, (logits, None, inv_t, seed, 0.0, 128))


def test_scaling_in_place_over_the_logits_gives_what_a_separate_output_gets():
    """The compiled step writes the lm_head output into the self-conditioning buffer and samples it in place."""
    logits = _logits(2, 4, 300, seed=11)
    inv_t, seed = _device_scalars(1.0 / 0.6, 4)
    scaled = torch.empty_like(logits)
    apart = sample_logits(logits, inv_t, seed, scaled_out=scaled, softcap=30.0, block_v=128)
    in_place = logits.clone()
    together = sample_logits(in_place, inv_t, seed, scaled_out=in_place, softcap=30.0, block_v=128)
    assert torch.equal(in_place, scaled)
    for name in ("sample", "argmax", "entropy", "confidence"):
        assert torch.equal(getattr(together, name), getattr(apart, name)), name


def test_fused_acceptance_and_bookkeeping_do_what_the_torch_tail_does():
    batch, length, vocab = 4, 40, 64  # 40: not a power of two, not a multiple of the kernel's block
    generator = torch.Generator().manual_seed(21)
    entropy = torch.rand((batch, length), generator=generator) * 0.2
    entropy[1:3] = 0.001  # confident rows (row 1's draft moves, so only row 2 finishes)
    argmax = torch.randint(0, vocab, (batch, length), generator=generator)
    sampled = SampledLogits(
        sample=vocab + torch.arange(length).expand(batch, length).contiguous(),  # out of vocabulary: shows acceptance
        argmax=argmax, entropy=entropy, confidence=torch.rand((batch, length), generator=generator), scaled=None,
    )  # fmt: skip
    canvas = torch.randint(0, vocab, (batch, length), generator=generator)
    draft = argmax.clone()
    draft[1, 3] = (draft[1, 3] + 1) % vocab  # row 1's draft changed this step
    confidence = torch.zeros((batch, length))
    finished = torch.tensor([False, False, False, True])  # row 3 finished earlier
    before = (canvas.clone(), draft.clone(), confidence.clone())
    bound = torch.tensor(0.5)
    accept_and_update(sampled, canvas=canvas, draft=draft, confidence=confidence, finished=finished,
                      entropy_bound=bound, confidence_threshold=torch.tensor(0.01), seed=torch.tensor([5]),
                      vocab=vocab)  # fmt: skip
    _, accepted = accept_and_renoise(before[0], sampled, 0.5, vocab)
    live = slice(0, 3)
    assert torch.equal(canvas[live] >= vocab, accepted[live]), "the same positions accepted"
    assert torch.equal(canvas[live][accepted[live]], sampled.sample[live][accepted[live]])
    renoised = canvas[live][~accepted[live]]
    assert renoised.numel() > 0 and bool(((renoised >= 0) & (renoised < vocab)).all())
    assert torch.equal(draft[live], argmax[live]) and torch.equal(confidence[live], sampled.confidence[live])
    assert torch.equal(canvas[3], before[0][3]) and torch.equal(draft[3], before[1][3]), "a finished row is kept"
    assert torch.equal(confidence[3], before[2][3])
    # row 0: stable, not confident; row 1: confident, its draft moved; row 2: stable and confident
    assert finished.tolist() == [False, False, True, True]
