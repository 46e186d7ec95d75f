"""The fused quantized MoE kernels, run on CPU in Triton's interpreter, against plain fp32 references.

Proves, for every weight format (int4 tiles, affine int4, int8, fp8) and both
orientations of the expert GEMM (tokens on the MMA's N side or M side): the
routing metadata puts every (token, slot) pair in exactly one row of its
expert's block-padded range, with no host sync and nothing for unrouted
experts; the fused experts (GELU-tanh * up, routing weights, top-k sum) equal
a plain per-pair fp32 reference on the same packed weights, with an odd
number of 64-input blocks along K (as the real down projection's K = 704 =
11 x 64), scale groups of 16 to 64, one expert holding several row blocks,
experts that get no token, and 1 to 4 canvases; every output element is
written (outputs poisoned with NaN first); w8a8 equals the same reference on
activations rounded per row as the kernel rounds them, and so does w4a8 (int4
weights unpacked to one int8 tile a K-block, routed and dense); bf16 activations stay
within bf16 rounding; the dense GEMM equals dequantize + matmul at K = 704;
the first-generation kernel (kept for A/B) gives the same result on the
legacy layout; inside the real tiny DiffusionGemma the kernels give the
logits of the torch loop. Shapes are small: the interpreter runs every
program in numpy. Inline PTX cannot run here: bench/device/moe_kernels.py
checks it equal to the bit-op unpacking on a GPU.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are imported: their decorators read it
USES_TRITON_INTERPRETER = True  # tests/conftest.py keeps TRITON_INTERPRET for this module's tests

import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from torch import nn  # noqa: E402
from transformers.activations import ACT2FN  # noqa: E402

from dgemma_lsp.engine.kernels import expert_kernels, fused_moe, rounding  # noqa: E402
from dgemma_lsp.engine.kernels.quant_formats import (  # noqa: E402
    dequantize,
    dequantize_activations,
    legacy_layout,
    pack_int4_tiles,
    quantize,
    quantize_activations,
    quantize_int4_affine,
    unpack_int4_tiles,
)
from dgemma_lsp.engine.model.tiny_model import build_tiny_model  # noqa: E402
from dgemma_lsp.engine.weights.quantization import QuantizedExperts, QuantizedLinear, quantize_model  # noqa: E402

MODES = ("int4", "int8", "fp8")
EXPERTS, HIDDEN, WIDTH, GROUP = 8, 192, 64, 32
"""gate_up K = 192 = 3 int4 blocks (odd, like 704 = 11 x 64) and 6 groups; down K = 64 = 1 block, 2 groups."""
CANVAS = 8
UNROUTED_EXPERT = 5
FP32_TOLERANCE = dict(rtol=1e-4, atol=1e-5)


@pytest.fixture(scope="module", autouse=True)
def interpreted_kernels():
    assert fused_moe.interpreting(), "the kernels were imported before TRITON_INTERPRET=1 was set"


@pytest.fixture
def poisoned_outputs(monkeypatch):
    """Every GEMM output that the kernel stores (not the zero-filled atomic sums) starts as NaN."""
    original = fused_moe._gemm_output

    def poisoned(a, rows, n, route_weighted, fake=False, dtype=None):
        out = original(a, rows, n, route_weighted, fake, dtype)
        return out if route_weighted or fake else out.fill_(float("nan"))

    monkeypatch.setattr(fused_moe, "_gemm_output", poisoned)


class _Experts(nn.Module):
    """The attributes `QuantizedExperts.from_experts` reads, with the model's GELU-tanh."""

    def __init__(self, generator: torch.Generator, experts=EXPERTS, hidden=HIDDEN, width=WIDTH) -> None:
        super().__init__()
        self.num_experts = experts
        self.act_fn = ACT2FN["gelu_pytorch_tanh"]
        self.gate_up_proj = nn.Parameter(torch.randn(experts, 2 * width, hidden, generator=generator) * 0.1)
        self.down_proj = nn.Parameter(torch.randn(experts, hidden, width, generator=generator) * 0.1)


