"""The fused decoder kernels (Triton interpreter on CPU) against transformers' DiffusionGemma modules.

Proves, kernel by kernel: with fp32 activations each matches its fp32 reference (transformers'
modules in fp32) to fp32 rounding; with bf16 activations the norm, rotary and copy kernels give
transformers' bf16 tensors bit for bit (they round where transformers stores a tensor, to nearest
even, which Triton's interpreter does not do for a plain cast); the router (its projection and top-k
in one launch) picks the same experts with the same weights; the whole fused decoder forward gives
transformers' decoder output bit for bit in bf16, below and beyond the sliding window, for two
candidates one of which has no self-conditioning yet, with one operator a layer for the router.
"""

from __future__ import annotations

import copy
import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are imported: their decorator reads it
USES_TRITON_INTERPRETER = True  # tests/conftest.py keeps TRITON_INTERPRET for this module's tests

import pytest  # noqa: E402
import torch  # noqa: E402
from transformers.cache_utils import StaticCache  # noqa: E402
from transformers.models.diffusion_gemma.modeling_diffusion_gemma import apply_rotary_pos_emb  # noqa: E402

from dgemma_lsp.engine.kernels import fused_layer, fused_moe  # noqa: E402
from dgemma_lsp.engine.kernels.compiled_step import bucket_for, self_conditioning_signal, soft_embeddings  # noqa: E402
from dgemma_lsp.engine.kernels.fused_decoder import (  # noqa: E402
    FusedDecoder,
    attention_settings,
    fold_mask,
    unsupported,
)
from dgemma_lsp.engine.model.cache_keyword import with_cache  # noqa: E402
from dgemma_lsp.engine.model.tiny_model import build_tiny_model  # noqa: E402
from dgemma_lsp.engine.weights.quantization import QuantizedExperts, QuantizedLinear, quantize_model  # noqa: E402

DTYPES = [torch.float32, torch.bfloat16]


def _model(dtype):
    model = build_tiny_model().to(dtype).eval()
    generator = torch.Generator().manual_seed(11)
    with torch.no_grad():  # norms and scales away from their all-ones start, so a swapped weight shows
        for name, parameter in model.named_parameters():
            if "norm" in name or name.endswith("scale") or "layer_scalar" in name:
                parameter.copy_(torch.rand(parameter.shape, generator=generator) * 2)
        for name, buffer in model.named_buffers():
            if name.endswith("layer_scalar"):
                buffer.copy_(torch.rand(buffer.shape, generator=generator) + 0.5)
    return model


def _rows(rows: int, width: int, seed: int, dtype, scale: float = 3.0) -> torch.Tensor:
    return (torch.randn((rows, width), generator=torch.Generator().manual_seed(seed)) * scale).to(dtype)


