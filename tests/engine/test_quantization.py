"""Quantized residency on the real tiny DiffusionGemma (transformers code, CPU).

Proves: the int4 tile layout puts each input's code where the kernel reads it,
and holds affine (scale, min) weights of imported formats exactly; every mode
still serves `generate`; the expert weights shrink by the factor the format promises; the quantized experts compute exactly what the
original experts compute on the dequantized weights (so any logits error is
rounding, not routing); errors order by precision; save -> load into a meta
skeleton gives identical logits with ties intact; the CPU path of
`bench quant` runs. The tiny model is random: no assertion on wording.
"""

from __future__ import annotations

import argparse

import pytest
import torch

from dgemma_lsp.engine.kernels.quant_formats import (
    dequantize,
    effective_group_size,
    int4_subtile,
    legacy_layout,
    pack_int4,
    pack_int4_tiles,
    quantize,
    quantize_int4_affine,
    unpack_int4,
    unpack_int4_tiles,
)
from dgemma_lsp.engine.model.tiny_model import build_tiny_model
from dgemma_lsp.engine.weights.quantization import (
    QuantizedExperts,
    load_quantized,
    quantize_model,
    save_quantized,
)

PACKED = ("fp8", "int8", "int4")
MIN_AGREEMENT = {"fp8": 0.75, "int8": 0.75, "int4": 0.3}
"""Share of generate's 32 tokens equal to the fp32 model's, same seed (measured: 0.94, 0.94, 0.47)."""
BF16_FACTOR_FLOOR = {"fp8": 1.9, "int8": 1.9, "int4": 3.7}
"""Expert bytes as bf16 / packed bytes incl. bf16 scales at group 64: 1.94, 1.94, 3.76."""


def _fixed_input():
    generator = torch.Generator().manual_seed(7)
    prompt = torch.randint(4, 1000, (1, 12), generator=generator)  # [1, P]
    canvas = torch.randint(4, 1000, (1, 32), generator=generator)  # [1, canvas]
    return prompt, canvas


def _decoder_logits(model) -> torch.Tensor:
    prompt, canvas = _fixed_input()
    with torch.no_grad():
        return model(input_ids=prompt, decoder_input_ids=canvas).logits  # [1, canvas, vocab]


def _relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


@pytest.fixture(scope="module")
def reference_logits() -> torch.Tensor:
    return _decoder_logits(build_tiny_model().eval())


