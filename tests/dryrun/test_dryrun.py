"""The virtual-GPU dry run (bench/dryrun.py) on the tiny architecture: needs torch's CUDA build.

Runs in `make dryrun` (the `.venv-cuda` environment); the CPU suite skips the
whole module, since the CPU build of torch cannot make fake CUDA tensors.

Proves, on fake CUDA tensors with a chosen compute capability and no driver:
the product's path (streaming loader placement, quantized modules, prompt
cache snapshot/restore/tail, the compiled step called eagerly, the fused
sampler as one custom op) runs with no device mismatch and no host sync inside
a step, in every mode on every virtual GPU; the watcher does catch a mixed-device
operator and a host read inside a step (so its zeros mean something); the
fused kernels appear as custom-op launches; the peak counts the request's cache
and logits on top of the weights, and memory returns to the weights afterwards.
"""

from __future__ import annotations

import msgspec
import pytest
import torch

if torch.version.cuda is None:
    pytest.skip("needs the CUDA build of torch (`make dryrun` runs these in .venv-cuda)", allow_module_level=True)

from torch._subclasses.fake_tensor import FakeTensorDeviceMismatchError, FakeTensorMode  # noqa: E402

from dgemma_lsp.bench import dryrun  # noqa: E402
from dgemma_lsp.bench.gpu import TINY, diffusion_config  # noqa: E402

GPU = dryrun.GPUS[0]  # RTX 4090, sm_89


@pytest.fixture(scope="module")
def tiny_report():
    # 160 tokens: past the tiny sliding window (64), as 4,096 is past the real one (1,024).
    return dryrun.run_dryrun(prompts=(160,), candidates=(1, 4), config=diffusion_config(TINY))


def test_every_virtual_gpu_and_mode_runs_without_mismatch_or_sync_inside_a_step(tiny_report):
    assert {run.gpu for run in tiny_report.runs} == {gpu.name for gpu in dryrun.GPUS}
    assert {run.mode for run in tiny_report.runs} == set(dryrun.MODES)
    assert len(tiny_report.runs) == len(dryrun.GPUS) * len(dryrun.MODES) * 2
    for run in tiny_report.runs:
        assert run.error is None, run
        assert run.steps == dryrun.STEPS
        assert run.device_mismatches == 0 and run.host_syncs_per_step == 0, run
    assert tiny_report.failures == []


def test_quantized_modes_launch_the_fused_kernels_and_none_launches_only_the_step_kernels(tiny_report):
    layers = TINY.text_overrides["num_hidden_layers"]
    # The fused decoder's own launches (fused_layer, fused_sampler): per layer attention's inputs, the
    # two norm launches, GELU x up and the router (projection and top-k in one); per step the
    # self-conditioning softmax, its norm, its GELU x up, the input, the sampler and the acceptance.
    step_kernels = 5 * layers + 6
    for run in tiny_report.runs:
        if run.mode == "none":
            assert run.custom_kernel_launches_per_step == step_kernels, run
        else:
            # + per layer 3 for the experts (routing, gate_up, down) + the quantized linears
            assert run.custom_kernel_launches_per_step > step_kernels + 3 * layers, run


def test_device_kernels_per_step_are_the_count_derived_by_hand_for_the_tiny_int4_step(tiny_report):
    """The tiny architecture (6 layers: 5 sliding, the last full, whose v is its k) in int4, fused.

    Per layer 13 kernels: q, k and v (or q and k) projections as one dequant-GEMM (their weights stacked),
    attention's inputs (head norms, rotary, the cache and the canvas in one buffer, each key/value head once),
    attention (SDPA, one fused kernel, each group's query heads folded into one sequence), its output copied
    into o_proj's head order, o_proj, the post-attention norms, gate and up with GELU x up as one gated GEMM, down, the router
    (its unquantized projection and its top-k in one launch), the experts (the routing alignment, gate_up,
    down: 3; the down adds into one fp32 buffer a step, zeroed once, which post_ffn rounds and clears), the
    post-feed-forward norms. Per step 6 before the layers
    (softmax, the soft embeddings' mm, their norm, the gated gate/up, down, the input) and 3 after (lm_head's
    mm, the sampler, the acceptance). Views and allocations launch nothing. (Before the stacking: 21 a sliding
    layer, 20 a full one, 8 before; before the alignment ranked pairs by atomics, a stable argsort added 3 a
    layer; the sums' zero fill and cast were 2 more a layer; the router's projection was an mm of its own, 1
    more a layer: 88; before the folding, with every query head's keys repeated, SDPA's output was a view of
    o_proj's input: 1 less a layer, 82.)"""
    expected = 6 + 1 + 6 * 13 + 3  # + 1: the sums' buffer zeroed
    runs = [run for run in tiny_report.runs if run.mode == "int4"]
    assert runs
    for run in runs:
        assert run.device_kernels_per_step == expected, run.device_kernels_by_op
        assert run.device_kernels_by_op["sdpa (fused)"] == TINY.text_overrides["num_hidden_layers"]