def _same(ours: torch.Tensor, theirs: torch.Tensor, dtype) -> None:
    if dtype == torch.bfloat16:
        assert torch.equal(ours, theirs), (ours.float() - theirs.float()).abs().max()
    else:
        torch.testing.assert_close(ours, theirs, rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("dtype", DTYPES)
def test_post_attention_is_the_norm_the_residual_add_and_the_three_norms_after_it(dtype):
    layer = _model(dtype).model.decoder.layers[0]
    attn, residual = _rows(40, 64, 1, dtype), _rows(40, 64, 2, dtype)
    with torch.no_grad():
        hidden = residual + layer.post_attention_layernorm(attn)
        router = layer.router
        expected = (hidden, layer.pre_feedforward_layernorm(hidden), layer.pre_feedforward_layernorm_2(hidden),
                    router.norm(hidden) * router.scale * router.scalar_root_size)  # fmt: skip
        ours = fused_layer.post_attention(
            attn, residual, layer.post_attention_layernorm.weight, layer.pre_feedforward_layernorm.weight,
            layer.pre_feedforward_layernorm_2.weight, router.scale, layer.post_attention_layernorm.eps,
            router.scalar_root_size,
        )  # fmt: skip
    for mine, theirs in zip(ours, expected, strict=True):
        _same(mine, theirs, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_post_ffn_is_both_branch_norms_their_sum_the_residual_the_layer_scalar_and_the_next_norm(dtype):
    decoder = _model(dtype).model.decoder
    layer, following = decoder.layers[0], decoder.layers[1].input_layernorm
    dense, routed, residual = _rows(40, 64, 3, dtype), _rows(40, 64, 4, dtype, 0.5), _rows(40, 64, 5, dtype)
    with torch.no_grad():
        both = layer.post_feedforward_layernorm_1(dense) + layer.post_feedforward_layernorm_2(routed)
        hidden = residual + layer.post_feedforward_layernorm(both)
        hidden *= layer.layer_scalar
        ours = fused_layer.post_ffn(
            dense, routed, residual, layer.post_feedforward_layernorm_1.weight,
            layer.post_feedforward_layernorm_2.weight, layer.post_feedforward_layernorm.weight,
            layer.layer_scalar, following.weight, following.eps,
        )  # fmt: skip
    _same(ours[0], hidden, dtype)
    _same(ours[1], following(hidden), dtype)


def test_post_ffn_rounds_the_experts_fp32_sums_as_their_cast_would_and_clears_them():
    """The quantized experts hand post_ffn their fp32 top-k sums: the same outputs as the sums cast to bf16 first,
    bit for bit (on values whose rounding to bf16 is not exact, and with ties to even among them); asked to, it
    leaves the sums' buffer zeroed for the next layer's."""
    decoder = _model(torch.bfloat16).model.decoder
    layer, following = decoder.layers[0], decoder.layers[1].input_layernorm
    dense, residual = _rows(40, 64, 3, torch.bfloat16), _rows(40, 64, 5, torch.bfloat16)
    sums = _rows(40, 64, 4, torch.float32, 0.5)
    sums[0, :8] = torch.tensor([1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8), 2**-9 + 2**-17, 3.0, 0.5, -7.0, 1.0])  # ties
    assert not torch.equal(sums.to(torch.bfloat16).float(), sums)
    weights = (layer.post_feedforward_layernorm_1.weight, layer.post_feedforward_layernorm_2.weight,
               layer.post_feedforward_layernorm.weight, layer.layer_scalar, following.weight, following.eps)  # fmt: skip
    with torch.no_grad():
        cast_first = fused_layer.post_ffn(dense, sums.to(torch.bfloat16), residual, *weights)
        ours = fused_layer.post_ffn(dense, sums, residual, *weights)
        assert torch.equal(ours[0], cast_first[0]) and torch.equal(ours[1], cast_first[1])
        assert sums.abs().sum() > 0  # kept unless asked
        cleared = fused_layer.post_ffn(dense, sums, residual, *weights, clear_experts=True)
    assert torch.equal(cleared[0], cast_first[0]) and torch.equal(cleared[1], cast_first[1])
    assert torch.equal(sums, torch.zeros_like(sums))


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_step_input_is_transformers_embedding_plus_self_conditioning_and_its_norms(dtype):
    decoder = _model(dtype).model.decoder
    block, embed = decoder.self_conditioning, decoder.embed_tokens
    ids = torch.randint(0, 1024, (2 * 20,), generator=torch.Generator().manual_seed(6))
    soft = _rows(40, 64, 7, dtype, 0.2)  # softmax @ embeddings, before the scale
    mask = torch.tensor([True, False])
    scale = float(torch.tensor(embed.scalar_embed_scale).to(dtype))
    eps = decoder.layers[0].input_layernorm.eps
    with torch.no_grad():
        signal = soft * embed.embed_scale.to(dtype)
        signal = signal * mask.to(dtype).repeat_interleave(20)[:, None]
        normed = fused_layer.signal_norm(soft, mask, block.pre_norm.weight, 20, scale, eps)
        _same(normed, block.pre_norm(signal), dtype)
        after_mlp = _rows(40, 64, 8, dtype)  # what the block's MLP made of it
        state = block.post_norm(embed(ids) + after_mlp)
        ours = fused_layer.step_input(ids, embed.weight, after_mlp, decoder.layers[0].input_layernorm.weight, scale, eps)
    _same(ours[0], state, dtype)
    _same(ours[1], decoder.layers[0].input_layernorm(state), dtype)


@pytest.mark.parametrize(("kind", "block"), [("int8", 32), ("fp8", 32), ("int8", 16)])
def test_each_norm_writes_its_output_as_the_next_gemms_activation_codes_bit_for_bit(kind, block):
    """Given codes buffers, post_attention (the dense MLP's and the experts' inputs), post_ffn and step_input (the
    next q/k/v's) and signal_norm (the self-conditioning MLP's) also write their output as `activation_codes`
    would round it, bit for bit, on a row (96) that is not a power of two (the kernel's padding lanes), and write
    the same outputs as without them."""
    rows, width, bf16 = 24, 96, torch.bfloat16
    layout = fused_moe.CodesLayout(kind, block)
    x, residual, other = _rows(rows, width, 1, bf16), _rows(rows, width, 2, bf16), _rows(rows, width, 3, bf16, 0.5)
    w = [torch.rand(width, generator=torch.Generator().manual_seed(seed)) * 2 for seed in range(4)]
    w = [t.to(bf16) for t in w]
    ids, embed = torch.randint(0, 50, (rows,), generator=torch.Generator().manual_seed(9)), _rows(50, width, 4, bf16)
    launches = {  # name -> (the op without codes, with codes buffers appended; which outputs have codes)
        "post_attention": (lambda *c: fused_layer.post_attention(x, residual, *w, 1e-6, 0.1, *c), (1, 2)),
        "post_ffn": (lambda *c: fused_layer.post_ffn(x, other.float(), residual, *w[:3], torch.ones(1, dtype=bf16),
                                                     w[3], 1e-6, False, *c), (1,)),
        "step_input": (lambda *c: fused_layer.step_input(ids, embed, x, w[0], 9.75, 1e-6, *c), (1,)),
        "signal_norm": (lambda *c: (fused_layer.signal_norm(other, torch.tensor([True, False]), w[1], 12, 9.75, 1e-6,
                                                           *c),), (0,)),
    }  # fmt: skip
    for name, (launch, coded) in launches.items():
        plain = launch()
        buffers = [layout.empty(x, rows, width) for _ in coded]
        ours = launch(*(t for pair in buffers for t in pair))
        for mine, theirs in zip(ours, plain, strict=True):
            assert torch.equal(mine, theirs), name
        for output, (codes, scales) in zip(coded, buffers, strict=True):
            expected = torch.ops.dgemma.activation_codes(plain[output], kind, block)
            assert torch.equal(codes, expected[0]) and torch.equal(scales, expected[1]), (name, output)
            assert codes.abs().sum() > 0, name  # codes of real values, not an untouched buffer


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("prompt", [40, 90])  # 90: past the tiny model's 64-token sliding window
def test_attention_inputs_are_transformers_head_norms_rotary_and_appended_cache(dtype, prompt):
    model = _model(dtype)
    decoder = model.model.decoder
    batch, length = 2, 32
    generator = torch.Generator().manual_seed(14)
    with torch.no_grad():
        cache = StaticCache(config=model.config.get_text_config(decoder=True), max_cache_len=bucket_for(prompt + 32))
        model.model.encoder(input_ids=torch.randint(4, 1000, (batch, prompt), generator=generator),
                            **with_cache(cache))  # fmt: skip
        positions = torch.arange(prompt, prompt + length)[None]
        for index, layer in enumerate(decoder.layers):  # a sliding layer, then a full one (v is k's projection)
            attention = layer.self_attn
            layer_type = model.config.text_config.layer_types[index]
            cos, sin = decoder.rotary_emb(torch.empty(0, dtype=dtype), positions, layer_type)  # [1, L, D]
            x = _rows(batch * length, 64, 15 + index, dtype)
            q, k = attention.q_proj(x), attention.k_proj(x)
            v = attention.v_proj(x) if attention.v_proj is not None else k
            shape = (batch, length, -1, attention.head_dim)
            queries = apply_rotary_pos_emb(attention.q_norm(q.view(shape)), cos, sin, unsqueeze_dim=2).transpose(1, 2)
            keys = apply_rotary_pos_emb(attention.k_norm(k.view(shape)), cos, sin, unsqueeze_dim=2).transpose(1, 2)
            keys, values = attention.append_to_cache(cache, keys, attention.v_norm(v.view(shape)).transpose(1, 2))
            repeat = queries.shape[1] // keys.shape[1]
            cache_layer = cache.layers[index]
            ours = fused_layer.attention_inputs(q, k, v, attention.q_norm.weight, attention.k_norm.weight, cos[0],
                                                sin[0], cache_layer.keys, cache_layer.values,
                                                cache_layer.cumulative_length, length, attention.q_norm.eps)  # fmt: skip
            _same(ours[0], queries, dtype)
            _same(ours[1], keys.repeat_interleave(repeat, dim=1), dtype)
            _same(ours[2], values.repeat_interleave(repeat, dim=1), dtype)
            grouped = fused_layer.attention_inputs(q, k, v, attention.q_norm.weight, attention.k_norm.weight, cos[0],
                                                   sin[0], cache_layer.keys, cache_layer.values,
                                                   cache_layer.cumulative_length, length, attention.q_norm.eps,
                                                   grouped=True)  # fmt: skip  # each key/value head once
            _same(grouped[0], queries, dtype)
            _same(grouped[1], keys, dtype)
            _same(grouped[2], values, dtype)


def test_queries_folded_by_group_against_each_key_value_head_once_are_attention_with_repeated_heads():
    """Grouped-query attention as the fused decoder runs it: each key/value head's query heads folded into one
    sequence, the mask folded alike (`fold_mask`), against keys and values held once a group, gives SDPA's output
    with the heads repeated (`repeat_kv`), bit for bit, and folding an already folded mask leaves it."""
    generator = torch.Generator().manual_seed(21)
    batch, heads, kv_heads, length, keys_length, dim = 2, 8, 2, 5, 12, 16
    queries = torch.randn(batch, heads, length, dim, generator=generator)
    keys, values = (torch.randn(batch, kv_heads, keys_length, dim, generator=generator) for _ in range(2))
    mask = torch.rand(batch, 1, length, keys_length, generator=generator) > 0.3
    mask[..., 0] = True  # every query sees a key
    group = heads // kv_heads
    sdpa = torch.nn.functional.scaled_dot_product_attention
    expected = sdpa(queries, keys.repeat_interleave(group, dim=1), values.repeat_interleave(group, dim=1),
                    attn_mask=mask, scale=0.25)  # fmt: skip
    folded_mask = fold_mask(mask, group, length)
    folded = sdpa(queries.view(batch, kv_heads, group * length, dim), keys, values, attn_mask=folded_mask, scale=0.25)
    assert torch.equal(folded.view(batch, heads, length, dim), expected)
    assert fold_mask(folded_mask, group, length) is folded_mask and fold_mask(None, group, length) is None


@pytest.mark.parametrize("dtype", DTYPES)
def test_gelu_mul_is_the_mlps_activation_times_up(dtype):
    mlp = _model(dtype).model.decoder.layers[0].mlp
    gate, up = _rows(40, 128, 10, dtype), _rows(40, 128, 11, dtype, 1.0)
    with torch.no_grad():
        ours, theirs = fused_layer.gelu_mul(gate, up), mlp.act_fn(gate) * up
    if dtype == torch.float32:
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)
    else:  # tanh through a sigmoid: an fp32 ulp apart, which moves a bf16 rounding now and then
        assert (ours != theirs).float().mean() < 0.02
        torch.testing.assert_close(ours, theirs, rtol=8e-3, atol=1e-5)