@pytest.mark.parametrize("in_features", [704, 32])
def test_int4_tiles_put_code_j_of_word_p_of_block_b_at_input_4pb_plus_pj_plus_p(in_features):
    """The contract the kernel unpacks by: 16 words per 64-input block (704 = 11 blocks), 8 at K = 32."""
    generator = torch.Generator().manual_seed(in_features)
    codes = torch.randint(0, 16, (3, in_features), dtype=torch.uint8, generator=generator)
    words = pack_int4_tiles(codes)
    assert words.dtype == torch.int16 and words.shape == (3, in_features // 4)
    per_block = int4_subtile(in_features)
    assert per_block == (16 if in_features % 64 == 0 else 8)
    bits = words.to(torch.int32) & 0xFFFF
    for k in range(in_features):
        block, rest = divmod(k, 4 * per_block)
        j, p = divmod(rest, per_block)
        assert torch.equal((bits[:, block * per_block + p] >> (4 * j)) & 0xF, codes[:, k].to(torch.int32))
    assert torch.equal(unpack_int4_tiles(words), codes)


def test_legacy_int4_pairs_hold_the_same_values():
    values = torch.arange(-8, 8, dtype=torch.int8).repeat(3).reshape(2, 24)
    packed = pack_int4(values)
    assert packed.dtype == torch.uint8 and packed.shape == (2, 12)
    assert torch.equal(unpack_int4(packed), values)
    data, scales = quantize(torch.randn(2, 5, 256), "int4", 64)
    legacy_data, legacy_scales = legacy_layout(data, scales, "int4")
    assert legacy_scales.shape == (2, 5, 4)
    restored = unpack_int4(legacy_data).float() * legacy_scales.float().repeat_interleave(64, dim=-1)
    assert torch.equal(restored, dequantize(data, scales, "int4", torch.float32))


def test_group_size_halves_until_it_divides_the_input_dimension():
    # The full model's expert down projection has 704 inputs: 128 does not divide it, 64 does.
    assert effective_group_size(704, 128) == 64
    assert effective_group_size(2816, 128) == 128
    weight = torch.randn(3, 16, 704)
    data, scales = quantize(weight, "int4", 128)
    assert data.shape == (3, 16, 176) and scales.shape == (3, 11, 16)  # scales group-major


def test_affine_int4_holds_imported_scales_and_mins_exactly():
    """Q4_K-like weights (scale = fp16 d x 6-bit sc, min = -fp16 dmin x 6-bit m, per 32 inputs) in fp32
    scales and mins: dequantize gives scale * code + min with no rounding of its own."""
    generator = torch.Generator().manual_seed(11)
    codes = torch.randint(0, 16, (4, 128), dtype=torch.uint8, generator=generator)
    d = (torch.rand(4, 1, generator=generator) * 0.01).half().float()
    sub_scales = torch.randint(0, 64, (4, 4), generator=generator).float()
    sub_mins = torch.randint(0, 64, (4, 4), generator=generator).float()
    scales = (d * sub_scales).T.contiguous()  # [groups, N], 17 significant bits: fp32 only
    mins = (-d * sub_mins).T.contiguous()
    restored = dequantize(pack_int4_tiles(codes), scales, "int4", torch.float64, mins=mins)
    expected = codes.double() * scales.T.double().repeat_interleave(32, -1) + mins.T.double().repeat_interleave(32, -1)
    assert torch.equal(restored, expected)


def test_affine_int4_of_our_own_quantizer_at_group_32():
    weight = torch.randn(2, 8, 256) * 0.02 + 0.01  # off-centre, where a min beats a symmetric scale
    data, scales, mins = quantize_int4_affine(weight, 32)
    assert scales.shape == mins.shape == (2, 8, 8)
    affine = _relative_error(dequantize(data, scales, "int4", torch.float32, mins=mins), weight)
    symmetric = _relative_error(dequantize(*quantize(weight, "int4", 32), "int4", torch.float32), weight)
    assert affine < 0.1 and affine < symmetric


@pytest.mark.parametrize(("mode", "bound"), [("int8", 0.01), ("fp8", 0.04), ("int4", 0.15)])
def test_rounding_error_of_each_format_is_bounded(mode, bound):
    weight = torch.randn(4, 64, 256) * 0.02
    weight[0, 0, :128] = 0.0  # an all-zero group must not divide by zero
    restored = dequantize(*quantize(weight, mode, 128), mode, torch.float32)
    assert torch.isfinite(restored).all()
    assert _relative_error(restored, weight) < bound


@pytest.mark.parametrize("mode", PACKED)
def test_quantized_experts_compute_what_the_original_computes_on_dequantized_weights(mode):
    original = build_tiny_model().eval().model.decoder.layers[0].experts
    quantized = QuantizedExperts.from_experts(original, mode, 128)
    with torch.no_grad():
        for expert in range(original.num_experts):
            gate_up, down = quantized.expert_weights(expert, torch.float32)
            original.gate_up_proj[expert] = gate_up
            original.down_proj[expert] = down
    generator = torch.Generator().manual_seed(3)
    hidden = torch.randn(40, original.hidden_dim, generator=generator)  # [T, H]
    top_k_index = torch.randint(0, original.num_experts, (40, 2), generator=generator)  # [T, K]
    top_k_weights = torch.rand(40, 2, generator=generator)  # [T, K]
    with torch.no_grad():
        expected = original(hidden, top_k_index, top_k_weights)
        actual = quantized(hidden, top_k_index, top_k_weights)
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode", PACKED)
def test_every_mode_serves_completions_and_shrinks_the_experts(mode):
    model = build_tiny_model().eval()
    # Encoder and decoder hold the same expert tensors: count each tensor once.
    experts = [m for m in model.modules() if type(m).__name__ == "DiffusionGemmaTextExperts"]
    fp32_expert_bytes = sum(
        m.gate_up_proj.numel() * 4 + m.down_proj.numel() * 4
        for m in {id(m.gate_up_proj): m for m in experts}.values()
    )
    report = quantize_model(model, mode, group_size=128)

    assert report.expert_bytes_before == fp32_expert_bytes
    # What is resident now is what the report says: the fp32 experts are gone.
    resident = {id(m): m.resident_bytes() for m in model.modules() if isinstance(m, QuantizedExperts)}
    assert sum(resident.values()) == report.expert_bytes_after
    assert not any("gate_up_proj" in name for name, _ in model.named_parameters())
    assert report.expert_factor >= 2 * BF16_FACTOR_FLOOR[mode]  # against the fp32 the CPU loads
    assert report.expert_bytes_before / 2 / report.expert_bytes_after >= BF16_FACTOR_FLOOR[mode]
    assert report.linear_factor >= 2 * BF16_FACTOR_FLOOR[mode]

    # It still serves: with the same seed, generate draws the same noise, so the canvas it
    # emits agrees with the full-precision model's wherever rounding left the argmax alone
    # (another seed agrees on ~0 of 32 positions; a broken expert path would too).
    prompt, _ = _fixed_input()
    full_precision = build_tiny_model().eval()  # seeds torch itself: build it before seeding generate
    torch.manual_seed(0)
    reference = full_precision.generate(prompt, max_new_tokens=32).sequences[0, prompt.shape[1] :]
    torch.manual_seed(0)
    new_tokens = model.generate(prompt, max_new_tokens=32).sequences[0, prompt.shape[1] :]
    assert new_tokens.shape == reference.shape == (32,)
    assert float((new_tokens == reference).float().mean()) >= MIN_AGREEMENT[mode]


def test_encoder_and_decoder_share_one_quantized_copy():
    model = build_tiny_model().eval()
    report = quantize_model(model, "int4")
    encoder_layer = model.model.encoder.language_model.layers[1]
    decoder_layer = model.model.decoder.layers[1]
    assert encoder_layer.experts is decoder_layer.experts
    assert encoder_layer.self_attn.q_proj is decoder_layer.self_attn.q_proj
    assert report.expert_modules == len(model.model.decoder.layers)
    assert model.lm_head.weight is model.model.decoder.embed_tokens.weight


def test_logits_error_grows_as_precision_falls(reference_logits):
    errors = {}
    for mode in ("none", *PACKED):
        model = build_tiny_model().eval()
        quantize_model(model, mode)
        errors[mode] = _relative_error(_decoder_logits(model), reference_logits)
    assert errors["none"] == 0.0
    # A random tiny model amplifies weight noise (0.7% gaussian noise gives ~15% logits error),
    # so the bounds are loose; the ordering is what the formats promise.
    assert 0 < errors["int8"] < errors["fp8"] < errors["int4"]
    assert errors["int8"] < 0.15


@pytest.mark.parametrize("mode", ("none", *PACKED))
def test_save_then_load_into_a_meta_skeleton_gives_identical_logits(mode, tmp_path):
    from transformers import DiffusionGemmaForBlockDiffusion

    model = build_tiny_model().eval()
    saved_report = quantize_model(model, mode)
    expected = _decoder_logits(model)
    save_quantized(model, tmp_path)

    with torch.device("meta"):
        skeleton = DiffusionGemmaForBlockDiffusion(model.config)
    loaded_report = load_quantized(skeleton, tmp_path)
    skeleton.eval()

    assert torch.equal(_decoder_logits(skeleton), expected)
    assert loaded_report.expert_bytes_after == saved_report.expert_bytes_after
    assert skeleton.lm_head.weight is skeleton.model.decoder.embed_tokens.weight
    encoder_layer = skeleton.model.encoder.language_model.layers[0]
    if mode != "none":
        assert encoder_layer.experts is skeleton.model.decoder.layers[0].experts
    else:
        assert encoder_layer.experts.gate_up_proj is skeleton.model.decoder.layers[0].experts.gate_up_proj


def test_bench_quant_tiny_scale_runs_on_cpu(capsys):
    from dgemma_lsp.bench import quant_gpu

    parser = argparse.ArgumentParser()
    quant_gpu.add_arguments(parser)
    args = parser.parse_args(["--scale", "tiny", "--modes", "none,int4", "--steps", "1"])
    args.json = True
    assert quant_gpu.run(args) == 0
    import msgspec

    report = msgspec.json.decode(capsys.readouterr().out, type=quant_gpu.QuantReport)
    by_mode = {figure.mode: figure for figure in report.figures}
    assert by_mode["none"].expert_factor == 1.0
    assert by_mode["int4"].expert_factor > 7  # fp32 on CPU: 4 bytes -> ~0.53
    assert by_mode["int4"].weight_bytes < by_mode["none"].weight_bytes
    assert 0 < by_mode["int4"].logits_rel_error


def test_bench_quant_full_scale_refuses_without_cuda(capsys):
    from dgemma_lsp.bench import quant_gpu

    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the full scale would run")
    parser = argparse.ArgumentParser()
    quant_gpu.add_arguments(parser)
    assert quant_gpu.run(parser.parse_args(["--scale", "full"])) == 2
    assert capsys.readouterr().out == ""
