"""The fused quantized MoE kernels, run on CPU in Triton's interpreter, against plain torch.

Proves, for int4, int8 and fp8 on the same packed weights: the routing
metadata puts every (token, slot) pair in exactly one row of its expert's
block-padded range, with no host sync and nothing for unrouted experts; the
fused experts (GELU-tanh * up, routing weights, top-k sum) equal a plain
per-pair fp32 reference, with an odd number of scale groups along K (as the
real down projection's K = 704 = 11 x 64), top-k ties, experts that get no
token, and 1 to 4 canvases; bf16 activations stay within bf16 rounding; the
dense dequant-GEMM equals dequantize + matmul at K = 704; inside the real
tiny DiffusionGemma the kernels give the logits of the torch loop.
Shapes are small: the interpreter runs every program in numpy.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are imported: their decorators read it
USES_TRITON_INTERPRETER = True  # tests/conftest.py keeps TRITON_INTERPRET for this module's tests

import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402
from transformers.activations import ACT2FN  # noqa: E402

from dgemma_lsp.engine.kernels import fused_moe  # noqa: E402
from dgemma_lsp.engine.kernels.quant_formats import dequantize, quantize  # noqa: E402
from dgemma_lsp.engine.model.tiny_model import build_tiny_model  # noqa: E402
from dgemma_lsp.engine.weights.quantization import QuantizedExperts, QuantizedLinear, quantize_model  # noqa: E402

MODES = ("int4", "int8", "fp8")
EXPERTS, HIDDEN, WIDTH, GROUP = 8, 80, 48, 16
"""K = 80 = 5 groups for gate_up and 48 = 3 groups for down: odd group counts, like K = 704 = 11 x 64."""
CANVAS = 8
UNROUTED_EXPERT = 5


@pytest.fixture(scope="module", autouse=True)
def interpreted_kernels():
    assert fused_moe.interpreting(), "the kernels were imported before TRITON_INTERPRET=1 was set"


class _Experts(nn.Module):
    """The attributes `QuantizedExperts.from_experts` reads, with the model's GELU-tanh."""

    def __init__(self, generator: torch.Generator, experts=EXPERTS, hidden=HIDDEN, width=WIDTH) -> None:
        super().__init__()
        self.num_experts = experts
        self.act_fn = ACT2FN["gelu_pytorch_tanh"]
        self.gate_up_proj = nn.Parameter(torch.randn(experts, 2 * width, hidden, generator=generator) * 0.1)
        self.down_proj = nn.Parameter(torch.randn(experts, hidden, width, generator=generator) * 0.1)