def _router(dtype, full_size: bool):
    """Layer 0's router of the tiny model (4 experts, top-2, hidden 64), or one at the real model's router shape
    (128 experts, top-8, hidden 2,816) with random weights, as bench/moe.py builds it."""
    model = _model(dtype)
    router = model.model.decoder.layers[0].router
    if not full_size:
        return router
    config = copy.deepcopy(model.config.get_text_config(decoder=True))
    config.hidden_size, config.num_experts, config.top_k_experts = 2816, 128, 8
    router = type(router)(config).to(dtype).eval()
    generator = torch.Generator().manual_seed(16)
    with torch.no_grad():
        router.proj.weight.copy_(torch.randn(router.proj.weight.shape, generator=generator) * 0.02)
        router.scale.copy_(torch.rand(router.scale.shape, generator=generator) * 2)
        router.per_expert_scale.copy_(torch.rand(router.per_expert_scale.shape, generator=generator) * 2)
    return router


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("full_size", "rows"), [(False, 40), (False, 1), (True, 40)])  # 40, 1: not a 16-row block
def test_route_picks_transformers_experts_and_weights(dtype, full_size, rows):
    """The projection, softmax, top-k, renormalisation and per-expert scale in one launch: transformers' router's
    experts and its weights to fp32 rounding (the scores rounded to the activations' dtype as its Linear's output
    is: a bf16 ulp off would move a weight by 0.4%).

    Ties: equal bf16 scores are common among 128 experts. On a GPU torch.topk takes the lowest ids among the
    values tied at the k-th (its gather keeps the first seen) and leaves the order within ties unspecified; the
    kernel keeps the lowest id first, which a stable sort of transformers' probabilities gives. torch.topk on CPU
    (the reference here) breaks ties its own way: compared per expert, and its choice only where the k-th is not
    tied with the next."""
    router = _router(dtype, full_size)
    x = _rows(rows, router.proj.in_features, 12, dtype)
    with torch.no_grad():
        probabilities, weights, experts = router(x)
        router_in = router.norm(x) * router.scale * router.scalar_root_size  # post_attention's router_in
        ours = fused_layer.route(router_in, router.proj.weight, router.per_expert_scale, weights.shape[-1])
    top_k = weights.shape[-1]
    ranked = probabilities.sort(dim=-1, descending=True, stable=True)
    assert torch.equal(ours[1], ranked.indices[:, :top_k])
    boundary_tie = ranked.values[:, top_k - 1] == ranked.values[:, top_k]
    by_id, theirs_by_id = ours[1].sort(dim=-1), experts.sort(dim=-1)
    same = (by_id.values == theirs_by_id.values).all(dim=-1)
    assert torch.equal(same | boundary_tie, torch.ones_like(same)), "a different choice without a tie"
    torch.testing.assert_close(ours[0].gather(1, by_id.indices)[same], weights.gather(1, theirs_by_id.indices)[same],
                               rtol=1e-6, atol=1e-7)  # fmt: skip
    if full_size and dtype == torch.bfloat16:  # the ties this is about: inside the top k, and at the k-th
        assert (ranked.values[:, 1:top_k] == ranked.values[:, : top_k - 1]).any() and boundary_tie.any()