def _routing(tokens: int, top_k: int, generator: torch.Generator, experts=EXPERTS, crowded: bool = False):
    """Router-like top-k with ties (equal scores on the first tokens) and one expert nobody picks;
    `crowded`: expert 0 in every token's top-k, so it holds more than one 16-row block."""
    scores = torch.randn(tokens, experts, generator=generator)
    scores[: max(1, tokens // 4)] = 0.0  # ties: topk still picks distinct experts
    scores[:, UNROUTED_EXPERT % experts] = -1e4
    if crowded:
        scores[:, 0] = 8.0  # far above randn, yet the other picks still follow the scores
    probabilities = scores.softmax(dim=-1)
    weights, index = torch.topk(probabilities, top_k, dim=-1)
    return index.contiguous(), (weights / weights.sum(dim=-1, keepdim=True)).contiguous()


def _plain_reference(gate_up, down, hidden, index, weights, activations="none", groups=(0, 0)) -> torch.Tensor:
    """Per (token, slot) in fp32 on dequantized weights: no sorting, no batching; w8a8 rounds each
    matmul's input per row and per `groups` inputs, as the kernels do."""

    def rounded(row: torch.Tensor, group: int) -> torch.Tensor:
        if activations == "none":
            return row
        return dequantize_activations(*quantize_activations(row[None], group, activations))[0]

    output = torch.zeros(hidden.shape, dtype=torch.float32)
    for token in range(hidden.shape[0]):
        for slot in range(index.shape[1]):
            expert = int(index[token, slot])
            gate, up = (gate_up[expert] @ rounded(hidden[token].float(), groups[0])).chunk(2)
            inner = rounded(F.gelu(gate, approximate="tanh") * up, groups[1])
            output[token] += float(weights[token, slot]) * (down[expert] @ inner)
    return output


def _module_reference(module: QuantizedExperts, hidden, index, weights, activations="none") -> torch.Tensor:
    gate_up = dequantize(module.gate_up_data, module.gate_up_scales, module.mode, torch.float32)
    down = dequantize(module.down_data, module.down_scales, module.mode, torch.float32)
    groups = module.activation_groups() if activations != "none" else (0, 0)
    return _plain_reference(gate_up, down, hidden, index, weights, activations, groups)


def _fused(module: QuantizedExperts, hidden, index, weights, activations="none", **packed):
    return fused_moe.fused_experts(
        hidden, index, weights, gate_up_data=module.gate_up_data, gate_up_scales=module.gate_up_scales,
        down_data=module.down_data, down_scales=module.down_scales, mode=module.mode, activations=activations,
        **packed,
    )  # fmt: skip


@pytest.mark.parametrize(("tokens", "top_k", "block_m"), [(1, 2, 16), (7, 3, 16), (32, 2, 16), (40, 8, 32)])
def test_routing_puts_every_pair_once_in_its_experts_padded_rows(tokens, top_k, block_m):
    index, _ = _routing(tokens, top_k, torch.Generator().manual_seed(tokens), experts=16)
    routing = fused_moe.align_routing(index, 16, block_m)
    pairs = tokens * top_k
    sorted_pairs = routing.sorted_pairs.tolist()
    rows_used = int(routing.rows_used)
    counts = torch.bincount(index.view(-1), minlength=16)
    assert rows_used == int(((counts + block_m - 1) // block_m * block_m).sum())
    assert sorted(p for p in sorted_pairs if p != pairs) == list(range(pairs))
    assert all(p == pairs for p in sorted_pairs[rows_used:]), "rows past the used ones are padding"
    flat = index.view(-1).tolist()
    block_experts = routing.block_experts.tolist()
    for block, expert in enumerate(block_experts):
        rows = sorted_pairs[block * block_m : (block + 1) * block_m]
        if block * block_m >= rows_used:
            assert expert == 16, "blocks past the used rows name no expert"
            continue
        assert all(flat[p] == expert for p in rows if p != pairs), f"block {block} mixes experts"
        assert any(p != pairs for p in rows), "a used block holds at least one pair"
    assert UNROUTED_EXPERT not in block_experts


@pytest.mark.usefixtures("poisoned_outputs")
@pytest.mark.parametrize("swap", [True, False], ids=["tokens-on-n", "tokens-on-m"])
@pytest.mark.parametrize("mode", MODES)
def test_fused_experts_equal_a_plain_fp32_reference(mode, swap):
    generator = torch.Generator().manual_seed(2 * MODES.index(mode) + swap)
    module = QuantizedExperts.from_experts(_Experts(generator), mode, GROUP)
    hidden = torch.randn(3 * CANVAS, HIDDEN, generator=generator)
    index, weights = _routing(3 * CANVAS, 2, generator, crowded=True)
    counts = torch.bincount(index.view(-1), minlength=EXPERTS)
    assert counts[0] > 16 and counts[UNROUTED_EXPERT] == 0 and int(counts.count_nonzero()) > 2
    with torch.no_grad(), fused_moe.launch_settings(swap=swap):
        fused = _fused(module, hidden, index, weights)
    assert fused.dtype == hidden.dtype and fused.shape == hidden.shape
    torch.testing.assert_close(fused, _module_reference(module, hidden, index, weights), **FP32_TOLERANCE)


@pytest.mark.usefixtures("poisoned_outputs")
def test_int4_experts_in_128_weight_rows_a_program_give_the_same_output():
    """sm_90's wide int4 expert tiles (`launch_settings_for(wide=True)`: 128 weight rows a program, the weights
    scaled as unpacked under bf16 activations), with the gate_up's 64 and the down's 192 columns in part-empty
    blocks, give exactly the output of narrower tiles, within bf16 rounding of the fp32 reference."""
    generator = torch.Generator().manual_seed(16)
    module = QuantizedExperts.from_experts(_Experts(generator), "int4", 64)
    hidden = torch.randn(2 * CANVAS, HIDDEN, generator=generator).bfloat16()
    index, weights = _routing(2 * CANVAS, 2, generator)
    with torch.no_grad():
        narrow = _fused(module, hidden, index, weights)
        with fused_moe.launch_settings(block_n=128):
            wide = _fused(module, hidden, index, weights)
        reference = _module_reference(module, hidden.float(), index, weights)
    assert torch.equal(wide, narrow)
    torch.testing.assert_close(wide.float(), reference, rtol=2e-2, atol=2e-2)


@pytest.mark.usefixtures("poisoned_outputs")
@pytest.mark.parametrize("group", [16, 64])
def test_fused_int4_experts_at_every_group_size_and_batch(group):
    """Group 16: a scale per 16-input tile; 64: one per block (the subtile loop's two ends)."""
    generator = torch.Generator().manual_seed(group)
    module = QuantizedExperts.from_experts(_Experts(generator), "int4", group)
    batch = 4 if group == 16 else 2
    hidden = torch.randn(batch * CANVAS, HIDDEN, generator=generator)
    index, weights = _routing(batch * CANVAS, 3, generator)
    with torch.no_grad():
        torch.testing.assert_close(_fused(module, hidden, index, weights),
                                   _module_reference(module, hidden, index, weights), **FP32_TOLERANCE)  # fmt: skip


@pytest.mark.usefixtures("poisoned_outputs")
@pytest.mark.parametrize("swap", [True, False], ids=["tokens-on-n", "tokens-on-m"])
def test_affine_int4_experts_equal_their_reference(swap):
    generator = torch.Generator().manual_seed(21)
    experts = _Experts(generator)
    gate_up = quantize_int4_affine(experts.gate_up_proj, 32)
    down = quantize_int4_affine(experts.down_proj, 32)
    hidden = torch.randn(2 * CANVAS, HIDDEN, generator=generator)
    index, weights = _routing(2 * CANVAS, 2, generator, crowded=True)
    with torch.no_grad(), fused_moe.launch_settings(swap=swap):
        fused = fused_moe.fused_experts(
            hidden, index, weights, gate_up_data=gate_up[0], gate_up_scales=gate_up[1], gate_up_mins=gate_up[2],
            down_data=down[0], down_scales=down[1], down_mins=down[2], mode="int4",
        )  # fmt: skip
    reference = _plain_reference(
        dequantize(gate_up[0], gate_up[1], "int4", torch.float32, mins=gate_up[2]),
        dequantize(down[0], down[1], "int4", torch.float32, mins=down[2]), hidden, index, weights,
    )  # fmt: skip
    torch.testing.assert_close(fused, reference, **FP32_TOLERANCE)


def _two_level(generator: torch.Generator, stack: torch.Tensor, mode: str, group: int, super_group: int):
    """Random packed weights shaped like `stack` `[E, N, K]` with two-level scales, as a GGUF Q4_K (`int4`: affine,
    uint8 sub-scales and sub-mins under fp16 super scales and negative super mins) or Q6_K-like `int8` (int8
    sub-scales under fp16 super scales) loads: {data, scales, mins, super_scales, super_mins} (group-major)."""
    experts, n, k = stack.shape
    groups, supers = k // group, k // super_group

    def fp16(*shape, sign=1.0):  # weights of about 0.1 either way, as a real checkpoint's
        return (sign * (torch.rand(*shape, generator=generator) + 0.5) * 4e-4).to(torch.float16)

    if mode == "int4":
        codes = torch.randint(0, 16, (experts, n, k), generator=generator, dtype=torch.uint8)
        return dict(data=pack_int4_tiles(codes),
                    scales=torch.randint(0, 64, (experts, groups, n), generator=generator, dtype=torch.uint8),
                    mins=torch.randint(0, 64, (experts, groups, n), generator=generator, dtype=torch.uint8),
                    super_scales=fp16(experts, supers, n), super_mins=fp16(experts, supers, n, sign=-1.0))
    return dict(data=torch.randint(-127, 128, (experts, n, k), generator=generator, dtype=torch.int8),
                scales=torch.randint(-4, 5, (experts, groups, n), generator=generator, dtype=torch.int8),
                mins=None, super_scales=fp16(experts, supers, n), super_mins=None)


@pytest.mark.usefixtures("poisoned_outputs")
@pytest.mark.parametrize("swap", [True, False], ids=["tokens-on-n", "tokens-on-m"])
def test_two_level_scales_and_a_down_in_its_own_mode_equal_their_reference(swap):
    """What a GGUF Q4_K_M loads as, through QuantizedExperts on the Triton path: affine int4 gate_up with
    two-level scales (super per 64 inputs here: K = 192) beside an int8 down with its own two-level scales
    (super per 64 over int8 sub-scales per 16, the 8-bit K loop); w8a8 then quantizes the down's input only."""
    generator = torch.Generator().manual_seed(41)
    experts = _Experts(generator)
    module = QuantizedExperts(mode="int4", down_mode="int8", num_experts=EXPERTS, act_fn=experts.act_fn)
    for which, mode, group in (("gate_up", "int4", 32), ("down", "int8", 16)):
        packed = _two_level(generator, getattr(experts, f"{which}_proj"), mode, group, 64)
        for part, tensor in packed.items():
            setattr(module, f"{which}_{part}", tensor)
    hidden = torch.randn(2 * CANVAS, HIDDEN, generator=generator)
    index, weights = _routing(2 * CANVAS, 2, generator, crowded=True)
    reference = _plain_reference(module.unpacked("gate_up", torch.float32), module.unpacked("down", torch.float32),
                                 hidden, index, weights)  # fmt: skip
    module.backend, module.quantize_activations = "triton", False
    with torch.no_grad(), fused_moe.launch_settings(swap=swap):
        torch.testing.assert_close(module(hidden, index, weights), reference, **FP32_TOLERANCE)
        torch.testing.assert_close(module.forward_loop(hidden, index, weights), reference, **FP32_TOLERANCE)
        module.quantize_activations = True
        w8a8 = module(hidden, index, weights)
        torch.testing.assert_close(w8a8, module.forward_loop(hidden, index, weights, activations="int8"),
                                   **FP32_TOLERANCE)  # fmt: skip
    assert not torch.allclose(w8a8, reference, **FP32_TOLERANCE)  # the down's input was rounded: w8a8 ran


def test_two_level_scales_dequantize_as_their_products():
    """scale = sub-scale x super scale and min = sub-min x super min per group, in fp32: GGUF Q4_K's
    d * sc * q - dmin * m, exactly."""
    generator = torch.Generator().manual_seed(43)
    packed = _two_level(generator, torch.empty(1, 4, 512), "int4", 32, 256)
    codes = unpack_int4_tiles(packed["data"]).float()  # [1, 4, 512]
    sc, m = (packed[part].float().transpose(-1, -2).repeat_interleave(32, dim=-1) for part in ("scales", "mins"))
    d, dmin = (packed[part].float().transpose(-1, -2).repeat_interleave(256, dim=-1)
               for part in ("super_scales", "super_mins"))  # fmt: skip
    expected = (d * sc) * codes + dmin * m
    assert torch.equal(dequantize(mode="int4", dtype=torch.float32, **packed), expected)


@pytest.mark.usefixtures("poisoned_outputs")
@pytest.mark.parametrize("swap", [True, False], ids=["tokens-on-n", "tokens-on-m"])
@pytest.mark.parametrize("mode", ["int8", "fp8"])
def test_w8a8_experts_equal_the_reference_on_activations_rounded_per_row(mode, swap):
    generator = torch.Generator().manual_seed(31 + swap)
    module = QuantizedExperts.from_experts(_Experts(generator), mode, GROUP)
    hidden = torch.randn(2 * CANVAS, HIDDEN, generator=generator)
    hidden[0, :32] = 0.0  # an all-zero activation group: no division by zero
    index, weights = _routing(2 * CANVAS, 2, generator, crowded=True)
    with torch.no_grad(), fused_moe.launch_settings(swap=swap):
        fused = _fused(module, hidden, index, weights, activations=mode)
    reference = _module_reference(module, hidden, index, weights, activations=mode)
    torch.testing.assert_close(fused, reference, **FP32_TOLERANCE)
    # The module's own torch path rounds the same way (it is the kernels' reference on the product path).
    loop = module.forward_loop(hidden, index, weights, activations=mode)
    torch.testing.assert_close(loop, reference, **FP32_TOLERANCE)
    # And the rounding is real: a few percent off the bf16-activation result for fp8, under 2% for int8.
    plain = _module_reference(module, hidden, index, weights)
    error = float((fused - plain).norm() / plain.norm())
    assert 1e-4 < error < (0.05 if mode == "fp8" else 0.02)


W4A8_GROUP = 64
"""w4a8 takes one weight scale per 64-input K-block; the activations get theirs per row per block too."""


@pytest.mark.usefixtures("poisoned_outputs")
@pytest.mark.parametrize("swap", [True, False], ids=["tokens-on-n", "tokens-on-m"])
def test_w4a8_experts_equal_the_reference_on_activations_rounded_per_row(swap):
    """int4 weights x int8 activations (one int8 dot a K-block over the codes unpacked to int8): the fp32 reference
    on the dequantized int4 weights and activations rounded per row per 64 inputs. Random weights and
    activations: codes in another K order than the activations' would be far off."""
    generator = torch.Generator().manual_seed(41 + swap)
    module = QuantizedExperts.from_experts(_Experts(generator), "int4", W4A8_GROUP)
    hidden = torch.randn(3 * CANVAS - 1, HIDDEN, generator=generator)  # rows: no multiple of any BLOCK_M
    hidden[0, :64] = 0.0  # an all-zero activation block: no division by zero
    index, weights = _routing(hidden.shape[0], 2, generator, crowded=True)
    assert torch.bincount(index.view(-1), minlength=EXPERTS)[0] > 16  # one expert over several row blocks
    with torch.no_grad(), fused_moe.launch_settings(swap=swap):
        fused = _fused(module, hidden, index, weights, activations="int8")
    reference = _plain_reference(module.unpacked("gate_up", torch.float32), module.unpacked("down", torch.float32),
                                 hidden, index, weights, "int8", (W4A8_GROUP, W4A8_GROUP))  # fmt: skip
    torch.testing.assert_close(fused, reference, **FP32_TOLERANCE)
    # The rounding is real and small: off the bf16-activation (w4a16) result by well under 2%.
    plain = _module_reference(module, hidden, index, weights)
    error = float((fused - plain).norm() / plain.norm())
    assert 1e-4 < error < 0.02


@pytest.mark.usefixtures("poisoned_outputs")
@pytest.mark.parametrize("swap", [True, False], ids=["tokens-on-n", "tokens-on-m"])
@pytest.mark.parametrize("gated", [False, True], ids=["linear", "gated"])
def test_w4a8_dense_gemm_equals_the_reference_at_k_704(gated, swap):
    """The dense launch (a linear, and a stacked gate / up with GELU-tanh in the epilogue) at K = 704: 11 K-blocks,
    group 128 halved to 64 (the experts' down projection's), 6 rows (no multiple of BLOCK_M)."""
    generator = torch.Generator().manual_seed(43 + 2 * gated + swap)
    weight = torch.randn(2 * 40 if gated else 40, 704, generator=generator) * 0.05
    data, scales = quantize(weight, "int4", 128)
    assert scales.shape == (11, weight.shape[0])
    x = torch.randn(3, 2, 704, generator=generator)
    with fused_moe.launch_settings(swap=swap):
        fused = fused_moe.fused_linear(x, data, scales, "int4", activations="int8", gated=gated)
    rounded = dequantize_activations(*quantize_activations(x, W4A8_GROUP, "int8"))
    reference = rounded @ dequantize(data, scales, "int4", torch.float32).T
    if gated:
        gate, up = reference.chunk(2, dim=-1)
        reference = F.gelu(gate, approximate="tanh") * up
    torch.testing.assert_close(fused, reference, rtol=1e-4, atol=1e-4)


def test_int4_modules_take_int8_activations_only_when_asked_and_only_in_whole_64_input_groups():
    """The product switch (`int4_activations`, set by `quantize_model`): off by default, int4 modules run w4a16;
    on, their fused forwards round activations per row per 64 inputs (w4a8) as their own torch reference does;
    a module in groups finer than 64 inputs stays w4a16 rather than rounding wrongly."""
    generator = torch.Generator().manual_seed(47)
    model = build_tiny_model()
    quantize_model(model, "int4", group_size=W4A8_GROUP, int4_activations="int8")
    experts = model.model.decoder.layers[0].experts
    linear = model.model.decoder.layers[0].self_attn.q_proj
    assert experts.int4_activations == linear.int4_activations == "int8"
    hidden = torch.randn(2 * CANVAS, experts.gate_up_data.shape[-1] * 4, generator=generator)
    index, weights = _routing(hidden.shape[0], 2, generator, experts=experts.num_experts)
    with torch.no_grad():
        experts.backend = linear.backend = "triton"
        w4a8 = experts(hidden, index, weights)
        torch.testing.assert_close(w4a8, experts.forward_loop(hidden, index, weights, activations="int8"),
                                   **FP32_TOLERANCE)  # fmt: skip
        rounded = dequantize_activations(*quantize_activations(hidden, W4A8_GROUP, "int8"))
        torch.testing.assert_close(linear(hidden), rounded @ linear.unpacked(torch.float32).T, **FP32_TOLERANCE)
        experts.int4_activations = linear.int4_activations = "none"  # the default: bf16 activations
        w4a16 = experts(hidden, index, weights)
        torch.testing.assert_close(w4a16, experts.forward_loop(hidden, index, weights), **FP32_TOLERANCE)
        torch.testing.assert_close(linear(hidden), hidden @ linear.unpacked(torch.float32).T, **FP32_TOLERANCE)
    assert not torch.allclose(w4a8, w4a16, **FP32_TOLERANCE)  # the switch did round
    fine = QuantizedLinear.from_linear(nn.Linear(128, 16, bias=False), "int4", 32)
    fine.int4_activations = "int8"
    assert fine.activations(torch.device("cpu")) == "none" and linear.activations(torch.device("cpu")) == "none"


def test_w4a8_takes_symmetric_int4_in_whole_k_blocks_only():
    """Affine int4 (a min per group times the activations' sum) and scale groups finer than the 64-input int8
    dot stay w4a16: the launch refuses them rather than rounding wrongly."""
    generator = torch.Generator().manual_seed(45)
    x = torch.randn(4, HIDDEN, generator=generator)
    data, scales, mins = quantize_int4_affine(torch.randn(24, HIDDEN, generator=generator), 64)
    with pytest.raises(AssertionError, match="cannot take int8 activations"):
        fused_moe.fused_linear(x, data, scales, "int4", mins=mins, activations="int8")
    data, scales = quantize(torch.randn(24, HIDDEN, generator=generator), "int4", 32)
    with pytest.raises(AssertionError, match="group 32 is finer"):
        fused_moe.fused_linear(x, data, scales, "int4", activations="int8")
    with pytest.raises(AssertionError, match="cannot take fp8 activations"):
        fused_moe.fused_linear(x, data, scales, "int4", activations="fp8")


@triton.jit
def _int4_int8_tile_kernel(words_ptr, out_ptr, ROWS: tl.constexpr, SWAP: tl.constexpr):
    rows, words, inputs = tl.arange(0, ROWS), tl.arange(0, 16), tl.arange(0, 64)
    if SWAP:  # [rows, 16] words -> [rows, 64] values
        tile = expert_kernels._int4_int8_tile(tl.load(words_ptr + rows[:, None] * 16 + words[None, :]), True, False)
        tl.store(out_ptr + rows[:, None] * 64 + inputs[None, :], tile.to(tl.int32))
    else:  # [16, rows] words -> [64, rows] values
        tile = expert_kernels._int4_int8_tile(tl.load(words_ptr + rows[None, :] * 16 + words[:, None]), False, False)
        tl.store(out_ptr + rows[None, :] * 64 + inputs[:, None], tile.to(tl.int32))


@pytest.mark.parametrize("kind", ["int8", "fp8"])
def test_activation_codes_are_the_rounding_the_kernels_do_in_their_loop(kind):
    """`activation_codes` (one launch) gives `quantize_activations`' codes and scales bit for bit, per row and per K
    step, all-zero rows included; an op whose fake matches it."""
    generator = torch.Generator().manual_seed(13)
    rows = torch.randn(CANVAS + 3, HIDDEN, generator=generator) * 3
    rows[2] = 0.0
    codes, scales = torch.ops.dgemma.activation_codes(rows, kind, 32)
    expected_codes, expected_scales = quantize_activations(rows, 32, kind)
    assert torch.equal(scales, expected_scales)
    assert torch.equal(codes.view(expected_codes.dtype) if kind == "fp8" else codes, expected_codes)
    torch.library.opcheck(torch.ops.dgemma.activation_codes.default, (rows, kind, 32))


@pytest.mark.usefixtures("poisoned_outputs")
@pytest.mark.parametrize(("mode", "activations", "dtype"), [("int8", "int8", torch.float32), ("fp8", "fp8", torch.bfloat16),
                                                           ("int4", "int8", torch.float32)])  # fmt: skip
def test_activations_rounded_once_give_what_every_program_rounding_them_gives(mode, activations, dtype):
    """`launch_settings(activation_codes=True)`: each w8a8 / w4a8 GEMM reads codes one launch wrote, and the
    experts (routed gate_up and down) and the dense projections (plain and gated) give exactly the outputs of the
    K loop that rounds the activations itself, with one launch more a GEMM but the experts' down, whose codes the
    gate_up launch stores in place of its output."""
    generator = torch.Generator().manual_seed(14)
    group = W4A8_GROUP if mode == "int4" else GROUP
    module = QuantizedExperts.from_experts(_Experts(generator), mode, group)
    hidden = torch.randn(2 * CANVAS, HIDDEN, generator=generator).to(dtype)
    index, weights = _routing(2 * CANVAS, 2, generator)
    data, scales = quantize(torch.randn(2 * WIDTH, HIDDEN, generator=generator) * 0.1, mode, group)
    outputs, launches = {}, {}
    for codes in (False, True):
        with torch.no_grad(), fused_moe.launch_settings(activation_codes=codes), fused_moe.count_launches() as count:
            outputs[codes] = (_fused(module, hidden, index, weights, activations=activations),
                              fused_moe.fused_linear(hidden, data, scales, mode, activations=activations),
                              fused_moe.fused_linear(hidden, data, scales, mode, activations=activations, gated=True))
        launches[codes] = count.launches
    for rounded_once, rounded_in_loop in zip(outputs[True], outputs[False], strict=True):
        assert rounded_once.dtype == dtype
        assert torch.equal(rounded_once, rounded_in_loop)
    assert launches == {False: 5, True: 8}  # align, gate_up, down, 2 dense; then codes before 3 of those GEMMs


@pytest.mark.usefixtures("poisoned_outputs")
@pytest.mark.parametrize(("mode", "activations"), [("int8", "int8"), ("fp8", "fp8"), ("int4", "int8")])
def test_a_dense_gated_launch_hands_its_down_codes_it_rounded_itself(mode, activations):
    """With activation codes on, `fused_linear(gated, codes_out=the down's layout)` returns `ActivationCodes`:
    what `activation_codes` makes of its output, bit for bit; the down reads them with no launch of its own
    before it, and the MLP's output is the one of launches that round their own activations."""
    generator = torch.Generator().manual_seed(15)
    group = W4A8_GROUP if mode == "int4" else GROUP
    x = torch.randn(2 * CANVAS, HIDDEN, generator=generator).to(torch.bfloat16)
    gate_up = quantize(torch.randn(2 * WIDTH, HIDDEN, generator=generator) * 0.1, mode, group)
    down = quantize(torch.randn(HIDDEN, WIDTH, generator=generator) * 0.1, mode, group)
    with torch.no_grad():
        inner = fused_moe.fused_linear(x, *gate_up, mode, activations=activations, gated=True)
        expected = fused_moe.fused_linear(inner, *down, mode, activations=activations)
        with fused_moe.launch_settings(activation_codes=True):
            layout = fused_moe.codes_layout(mode, activations, group)
            coded = fused_moe.fused_linear(x, *gate_up, mode, activations=activations, gated=True, codes_out=layout)
            with fused_moe.count_launches() as count:
                ours = fused_moe.fused_linear(coded, *down, mode, activations=activations)
    assert isinstance(coded, fused_moe.ActivationCodes) and coded.layout == layout and coded.dtype == torch.bfloat16
    codes, scales = torch.ops.dgemma.activation_codes(inner, layout.kind, layout.block_k)
    assert torch.equal(coded.codes, codes) and torch.equal(coded.scales, scales)
    assert count.launches == 1 and torch.equal(ours, expected)


@pytest.mark.parametrize("swap", [True, False], ids=["tokens-on-n", "tokens-on-m"])
def test_the_w4a8_tile_holds_each_code_minus_8_in_input_order(swap):
    """Every code 0..15 in every nibble: the int8 tile of a K-block's 16 words is the codes - 8, input by input
    (the activations are read in plain order: a tile in any other order would pair the wrong products)."""
    codes = torch.randint(0, 16, (16, 64), generator=torch.Generator().manual_seed(46), dtype=torch.uint8)
    codes[0], codes[1] = torch.arange(64) % 16, 15 - torch.arange(64) % 16
    out = torch.empty(16, 64, dtype=torch.int32)
    _int4_int8_tile_kernel[(1,)](pack_int4_tiles(codes), out, ROWS=16, SWAP=swap)
    assert torch.equal(out, codes.to(torch.int32) - 8)


@triton.jit
def _round_to_e4m3_kernel(x_ptr, out_ptr, N: tl.constexpr):
    offsets = tl.arange(0, N)
    tl.store(out_ptr + offsets, rounding.round_to_e4m3(tl.load(x_ptr + offsets)))


def test_e4m3_rounding_carries_into_the_exponent_and_ties_to_even():
    """The interpreter's own fp32 -> e4m3 conversion turned -7.96 into -4 (the kernels round first)."""
    edges = torch.tensor([-7.96, 7.96, 15.9, 0.0155, -0.0155, 1.0625, 1.1875, 448.0, -448.0, 0.0, 2.0**-9, 3 * 2.0**-10])
    values = torch.cat([edges, torch.randn(116, generator=torch.Generator().manual_seed(1)) * 40]).clamp(-448, 448)
    out = torch.empty_like(values)
    _round_to_e4m3_kernel[(1,)](values, out, N=128)
    assert torch.equal(out, values.to(torch.float8_e4m3fn).float())


@pytest.mark.parametrize("mode", ["int4", "fp8"])
def test_bf16_activations_stay_within_bf16_rounding(mode):
    generator = torch.Generator().manual_seed(3)
    module = QuantizedExperts.from_experts(_Experts(generator), mode, GROUP)
    hidden = torch.randn(2 * CANVAS, HIDDEN, generator=generator).bfloat16()
    index, weights = _routing(2 * CANVAS, 2, generator)
    with torch.no_grad():
        fused = _fused(module, hidden, index, weights)
    reference = _module_reference(module, hidden.float(), index, weights)
    assert fused.dtype == torch.bfloat16
    assert float((fused.float() - reference).norm() / reference.norm()) < 1e-2


def _bf16_down_sums(scale_weights: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """An expert down launch (int4, groups of 64, K = 704) on bf16 activations into fp32 sums, no output rounding:
    (the kernel's sums, the same sums in fp32 from `dequantize(..., bfloat16)`'s weights)."""
    generator = torch.Generator().manual_seed(12)
    module = QuantizedExperts.from_experts(_Experts(generator, experts=4, hidden=64, width=704), "int4", 128)
    index, weights = _routing(6, 2, generator, experts=4)
    routing = fused_moe.align_routing(index, 4, 16)
    activations = torch.randn(routing.num_pairs, 704, generator=generator).bfloat16()
    sums = torch.zeros(6, 64)
    with fused_moe.launch_settings(scale_weights=scale_weights):
        torch.ops.dgemma.expert_gemm_add(
            activations, module.down_data, module.down_scales, None, routing.sorted_pairs, routing.block_experts,
            routing.rows_used, weights.view(-1), sums, num_rows=routing.num_pairs, n=64, a_row_div=1, out_row_div=2,
            block_m=16, weights="int4", activations="none",
        )  # fmt: skip
    down = dequantize(module.down_data, module.down_scales, "int4", torch.bfloat16).float()
    products = torch.einsum("pk,pnk->pn", activations.float(), down[index.view(-1)]) * weights.view(-1, 1)
    return sums, products.view(6, 2, 64).sum(dim=1)


def test_int4_weights_are_scaled_as_unpacked_into_exactly_the_bf16_weights_dequantize_gives():
    """Symmetric int4 in groups of 64+ under bf16 activations: each code times its column's scale, rounded once to
    bf16 in the unpack, is the weight `dequantize(..., bfloat16)` holds, so the fp32 sums equal an fp32 product on
    those weights to fp32 rounding. Scaling each group's partial sum instead (`scale_weights=False`, the path of
    affine and two-level int4) skips that rounding and misses by ~1e-3."""
    assert expert_kernels.INT4_BLOCK_K == 64
    ours, reference = _bf16_down_sums(scale_weights=True)
    torch.testing.assert_close(ours, reference, **FP32_TOLERANCE)
    partial_sums, _ = _bf16_down_sums(scale_weights=False)
    assert not torch.allclose(partial_sums, reference, **FP32_TOLERANCE)


@pytest.mark.usefixtures("poisoned_outputs")
@pytest.mark.parametrize("mode", MODES)
def test_dense_gemm_equals_dequantize_then_matmul_at_k_704(mode):
    generator = torch.Generator().manual_seed(4)
    weight = torch.randn(40, 704, generator=generator) * 0.05
    data, scales = quantize(weight, mode, 128)  # 704 takes group 64: 11 groups, 11 int4 blocks
    assert scales.shape == (11, 40)
    x = torch.randn(3, 2, 704, generator=generator)
    fused = fused_moe.fused_linear(x, data, scales, mode)
    reference = x @ dequantize(data, scales, mode, torch.float32).T
    torch.testing.assert_close(fused, reference, rtol=1e-4, atol=1e-4)


def test_expert_down_projection_at_k_704():
    generator = torch.Generator().manual_seed(5)
    module = QuantizedExperts.from_experts(_Experts(generator, experts=4, hidden=64, width=704), "int4", 128)
    assert module.down_scales.shape[-2] == 11
    hidden = torch.randn(4, 64, generator=generator)
    index, weights = _routing(4, 2, generator, experts=4)
    with torch.no_grad():
        torch.testing.assert_close(_fused(module, hidden, index, weights),
                                   _module_reference(module, hidden, index, weights), **FP32_TOLERANCE)  # fmt: skip


def test_int4_weights_whose_k_is_not_in_64_blocks_keep_the_torch_path():
    """bench's tiny scale has expert width 32: its down projection cannot take the kernel, and must still run."""
    assert fused_moe.fused_supported(torch.device("cpu"), "int4", 16, in_features=(64, 64))
    assert not fused_moe.fused_supported(torch.device("cpu"), "int4", 16, in_features=(64, 32))
    generator = torch.Generator().manual_seed(6)
    module = QuantizedExperts.from_experts(_Experts(generator, hidden=64, width=32), "int4", 16)  # down K = 32
    hidden = torch.randn(4, 64, generator=generator)
    index, weights = _routing(4, 2, generator)
    with torch.no_grad():
        output = module(hidden, index, weights)  # backend auto
    torch.testing.assert_close(output, _module_reference(module, hidden, index, weights), **FP32_TOLERANCE)


@pytest.mark.parametrize("mode", MODES)
def test_first_generation_kernel_gives_the_same_result_on_the_legacy_layout(mode):
    generator = torch.Generator().manual_seed(8)
    module = QuantizedExperts.from_experts(_Experts(generator), mode, GROUP)
    hidden = torch.randn(CANVAS, HIDDEN, generator=generator)
    index, weights = _routing(CANVAS, 2, generator)
    gate_up = legacy_layout(module.gate_up_data, module.gate_up_scales, mode)
    down = legacy_layout(module.down_data, module.down_scales, mode)
    with torch.no_grad():
        legacy = fused_moe.fused_experts_legacy(hidden, index, weights, gate_up_data=gate_up[0],
                                                gate_up_scales=gate_up[1], down_data=down[0],
                                                down_scales=down[1], mode=mode)  # fmt: skip
        torch.testing.assert_close(legacy, _fused(module, hidden, index, weights), **FP32_TOLERANCE)


def test_tiny_model_logits_with_kernels_equal_the_torch_loop():
    model = build_tiny_model().eval()
    quantize_model(model, "int4")
    modules = [m for m in model.modules() if isinstance(m, QuantizedExperts | QuantizedLinear)]
    generator = torch.Generator().manual_seed(6)
    prompt = torch.randint(4, 1000, (1, 6), generator=generator)  # [1, P]
    canvas = torch.randint(4, 1000, (1, 32), generator=generator)  # [1, canvas]
    logits = {}
    for backend in ("torch", "triton"):
        for module in modules:
            module.backend = backend
        with torch.no_grad(), fused_moe.count_launches() as launches:
            logits[backend] = model(input_ids=prompt, decoder_input_ids=canvas).logits
        assert (launches.launches > 0) == (backend == "triton")
    torch.testing.assert_close(logits["triton"], logits["torch"], rtol=1e-3, atol=1e-4)


def test_one_moe_layer_is_three_triton_launches_for_every_format():
    generator = torch.Generator().manual_seed(9)
    hidden = torch.randn(CANVAS, HIDDEN, generator=generator)
    index, weights = _routing(CANVAS, 2, generator)
    for mode, activations in (("int4", "none"), ("int4", "int8"), ("int8", "int8"), ("fp8", "fp8"), ("fp8", "none")):
        module = QuantizedExperts.from_experts(_Experts(generator), mode, W4A8_GROUP if mode == "int4" else GROUP)
        with torch.no_grad(), fused_moe.count_launches() as launches:
            _fused(module, hidden, index, weights, activations=activations)
        assert launches.launches == 3, (mode, activations)  # align, gate_up, down: w8a8 adds none


def _gemm_cases():
    """(args, kwargs) of dgemma::expert_gemm for its uses: routed gate_up, routed down, dense, affine, w8a8."""
    generator = torch.Generator().manual_seed(7)
    module = QuantizedExperts.from_experts(_Experts(generator), "int4", GROUP)
    hidden = torch.randn(CANVAS, HIDDEN, generator=generator)
    index, weights = _routing(CANVAS, 2, generator)
    routing = fused_moe.align_routing(index, EXPERTS, 16)
    pairs = routing.num_pairs
    route = (routing.sorted_pairs, routing.block_experts, routing.rows_used)
    gate_up = ((hidden, module.gate_up_data, module.gate_up_scales, None, *route, None),
               dict(num_rows=pairs, out_rows=pairs, n=WIDTH, a_row_div=2, out_row_div=1, block_m=16,
                    weights="int4", activations="none", gated=True))  # fmt: skip
    intermediate = torch.randn(pairs, WIDTH, generator=generator)
    down = ((intermediate, module.down_data, module.down_scales, None, *route, weights),
            dict(num_rows=pairs, out_rows=CANVAS, n=HIDDEN, a_row_div=1, out_row_div=2, block_m=16,
                 weights="int4", activations="none", gated=False))  # fmt: skip
    data, scales = quantize(torch.randn(24, HIDDEN, generator=generator), "int8", GROUP)
    dense = ((hidden, data.unsqueeze(0), scales.unsqueeze(0), None, None, None, None, None),
             dict(num_rows=CANVAS, out_rows=CANVAS, n=24, a_row_div=1, out_row_div=1, block_m=16,
                  weights="int8", activations="int8", gated=False))  # fmt: skip
    affine_data, affine_scales, mins = quantize_int4_affine(torch.randn(24, HIDDEN, generator=generator), 32)
    affine = ((hidden, affine_data.unsqueeze(0), affine_scales.unsqueeze(0), mins.unsqueeze(0), None, None, None,
               None),
              dict(num_rows=CANVAS, out_rows=CANVAS, n=24, a_row_div=1, out_row_div=1, block_m=16,
                   weights="int4-affine", activations="none", gated=False))  # fmt: skip
    two_level = _two_level(generator, torch.empty(1, 24, HIDDEN), "int4", 32, 64)
    q4_k = ((hidden, two_level["data"], two_level["scales"], two_level["mins"], None, None, None, None),
            dict(num_rows=CANVAS, out_rows=CANVAS, n=24, a_row_div=1, out_row_div=1, block_m=16,
                 weights="int4-affine", activations="none", gated=False, ss=two_level["super_scales"],
                 sm=two_level["super_mins"]))  # fmt: skip
    cases = {"gate_up": gate_up, "down": down, "dense": dense, "affine": affine, "two-level": q4_k}
    return cases, index, module, hidden, weights


@pytest.mark.parametrize("case", ["gate_up", "down", "dense", "affine", "two-level"])
def test_expert_gemm_is_a_custom_op_whose_fake_matches_the_kernel(case):
    """opcheck: schema (nothing mutated), fake implementation vs the real launch, and tracing."""
    cases, *_ = _gemm_cases()
    args, kwargs = cases[case]
    torch.library.opcheck(torch.ops.dgemma.expert_gemm.default, args, kwargs)


def test_expert_gemm_add_is_a_custom_op_that_adds_into_the_callers_sums():
    """The down launch into the fused decoder's buffer: the same sums `expert_gemm` returns, added to what is there."""
    cases, *_ = _gemm_cases()
    args, kwargs = cases["down"]
    returned = torch.ops.dgemma.expert_gemm(*args, **kwargs)
    kwargs = {key: value for key, value in kwargs.items() if key not in ("out_rows", "gated")}
    base = torch.randn(returned.shape, generator=torch.Generator().manual_seed(8))
    into = base.clone()
    torch.ops.dgemma.expert_gemm_add(*args, into, **kwargs)
    torch.testing.assert_close(into, base + returned, **FP32_TOLERANCE)
    torch.library.opcheck(torch.ops.dgemma.expert_gemm_add.default, (*args, torch.zeros_like(returned)), kwargs)


@pytest.mark.parametrize("codes", ["int8", "fp8"])
def test_the_gate_up_storing_its_downs_codes_is_a_custom_op_giving_what_activation_codes_makes_of_its_output(codes):
    """`expert_gemm_codes`: the gated routed launch's output as the next GEMM's codes and scales, those of
    `activation_codes` on the output `expert_gemm` returns, bit for bit; its fake matches it."""
    cases, *_ = _gemm_cases()
    args, kwargs = cases["gate_up"]
    output = torch.ops.dgemma.expert_gemm(*args, **kwargs)
    expected = torch.ops.dgemma.activation_codes(output, codes, 32)
    codes_args = args[:7]  # without route_weights
    codes_kwargs = {key: value for key, value in kwargs.items() if key not in ("out_row_div", "gated")}
    codes_kwargs.update(codes=codes, codes_block=32, out_dtype=output.dtype)
    ours = torch.ops.dgemma.expert_gemm_codes(*codes_args, **codes_kwargs)
    assert all(torch.equal(a, b) for a, b in zip(ours, expected, strict=True))
    torch.library.opcheck(torch.ops.dgemma.expert_gemm_codes.default, codes_args, codes_kwargs)


def test_align_routing_is_a_custom_op_whose_fake_matches_the_kernel():
    _, index, *_ = _gemm_cases()
    torch.library.opcheck(torch.ops.dgemma.align_routing.default, (index.view(-1), EXPERTS, 16))


def test_legacy_dequant_gemm_is_still_a_custom_op_whose_fake_matches_the_kernel():
    _, index, module, hidden, _ = _gemm_cases()
    routing = fused_moe.align_routing(index, EXPERTS, 16)
    data, scales = legacy_layout(module.gate_up_data, module.gate_up_scales, "int4")
    args = (hidden, data, scales, routing.sorted_pairs, routing.block_experts, routing.rows_used, None)
    kwargs = dict(num_rows=routing.num_pairs, out_rows=routing.num_pairs, n=WIDTH, a_row_div=2, out_row_div=1,
                  block_m=16, mode="int4", gated=True)  # fmt: skip
    torch.library.opcheck(torch.ops.dgemma.dequant_gemm.default, args, kwargs)


def test_fused_experts_trace_whole_into_one_graph():
    """torch.compile sees the kernels as operators: no graph break, the same output as eager."""
    generator = torch.Generator().manual_seed(8)
    module = QuantizedExperts.from_experts(_Experts(generator), "int8", GROUP)
    hidden = torch.randn(CANVAS, HIDDEN, generator=generator)
    index, weights = _routing(CANVAS, 2, generator)

    def experts(hidden, index, weights):
        return _fused(module, hidden, index, weights, activations="int8")

    compiled = torch.compile(experts, backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(compiled(hidden, index, weights), experts(hidden, index, weights))


def _linears(generator: torch.Generator, form: str, widths: tuple[int, ...]) -> list[QuantizedLinear]:
    """QuantizedLinears of one input (K = HIDDEN) in `form`: a `--quantization` mode, or "q4_k" (affine int4 with
    two-level scales, as a GGUF Q4_K_M's attention and MLP weights load)."""
    modules = []
    for width in widths:
        if form == "q4_k":
            module = QuantizedLinear(mode="int4", in_features=HIDDEN, out_features=width)
            packed = _two_level(generator, torch.empty(1, width, HIDDEN), "int4", 32, 64)
            for part, tensor in packed.items():
                setattr(module, f"weight_{part}", tensor[0])
        else:
            linear = nn.Linear(HIDDEN, width, bias=False)
            nn.init.normal_(linear.weight, std=0.1, generator=generator)
            module = QuantizedLinear.from_linear(linear, form, GROUP)
        module.backend = "triton"
        modules.append(module)
    return modules


@pytest.mark.usefixtures("poisoned_outputs")
@pytest.mark.parametrize("form", ["int4", "int8", "fp8", "q4_k"])
def test_stacked_linears_are_one_launch_with_each_members_own_output(form):
    """q / k / v (widths as the model's: kv narrower) as one GEMM: each output equals the member run alone,
    whose buffers are now views of the stack (no second copy of the weights)."""
    generator = torch.Generator().manual_seed(51)
    modules = _linears(generator, form, (64, 32, 32))
    x = torch.randn(CANVAS, HIDDEN, generator=generator)
    with torch.no_grad():
        alone = [module(x) for module in modules]
        unpacked = [module.unpacked(torch.float32) for module in modules]
        stack = modules[0].stack_with(tuple(modules[1:]))
        assert stack is not None and stack.runs_fused(x.device)
        with fused_moe.count_launches() as launches:
            stacked = stack(x)
        assert launches.launches == 1
        for ours, theirs in zip(stacked, alone, strict=True):
            torch.testing.assert_close(ours, theirs, **FP32_TOLERANCE)
        for module, theirs, weight in zip(modules, alone, unpacked, strict=True):  # each still runs alone, on views
            assert module.weight_data.untyped_storage().data_ptr() == stack.data.untyped_storage().data_ptr()
            torch.testing.assert_close(module(x), theirs, **FP32_TOLERANCE)
            assert torch.equal(module.unpacked(torch.float32), weight)
            module.backend = "torch"
        assert not stack.runs_fused(x.device)  # a member on the torch path: the decoder calls them one by one


@pytest.mark.usefixtures("poisoned_outputs")
@pytest.mark.parametrize("form", ["int4", "int8", "q4_k"])
def test_stacked_gate_and_up_give_gelu_of_gate_times_up_in_one_launch(form):
    generator = torch.Generator().manual_seed(52)
    gate, up = _linears(generator, form, (WIDTH, WIDTH))
    x = torch.randn(CANVAS, HIDDEN, generator=generator)
    with torch.no_grad():
        expected = F.gelu(gate(x), approximate="tanh") * up(x)
        stack = gate.stack_with((up,))
        with fused_moe.count_launches() as launches:
            ours = stack(x, gated=True)
    assert launches.launches == 1 and ours.shape == (CANVAS, WIDTH)
    torch.testing.assert_close(ours, expected, **FP32_TOLERANCE)


def test_only_linears_of_one_form_on_the_fused_path_stack():
    generator = torch.Generator().manual_seed(53)
    int4, int8 = _linears(generator, "int4", (32,))[0], _linears(generator, "int8", (32,))[0]
    assert int4.stack_with((int8,)) is None  # another mode
    assert int4.stack_with((nn.Linear(HIDDEN, 32, bias=False),)) is None  # a bf16 linear
    assert int4.stack_with((int4,)) is None  # the same module twice
    other = _linears(generator, "int4", (32,))[0]
    other.backend = "auto"  # CPU: the torch path
    assert int4.stack_with((other,)) is None
    other.backend = "triton"
    assert int4.stack_with((other,)) is not None