@pytest.fixture(scope="module")
def unfused_and_fused():
    """The tiny int4 step through transformers' decoder and through the fused one, on the H100."""
    return tuple(
        dryrun.run_dryrun(gpus=(dryrun.GPUS[2],), modes=("int4",), prompts=(160,), candidates=(1,),
                          config=diffusion_config(TINY), fused=setting).runs[0]
        for setting in (False, True)
    )  # fmt: skip


def test_the_fused_step_launches_a_fraction_of_the_kernels_of_transformers_decoder(unfused_and_fused):
    unfused, fused = unfused_and_fused
    assert unfused.error is None and fused.error is None
    assert fused.device_kernels_per_step * 4 < unfused.device_kernels_per_step, (fused, unfused)
    assert abs(fused.weight_bytes_per_step - unfused.weight_bytes_per_step) <= 1024, (fused, unfused)  # stacked ones counted;
    # (transformers' decoder also reads a few small buffers, its rotary tables' inverse frequencies among them)
    # transformers' norms run in fp32 with casts around them: the unfused step is mostly casts and copies.
    assert unfused.device_kernels_by_op["aten::_to_copy"] > fused.device_kernels_per_step
    assert "aten::_to_copy" not in fused.device_kernels_by_op or fused.device_kernels_by_op["aten::_to_copy"] <= 6


def test_the_steps_matrix_flops_are_the_hand_count_and_transformers_decoders(unfused_and_fused):
    """The matrix products of one tiny int4 step (one 32-token canvas), 2 FLOPs a multiply-add, counted by hand
    from the architecture: the fused decoder does exactly the work transformers' decoder does, and the compute
    floor is those FLOPs at the card's bf16 tensor rate."""
    unfused, fused = unfused_and_fused
    text = TINY.text_overrides
    tokens, hidden, vocab, width = TINY.canvas_length, text["hidden_size"], text["vocab_size"], text["intermediate_size"]
    q, kv = text["num_attention_heads"] * text["head_dim"], text["num_key_value_heads"] * text["head_dim"]
    layers, experts, pairs = text["num_hidden_layers"], text["num_experts"], tokens * text["top_k_experts"]
    mlp = 2 * tokens * hidden * 2 * width + 2 * tokens * width * hidden  # gate and up, then down
    sliding = 2 * tokens * hidden * (q + 2 * kv) + 2 * tokens * q * hidden + mlp  # q/k/v, o_proj, the dense MLP
    full = sliding - 2 * tokens * hidden * kv  # the full-attention layer's v is its k: no v projection
    dense = (layers - 1) * sliding + full + mlp  # + the self-conditioning MLP
    expert_work = layers * 3 * 2 * pairs * text["moe_intermediate_size"] * hidden  # gate, up, down per pair
    head = 2 * 2 * tokens * vocab * hidden  # the soft embeddings (probabilities x table) and lm_head
    router = layers * 2 * tokens * hidden * experts
    by_op = fused.matmul_flops_by_op
    assert by_op["dense (dgemma::expert_gemm)"] == dense, by_op
    assert by_op["experts (dgemma::expert_gemm)"] == expert_work, by_op
    assert by_op["aten::mm"] == head and by_op["dgemma::route"] == router, by_op
    assert set(by_op) == {"dense (dgemma::expert_gemm)", "experts (dgemma::expert_gemm)", "aten::mm",
                          "dgemma::route", "sdpa (fused)"}, by_op  # fmt: skip
    assert fused.matmul_flops_per_step == unfused.matmul_flops_per_step == {"bf16": sum(by_op.values())}
    assert unfused.matmul_flops_by_op["aten::mm"] == head + router  # transformers runs the router's projection
    h100 = dryrun.GPUS[2]
    assert fused.compute_floor_ms_per_step == round(sum(by_op.values()) / h100.tensor_flops_per_s["bf16"] * 1e3, 2)


def test_int4_with_int8_activations_moves_the_projections_and_experts_to_the_int8_rate(unfused_and_fused):
    """The bench-only `int4-w4a8` layout: the same work as int4, its dense and expert products in int8 (the
    activations quantized into the MMA), the table GEMMs, the router and attention still bf16."""
    _, int4 = unfused_and_fused
    w4a8 = dryrun.run_dryrun(gpus=(dryrun.GPUS[2],), modes=("int4-w4a8",), prompts=(160,), candidates=(1,),
                             config=diffusion_config(TINY)).runs[0]  # fmt: skip
    assert w4a8.error is None and w4a8.matmul_flops_by_op == int4.matmul_flops_by_op
    by_op = int4.matmul_flops_by_op
    int8 = by_op["dense (dgemma::expert_gemm)"] + by_op["experts (dgemma::expert_gemm)"]
    assert w4a8.matmul_flops_per_step == {"int8": int8, "bf16": sum(by_op.values()) - int8}, w4a8