@pytest.mark.parametrize("dtype", DTYPES)
def test_softmax_rows_is_the_fp32_softmax_in_the_outputs_dtype(dtype):
    logits = _rows(6, 5000, 13, dtype, 8.0)  # more than one 4,096 block per row
    out = torch.empty_like(logits)
    fused_layer.softmax_rows(logits, out)
    expected = logits.softmax(dim=-1, dtype=torch.float32).to(dtype)
    if dtype == torch.float32:
        torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-9)
    else:  # sums in another order: an fp32 ulp can move a bf16 rounding
        assert (out != expected).float().mean() < 0.01
        torch.testing.assert_close(out, expected, rtol=8e-3, atol=1e-9)


def _decoder_inputs(model, prompt: int, dtype):
    """(canvas, logits, self-conditioning mask, cache, masks, positions) of a two-candidate step after `prompt` tokens."""
    decoder = model.model.decoder
    generator = torch.Generator().manual_seed(6)
    batch = 2
    canvas = torch.randint(4, 1000, (batch, 32), generator=generator)
    logits = (torch.randn((batch, 32, 1024), generator=generator) * 8).to(dtype)
    mask = torch.tensor([True, False])  # the second candidate has no self-conditioning yet
    cache = StaticCache(config=model.config.get_text_config(decoder=True), max_cache_len=bucket_for(prompt + 32))
    model.model.encoder(input_ids=torch.randint(4, 1000, (batch, prompt), generator=generator), **with_cache(cache))
    masks = decoder.create_diffusion_decoder_attention_mask(
        model.config, canvas.unsqueeze(-1), cache, torch.ones((batch, prompt + 32), dtype=torch.bool)
    )
    positions = torch.arange(prompt, prompt + 32, dtype=torch.int32)[None]
    return canvas, logits, mask, cache, masks, positions