def _routing(tokens: int, top_k: int, generator: torch.Generator, experts=EXPERTS):
    """Router-like top-k with ties (equal scores on the first tokens) and one expert nobody picks."""
    scores = torch.randn(tokens, experts, generator=generator)
    scores[: max(1, tokens // 4)] = 0.0  # ties: topk still picks distinct experts
    scores[:, UNROUTED_EXPERT % experts] = -1e4
    probabilities = scores.softmax(dim=-1)
    weights, index = torch.topk(probabilities, top_k, dim=-1)
    return index.contiguous(), (weights / weights.sum(dim=-1, keepdim=True)).contiguous()


def _plain_reference(module: QuantizedExperts, hidden, index, weights) -> torch.Tensor:
    """Per (token, slot) in fp32 on the dequantized packed weights: no sorting, no batching."""
    gate_up = dequantize(module.gate_up_data, module.gate_up_scales, module.mode, torch.float32)
    down = dequantize(module.down_data, module.down_scales, module.mode, torch.float32)
    output = torch.zeros(hidden.shape, dtype=torch.float32)
    for token in range(hidden.shape[0]):
        for slot in range(index.shape[1]):
            expert = int(index[token, slot])
            gate, up = (gate_up[expert] @ hidden[token].float()).chunk(2)
            output[token] += float(weights[token, slot]) * (down[expert] @ (F.gelu(gate, approximate="tanh") * up))
    return output


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


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("batch", [1, 4])
def test_fused_experts_equal_a_plain_fp32_reference(mode, batch):
    generator = torch.Generator().manual_seed(batch)
    module = QuantizedExperts.from_experts(_Experts(generator), mode, GROUP)
    module.backend = "triton"
    hidden = torch.randn(batch * CANVAS, HIDDEN, generator=generator)
    index, weights = _routing(batch * CANVAS, 2, generator)
    assert not (index == UNROUTED_EXPERT).any() and int(torch.bincount(index.view(-1)).count_nonzero()) > 1
    with torch.no_grad():
        fused = module(hidden, index, weights)
        reference = _plain_reference(module, hidden, index, weights)
        loop = module.forward_loop(hidden, index, weights)
    assert fused.dtype == hidden.dtype and fused.shape == hidden.shape
    torch.testing.assert_close(fused, reference, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(loop, reference, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("batch", [2, 3])
def test_fused_int4_experts_at_every_batch_size(batch):
    generator = torch.Generator().manual_seed(10 + batch)
    module = QuantizedExperts.from_experts(_Experts(generator), "int4", GROUP)
    module.backend = "triton"
    hidden = torch.randn(batch * CANVAS, HIDDEN, generator=generator)
    index, weights = _routing(batch * CANVAS, 3, generator)
    with torch.no_grad():
        torch.testing.assert_close(module(hidden, index, weights), _plain_reference(module, hidden, index, weights),
                                   rtol=1e-4, atol=1e-5)  # fmt: skip


@pytest.mark.parametrize("mode", ["int4", "fp8"])
def test_bf16_activations_stay_within_bf16_rounding(mode):
    generator = torch.Generator().manual_seed(3)
    module = QuantizedExperts.from_experts(_Experts(generator), mode, GROUP)
    module.backend = "triton"
    hidden = torch.randn(2 * CANVAS, HIDDEN, generator=generator).bfloat16()
    index, weights = _routing(2 * CANVAS, 2, generator)
    with torch.no_grad():
        fused = module(hidden, index, weights)
        reference = _plain_reference(module, hidden, index, weights)
    assert fused.dtype == torch.bfloat16
    assert float((fused.float() - reference).abs().max() / reference.abs().max()) < 0.02


@pytest.mark.parametrize("mode", MODES)
def test_dense_dequant_gemm_equals_dequantize_then_matmul_at_k_704(mode):
    generator = torch.Generator().manual_seed(4)
    weight = torch.randn(40, 704, generator=generator) * 0.05
    data, scales = quantize(weight, mode, 128)  # 704 takes group 64: 11 groups
    assert scales.shape[-1] == 11
    x = torch.randn(3, 2, 704, generator=generator)
    fused = fused_moe.fused_linear(x, data, scales, mode)
    reference = x @ dequantize(data, scales, mode, torch.float32).T
    torch.testing.assert_close(fused, reference, rtol=1e-4, atol=1e-4)


def test_expert_down_projection_at_k_704():
    generator = torch.Generator().manual_seed(5)
    module = QuantizedExperts.from_experts(_Experts(generator, experts=4, hidden=32, width=704), "int4", 128)
    module.backend = "triton"
    assert module.down_scales.shape[-1] == 11
    hidden = torch.randn(4, 32, generator=generator)
    index, weights = _routing(4, 2, generator, experts=4)
    with torch.no_grad():
        torch.testing.assert_close(module(hidden, index, weights), _plain_reference(module, hidden, index, weights),
                                   rtol=1e-4, atol=1e-5)  # fmt: skip


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


def _gemm_cases():
    """(args, kwargs) of dgemma::dequant_gemm for its three uses: routed gate_up, routed down, dense."""
    generator = torch.Generator().manual_seed(7)
    module = QuantizedExperts.from_experts(_Experts(generator), "int4", GROUP)
    hidden = torch.randn(CANVAS, HIDDEN, generator=generator)
    index, weights = _routing(CANVAS, 2, generator)
    routing = fused_moe.align_routing(index, EXPERTS, 16)
    pairs = routing.num_pairs
    gate_up = ((hidden, module.gate_up_data, module.gate_up_scales, routing.sorted_pairs, routing.block_experts,
                routing.rows_used, None),
               dict(num_rows=pairs, out_rows=pairs, n=WIDTH, a_row_div=2, out_row_div=1, block_m=16, mode="int4",
                    gated=True))  # fmt: skip
    intermediate = torch.randn(pairs, WIDTH, generator=generator)
    down = ((intermediate, module.down_data, module.down_scales, routing.sorted_pairs, routing.block_experts,
             routing.rows_used, weights),
            dict(num_rows=pairs, out_rows=CANVAS, n=HIDDEN, a_row_div=1, out_row_div=2, block_m=16, mode="int4",
                 gated=False))  # fmt: skip
    data, scales = quantize(torch.randn(24, HIDDEN, generator=generator), "int8", GROUP)
    dense = ((hidden, data.unsqueeze(0), scales.unsqueeze(0), None, None, None, None),
             dict(num_rows=CANVAS, out_rows=CANVAS, n=24, a_row_div=1, out_row_div=1, block_m=16, mode="int8",
                  gated=False))  # fmt: skip
    return {"gate_up": gate_up, "down": down, "dense": dense}, index


@pytest.mark.parametrize("case", ["gate_up", "down", "dense"])
def test_dequant_gemm_is_a_custom_op_whose_fake_matches_the_kernel(case):
    """opcheck: schema (nothing mutated), fake implementation vs the real launch, and tracing."""
    cases, _ = _gemm_cases()
    args, kwargs = cases[case]
    torch.library.opcheck(torch.ops.dgemma.dequant_gemm.default, args, kwargs)


def test_align_routing_is_a_custom_op_whose_fake_matches_the_kernel():
    _, index = _gemm_cases()
    flat = index.view(-1)
    order = torch.argsort(flat, stable=True)
    torch.library.opcheck(torch.ops.dgemma.align_routing.default, (flat, order, EXPERTS, 16))


def test_fused_experts_trace_whole_into_one_graph():
    """torch.compile sees the kernels as operators: no graph break, the same output as eager."""
    generator = torch.Generator().manual_seed(8)
    module = QuantizedExperts.from_experts(_Experts(generator), "int8", GROUP)
    hidden = torch.randn(CANVAS, HIDDEN, generator=generator)
    index, weights = _routing(CANVAS, 2, generator)

    def experts(hidden, index, weights):
        return fused_moe.fused_experts(hidden, index, weights, gate_up_data=module.gate_up_data,
                                       gate_up_scales=module.gate_up_scales, down_data=module.down_data,
                                       down_scales=module.down_scales, mode="int8")  # fmt: skip

    compiled = torch.compile(experts, backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(compiled(hidden, index, weights), experts(hidden, index, weights))