def test_activations_rounded_once_add_one_launch_before_each_w8a8_gemm_and_nothing_else(unfused_and_fused):
    """The `int4-w4a8-codes` layout (`launch_settings(activation_codes=True)`): every quantized GEMM reads its
    activations rounded once, by the launch producing them (the norms write the q/k/v's, the gated MLP's and the
    experts' codes; each gated launch, `dgemma::expert_gemm_codes`, its down's), but o_proj, whose input is
    SDPA's: one `dgemma::activation_codes` kernel a layer more than int4-w4a8, the same work at the same rate, on
    the card with no host sync and no device mismatch."""
    layers = TINY.text_overrides["num_hidden_layers"]
    runs = {mode: dryrun.run_dryrun(gpus=(dryrun.GPUS[2],), modes=(mode,), prompts=(160,), candidates=(1,),
                                    config=diffusion_config(TINY)).runs[0]
            for mode in ("int4-w4a8", "int4-w4a8-codes")}  # fmt: skip
    plain, codes = runs["int4-w4a8"], runs["int4-w4a8-codes"]
    assert codes.error is None and codes.device_mismatches == 0 and codes.host_syncs_per_step == 0, codes
    by_op = codes.device_kernels_by_op
    assert by_op["dgemma::activation_codes"] == layers, by_op
    assert by_op["dgemma::expert_gemm_codes"] == 2 * layers + 1, by_op  # experts', dense MLP's, self-conditioning's
    assert codes.device_kernels_per_step == plain.device_kernels_per_step + layers
    assert codes.matmul_flops_per_step == plain.matmul_flops_per_step


def test_peak_holds_the_weights_plus_the_requests_cache_and_grows_with_candidates(tiny_report):
    runs = {(r.gpu, r.mode, r.prompt_tokens, r.candidates): r for r in tiny_report.runs}
    for (gpu, mode, prompt, candidates), run in runs.items():
        assert run.peak_bytes > run.resident_bytes
        assert run.weight_bytes_per_step <= run.resident_bytes
        if candidates == 4:
            assert run.peak_bytes > runs[(gpu, mode, prompt, 1)].peak_bytes


def test_attention_reads_each_cache_row_once_a_key_value_head_and_candidate(tiny_report):
    """The fused step builds SDPA's keys and values from the static cache (`attention_inputs`) with each key/value
    head once (its group's query heads folded into one sequence; 2 query heads to one here): exactly the cache
    the step reads plus the canvas's rows, for each candidate. The dry run counts these buffers
    (`attention_buffer_bytes_per_step`) beside the weights and the cache; with every query head's copy they were
    twice the cache and more."""
    config = diffusion_config(TINY)
    text = config.get_text_config(decoder=True)
    assert text.num_attention_heads // text.num_key_value_heads == 2
    canvas_rows = text.num_hidden_layers * 2 * text.num_key_value_heads * config.canvas_length * text.head_dim
    for run in tiny_report.runs:  # bf16 keys and values
        assert run.attention_buffer_bytes_per_step - run.cache_bytes_per_step == run.candidates * canvas_rows * 2, run


def test_the_watcher_counts_a_mixed_device_operator_and_a_host_read_inside_a_step():
    watcher = dryrun._make_watcher()
    with FakeTensorMode(), watcher:
        on_gpu = torch.ones(4, device="cuda")
        with pytest.raises(FakeTensorDeviceMismatchError):
            on_gpu + torch.ones(4)  # a CPU tensor left behind
        with watcher.in_step() as step:
            bool(on_gpu.sum() > 0)  # a host read: breaks CUDA-graph capture
            on_gpu.cpu()
    assert watcher.mismatches == 1
    assert step.syncs == 2 and step.ops > 0


def test_a_virtual_gpu_answers_its_capability_and_gives_it_back():
    from dgemma_lsp.engine.kernels import fused_moe

    with dryrun.virtual_gpu(dryrun.GPUS[1]):
        assert torch.cuda.get_device_capability() == (12, 0)
        assert fused_moe.fused_supported(torch.device("cuda"), "fp8", 64)
    with dryrun.virtual_gpu(GPU):
        assert fused_moe._capability(None) == (8, 9)