@pytest.mark.parametrize("prompt", [40, 90])  # below and beyond the tiny model's 64-token sliding window
def test_the_fused_decoder_gives_transformers_decoder_output_bit_for_bit_in_bf16(prompt):
    model = build_tiny_model().to(torch.bfloat16).eval()  # as loaded: transformers' own initial norms
    assert unsupported(model) is None
    decoder = model.model.decoder
    with torch.no_grad():
        canvas, logits, mask, cache, masks, positions = _decoder_inputs(model, prompt, torch.bfloat16)
        with self_conditioning_signal(decoder, soft_embeddings(decoder, logits, mask)):
            expected = decoder(decoder_input_ids=canvas, **with_cache(cache), decoder_attention_mask=masks,
                               decoder_position_ids=positions).last_hidden_state  # fmt: skip
        fused = FusedDecoder(model)
        rotary = fused.rotary(positions, torch.bfloat16)
        ours = fused.forward(canvas, logits, mask, cache, dict(masks), rotary)
        # the masks as compiled_step keeps them (folded once a canvas), and attention over repeated heads
        folded = fused.forward(canvas, logits, mask, cache, fused.attention_masks(dict(masks)), rotary)
        with attention_settings(fold_groups=False):
            repeated = fused.forward(canvas, logits, mask, cache, fused.attention_masks(dict(masks)), rotary)
            repeated_from_folded = fused.forward(canvas, logits, mask, cache, dict(fused.attention_masks(masks)),
                                                 rotary)  # fmt: skip
    assert torch.equal(ours.view(expected.shape), expected)
    for other in (folded, repeated, repeated_from_folded):
        assert torch.equal(other, ours)


def test_each_layers_router_is_one_operator_that_reads_the_projection_weight():
    """The router's projection and its top-k are one launch a layer (`dgemma::route`), not a GEMM and then a
    top-k: the only operator of a fused step that reads a layer's router weight is that layer's route."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    model = build_tiny_model().to(torch.bfloat16).eval()
    layers = model.model.decoder.layers
    owner = {layer.router.proj.weight.untyped_storage().data_ptr(): index for index, layer in enumerate(layers)}

    class RouterReads(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.reads: list[tuple[int, str]] = []  # (layer, operator), views left out: they launch nothing

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if not func.is_view:
                for leaf in tree_leaves((args, kwargs)):
                    if isinstance(leaf, torch.Tensor) and leaf.untyped_storage().data_ptr() in owner:
                        self.reads.append((owner[leaf.untyped_storage().data_ptr()], str(func)))
            return func(*args, **(kwargs or {}))

    with torch.no_grad():
        canvas, logits, mask, cache, masks, positions = _decoder_inputs(model, 40, torch.bfloat16)
        fused = FusedDecoder(model)
        rotary = fused.rotary(positions, torch.bfloat16)
        with RouterReads() as watcher:
            fused.forward(canvas, logits, mask, cache, dict(masks), rotary)
    assert watcher.reads == [(index, "dgemma.route.default") for index in range(len(layers))]
    proj = layers[0].router.proj
    proj.bias = torch.nn.Parameter(torch.zeros(proj.out_features, dtype=torch.bfloat16))  # the kernel adds none
    assert unsupported(model) is not None


@pytest.mark.parametrize("mode", ["int4", "int8"])
def test_quantized_projections_of_one_input_share_a_launch_and_give_transformers_output(mode):
    """q / k / v one GEMM, gate and up one gated GEMM (and the self-conditioning MLP's): each layer launches
    2 or 3 fewer kernels, and the decoder's output is transformers' decoder's on the same packed weights. (bf16
    activations: w8a8 rounds each GEMM's input, where an fp32 ulp of another order of sums can move a code;
    test_fused_moe shows the stacked w8a8 GEMM equal to its members'.)"""
    model = build_tiny_model().eval()  # fp32: transformers' decoder is the reference to fp32 rounding
    quantize_model(model, mode)
    for module in model.modules():
        if isinstance(module, QuantizedLinear | QuantizedExperts):
            module.backend, module.quantize_activations = "triton", False
    decoder = model.model.decoder
    with torch.no_grad():
        canvas, logits, mask, cache, masks, positions = _decoder_inputs(model, 40, torch.float32)
        with self_conditioning_signal(decoder, soft_embeddings(decoder, logits, mask)):
            expected = decoder(decoder_input_ids=canvas, **with_cache(cache), decoder_attention_mask=masks,
                               decoder_position_ids=positions).last_hidden_state  # fmt: skip
        fused = FusedDecoder(model)
        assert all(stack is not None for stack in (*fused.qkv, *fused.gate_up, fused.signal_gate_up))
        launches = {}
        for stacked in (True, False):
            if not stacked:  # the same decoder with a launch a projection, as bf16 weights run
                fused.qkv, fused.gate_up = [None] * len(fused.qkv), [None] * len(fused.gate_up)
                fused.signal_gate_up = None
            with fused_moe.count_launches() as count:
                ours = fused.forward(canvas, logits, mask, cache, dict(masks), fused.rotary(positions, torch.float32))
            launches[stacked] = count.launches
            torch.testing.assert_close(ours.view(expected.shape), expected, rtol=1e-4, atol=1e-4)
    layers = decoder.layers
    saved = sum(2 if layer.self_attn.v_proj is not None else 1 for layer in layers) + len(layers) + 1
    assert launches[False] - launches[True] == saved


@pytest.mark.parametrize("mode", ["int8", "int4-w4a8"])
def test_activations_rounded_once_a_gemm_give_the_decoder_output_of_rounding_them_in_every_program(mode):
    """`launch_settings(activation_codes=True)` in the fused decoder: every w8a8 (w4a8) GEMM of the step reads
    codes rounded once, by the launch producing its input (the norms: q/k/v's, the dense MLP's, the experts'
    and the self-conditioning MLP's; each gated GEMM: its down's), all but o_proj, whose input is SDPA's: one
    `activation_codes` launch a layer. The decoder's output is bit for bit the one of the GEMMs rounding their
    activations in every program."""
    model = build_tiny_model().eval()
    quantize_model(model, "int4" if mode == "int4-w4a8" else mode, group_size=64,
                   int4_activations="int8" if mode == "int4-w4a8" else "none")  # fmt: skip
    for module in model.modules():
        if isinstance(module, QuantizedLinear | QuantizedExperts):
            module.backend = "triton"
    decoder = model.model.decoder
    with torch.no_grad():
        canvas, logits, mask, cache, masks, positions = _decoder_inputs(model, 40, torch.float32)
        fused = FusedDecoder(model)
        outputs, launches = {}, {}
        for codes in (False, True):
            with fused_moe.launch_settings(activation_codes=codes), fused_moe.count_launches() as count:
                outputs[codes] = fused.forward(canvas, logits, mask, cache, dict(masks),
                                               fused.rotary(positions, torch.float32))  # fmt: skip
            launches[codes] = count.launches
    assert torch.equal(outputs[True], outputs[False])
    assert launches[True] - launches[False] == len(decoder.layers)


def test_each_kernel_is_a_custom_op_whose_fake_matches_the_launch():
    """opcheck: schemas name exactly what each launch writes, and the fakes give the launches' shapes."""
    x, residual, weight = _rows(4, 32, 1, torch.float32), _rows(4, 32, 2, torch.float32), torch.ones(32)
    ops = torch.ops.dgemma
    torch.library.opcheck(ops.post_attention.default, (x, residual, weight, weight, weight, weight, 1e-6, 0.2))
    for clear in (False, True):
        sums = _rows(4, 32, 7, torch.float32)
        torch.library.opcheck(ops.post_ffn.default, (x, sums, residual, weight, weight, weight, torch.ones(1), weight,
                                                     1e-6, clear))  # fmt: skip
    # with activation codes written for the next GEMM (int8 and e4m3 bytes, 16 inputs a scale)
    codes = [fused_moe.CodesLayout(kind, 16).empty(x, 4, 32) for kind in ("int8", "fp8")]
    torch.library.opcheck(ops.post_attention.default, (x, residual, weight, weight, weight, weight, 1e-6, 0.2,
                                                       *codes[0], *codes[1]))  # fmt: skip
    torch.library.opcheck(ops.post_ffn.default, (x, _rows(4, 32, 7, torch.float32), residual, weight, weight, weight,
                                                 torch.ones(1), weight, 1e-6, True, *codes[1]))  # fmt: skip
    ids = torch.tensor([0, 3, 1, 2])
    torch.library.opcheck(ops.step_input.default, (ids, _rows(4, 32, 8, torch.float32), x, weight, 5.0, 1e-6,
                                                   *codes[0]))  # fmt: skip
    torch.library.opcheck(ops.signal_norm.default, (x, torch.tensor([True, False]), weight, 2, 5.0, 1e-6, *codes[1]))
    torch.library.opcheck(ops.gelu_mul.default, (x, residual))
    proj = _rows(20, 32, 8, torch.float32)  # router.proj.weight [E, H]: 20 experts, padded to 32 in the kernel
    torch.library.opcheck(ops.route.default, (_rows(20, 32, 9, torch.float32), proj, torch.rand(20) + 0.5, 4))
    torch.library.opcheck(ops.softmax_rows.default, (x, torch.empty_like(x)))
    keys = _rows(2 * 8, 16, 3, torch.float32).view(1, 2, 8, 16)  # cache [B, Hkv, M, D]; 4 tokens, 4 q heads
    table = _rows(4, 16, 4, torch.float32)
    q, kv = _rows(4, 64, 5, torch.float32), _rows(4, 32, 6, torch.float32)
    for grouped in (False, True):
        torch.library.opcheck(ops.attention_inputs.default, (q, kv, kv, torch.ones(16), torch.ones(16), table, table,
                                                             keys, keys.clone(), torch.tensor(2), 4, 1e-6, grouped))  # fmt: skip