def test_a_step_allocates_one_logits_sized_tensor_the_self_conditioning_probabilities(tiny_report):
    """Fixes: the lm_head writes into the self-conditioning buffer and the sampler scales it in place;
    the self-conditioning softmax runs a slice of rows at a time (compiled_step.soft_embeddings).

    What is left per step is the bf16 probabilities the embedding matmul reads. transformers' own line
    (`logits.softmax(-1, dtype=float32).to(bf16)`) made three: ATen's softmax converts bf16 logits to a
    whole fp32 copy before the fp32 softmax (its fused upcast is for fp16 only, on a GPU as here), then
    the bf16 copy: two fp32 [B, 256, 262144] tensors at once, the peak of a 4-candidate request."""
    for run in tiny_report.runs:
        assert run.vocab_sized_allocations_per_step == 1, run


def test_a_canvas_reads_the_device_once_per_step_and_once_at_its_end(tiny_report):
    """Fix: the emitted canvas is the last draft already copied out, not a second read of the device.
    Per step: the draft and the finished flags (one stream sync on graphs); per canvas: the confidences."""
    for run in tiny_report.runs:
        assert run.host_syncs_per_canvas == 2 * run.steps + 1, run.sync_sites


Q4_K_TINY = msgspec.structs.replace(TINY, text_overrides={**TINY.text_overrides, "hidden_size": 256})
"""TINY with a hidden size Q4_K's 256-input blocks tile: at 64, llama-quantize writes Q5_0 where Q4_K_M means Q4_K."""


def test_the_gguf_q4_k_m_layout_is_what_the_gguf_loader_places_and_its_step_runs():
    """`--modes gguf-q4_k_m` stands for the real Q4_K_M: affine int4 with Q4_K's two-level scales (uint8 sc and
    m per 32 inputs under fp16 d and -dmin per 256) for gate_up and the Q4_K linears, int8 down (Q5_0 / Q8_0 /
    Q6_K in the file) in the same experts module, as formats/gguf.py places them. Plain symmetric int4 in
    groups of 32 (what `int4-g32` is) has neither mins nor super scales nor an int8 down."""
    from dgemma_lsp.engine.weights.quantization import QuantizedExperts, QuantizedLinear

    config = diffusion_config(Q4_K_TINY)
    skeleton = dryrun._skeleton(config)
    layout = dryrun.checkpoint_layout(skeleton)
    with torch.no_grad(), FakeTensorMode(allow_non_fake_inputs=True):
        model = dryrun.load_fake(skeleton, layout, "gguf-q4_k_m")
    experts = [m for m in model.modules() if isinstance(m, QuantizedExperts)]
    assert len(experts) == Q4_K_TINY.text_overrides["num_hidden_layers"]
    for module in experts:
        assert (module.mode, module.down_mode) == ("int4", "int8")
        assert module.gate_up_data.device.type == "cuda"
        assert module.gate_up_scales.dtype == module.gate_up_mins.dtype == torch.uint8  # sc, m per 32
        assert module.gate_up_super_scales.dtype == module.gate_up_super_mins.dtype == torch.float16  # d, -dmin
        assert module.gate_up_scales.shape[-2] == 256 // 32 and module.gate_up_super_scales.shape[-2] == 1
        assert module.down_data.dtype == torch.int8 and module.down_mins is None
    linears = {name: m for name, m in model.named_modules() if isinstance(m, QuantizedLinear)}
    q_proj = next(m for name, m in linears.items() if name.endswith("self_attn.q_proj"))
    o_proj = next(m for name, m in linears.items() if name.endswith("self_attn.o_proj"))
    assert q_proj.mode == "int4" and q_proj.weight_super_scales.dtype == torch.float16  # Q4_K
    assert o_proj.mode == "int8" and o_proj.weight_mins is None  # 64 inputs: Q5_0
    # What it holds is the GGUF loader's plan to the byte, besides the buffers no checkpoint holds (rotary's).
    held = _storage_bytes([*model.parameters(), *model.buffers()])
    computed = _storage_bytes(b for m in model.modules() for name, b in m._buffers.items()
                              if b is not None and name in m._non_persistent_buffers_set)  # fmt: skip
    planned = dryrun.planned_bytes(config)
    assert held - computed == planned["gguf-q4_k_m"] != planned["int4-g32"]

    report = dryrun.run_dryrun(gpus=(GPU,), modes=("gguf-q4_k_m",), prompts=(160,), candidates=(1,), config=config)
    (run,) = report.runs
    assert run.error is None and run.device_mismatches == 0 and run.host_syncs_per_step == 0, run
    assert report.failures == []
    # --jobs > 1 sends each process's report back as JSON: whole bytes, or the decode refuses it
    assert msgspec.json.decode(msgspec.json.encode(report), type=dryrun.DryRunReport) == report


def _storage_bytes(tensors) -> int:
    return sum({id(t.untyped_storage()): t.untyped_storage().nbytes() for t in tensors}.values())
