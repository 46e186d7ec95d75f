"""The step's Triton kernels compile for the users' cards, without a GPU.

Triton's interpreter (the numerics tests) never runs Triton's compiler, so a kernel can pass every CPU
test and still fail to compile on the card (a construct the interpreter accepts, a type the compiler
rejects). Triton's wheel carries its CUDA backend and ptxas, so `triton.compile` builds a cubin for a
named target with no driver: here the fused decoder's and the sampler's kernels for sm_89 (RTX 4090),
sm_90 (H100/H200) and sm_120 (RTX 5090) at the real model's shapes (the norms also writing the next GEMM's activation codes), and the
experts' routing and the w8a8 activation codes; and every GEMM launch of a layer as the product shapes it
per card, without a register spill (`bench/device/compile_kernels.py`). Runs in a subprocess: this
session's kernel modules were imported for the interpreter by other test modules.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("triton")

SCRIPT = r'''
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from dgemma_lsp.engine.kernels import expert_kernels as X, fused_layer as F, fused_sampler as S, moe_kernels as M

bf = "*bf16"
rows = dict(hidden="i32", eps="fp32")
attention = dict(q_ptr=bf, k_ptr=bf, v_ptr=bf, q_weight_ptr=bf, k_weight_ptr=bf, cos_ptr=bf, sin_ptr=bf,
                 cache_keys_ptr=bf, cache_values_ptr=bf, q_out_ptr=bf, keys_out_ptr=bf, values_out_ptr=bf,
                 offset_ptr="*i64", stride_q="i32", stride_k="i32", stride_v="i32", tokens="i32", heads="i32",
                 kv_heads="i32", length="i32", cached="i32", eps="fp32")
def codes_outputs(kind, *pointers):  # a norm launch's codes outputs: int8 codes or e4m3 bytes, fp32 scales
    if not kind:  # none: bf16 stand-ins the kernel never follows
        return {pointer: bf for pointer in pointers}
    return {pointer: ({1: "*i8", 2: "*u8"}[kind] if "codes" in pointer else "*fp32") for pointer in pointers}
norms = []
for kind in (0, 1, 2):  # each norm without codes, writing int8 codes, writing e4m3 codes for the next GEMM
    codes = dict(CODES=kind, CODES_BLOCK=64, FP32_MATH=False)
    norms += [
        (F.post_attention_kernel, dict(attn_ptr=bf, residual_ptr=bf, w_post_ptr=bf, w_mlp_ptr=bf, w_experts_ptr=bf,
         router_scale_ptr=bf, hidden_out_ptr=bf, mlp_in_ptr=bf, experts_in_ptr=bf, router_in_ptr=bf,
         **codes_outputs(kind, "mlp_codes_ptr", "mlp_scales_ptr", "experts_codes_ptr", "experts_scales_ptr"), **rows,
         router_root="fp32"), dict(BLOCK=4096, MLP_CODES=kind, MLP_CODES_BLOCK=64, EXPERTS_CODES=kind,
                                   EXPERTS_CODES_BLOCK=64, FP32_MATH=False)),
        (F.post_ffn_kernel, dict(mlp_ptr=bf, experts_ptr="*fp32", residual_ptr=bf, w_mlp_ptr=bf, w_experts_ptr=bf,
         w_sum_ptr=bf, layer_scalar_ptr=bf, w_next_ptr=bf, hidden_out_ptr=bf, next_in_ptr=bf,
         **codes_outputs(kind, "next_codes_ptr", "next_scales_ptr"), **rows),
         dict(BLOCK=4096, CLEAR_EXPERTS=True, **codes)),  # the quantized experts' fp32 sums, cleared once read
        (F.step_input_kernel, dict(ids_ptr="*i64", embed_ptr=bf, signal_ptr=bf, w_in_ptr=bf, hidden_out_ptr=bf,
         first_in_ptr=bf, **codes_outputs(kind, "first_codes_ptr", "first_scales_ptr"), hidden="i32",
         embed_scale="fp32", eps="fp32"), dict(BLOCK=4096, **codes)),
        (F.signal_norm_kernel, dict(soft_ptr=bf, mask_ptr="*i1", weight_ptr=bf, out_ptr=bf,
         **codes_outputs(kind, "codes_ptr", "scales_ptr"), hidden="i32", rows_per_batch="i32", embed_scale="fp32",
         eps="fp32"), dict(BLOCK=4096, **codes)),
    ]
norms.append((F.post_ffn_kernel, dict(mlp_ptr=bf, experts_ptr=bf, residual_ptr=bf, w_mlp_ptr=bf, w_experts_ptr=bf,
              w_sum_ptr=bf, layer_scalar_ptr=bf, w_next_ptr=bf, hidden_out_ptr=bf, next_in_ptr=bf, next_codes_ptr=bf,
              next_scales_ptr=bf, **rows), dict(BLOCK=4096, CLEAR_EXPERTS=False, CODES=0, CODES_BLOCK=64,
              FP32_MATH=False)))  # fmt: skip  # bf16 experts' output (an unquantized model)
cases = [
    *norms,
    (F.attention_inputs_kernel, attention, dict(D=256, REPEAT=2, BLOCK_P=16, HEADS=16, KV_HEADS=8)),  # sliding
    (F.attention_inputs_kernel, attention, dict(D=512, REPEAT=8, BLOCK_P=16, HEADS=16, KV_HEADS=2)),  # full
    (F.gelu_mul_kernel, dict(gate_ptr=bf, up_ptr=bf, out_ptr=bf, count="i32"), dict(BLOCK=1024)),
    (F.route_kernel, dict(x_ptr=bf, proj_ptr=bf, expert_scale_ptr=bf, weights_out_ptr="*fp32", index_out_ptr="*i64",
     rows="i32", hidden="i32", experts="i32"),
     dict(K=8, BLOCK_M=16, BLOCK_H=64, BLOCK_E=128, DOT_PRECISION="tf32", DOT_FP32=False)),  # H 2,816, E 128
    (F.route_kernel, dict(x_ptr="*fp32", proj_ptr="*fp32", expert_scale_ptr="*fp32", weights_out_ptr="*fp32",
     index_out_ptr="*i64", rows="i32", hidden="i32", experts="i32"),
     dict(K=8, BLOCK_M=16, BLOCK_H=64, BLOCK_E=128, DOT_PRECISION="ieee", DOT_FP32=False)),  # an fp32 model
    (F.softmax_rows_kernel, dict(logits_ptr=bf, out_ptr=bf, vocab="i32"), dict(BLOCK_V=4096)),
    (S.sample_logits_kernel, dict(logits_ptr=bf, scaled_ptr=bf, inv_temperature_ptr="*fp32", seed_ptr="*i64",
     sample_ptr="*i64", argmax_ptr="*i64", entropy_ptr="*fp32", confidence_ptr="*fp32", vocab="i32",
     stride_row="i32", softcap="fp32"), dict(APPLY_SOFTCAP=True, WRITE_SCALED=True, BLOCK_V=4096)),
    (S.accept_update_kernel, dict(sample_ptr="*i64", argmax_ptr="*i64", entropy_ptr="*fp32", confidence_ptr="*fp32",
     canvas_ptr="*i64", draft_ptr="*i64", kept_confidence_ptr="*fp32", finished_ptr="*i1",
     entropy_bound_ptr="*fp32", threshold_ptr="*fp32", seed_ptr="*i64", length="i32", vocab="i32"),
     dict(BLOCK_L=256, BLOCK_J=32)),
    # the experts' routing at 4 candidates x 256 tokens x top-8, 32-row blocks, 128 experts (atomic ranks)
    (M.align_routing_kernel, dict(flat_experts_ptr="*i64", sorted_pairs_ptr="*i32", block_experts_ptr="*i32",
     rows_used_ptr="*i32", scratch_ptr="*i32", num_pairs="i32", num_experts="i32", max_rows="i32",
     max_blocks="i32"), dict(BLOCK_M=32, P_P2=8192, E_P2=256, ROWS_P2=16384, BLOCKS_P2=512)),
    # w8a8's activations rounded once a GEMM (launch_settings(activation_codes=True)): int8 codes, e4m3 bytes
    *((X.activation_codes_kernel, dict(a_ptr=bf, codes_ptr=codes, scales_ptr="*fp32", rows="i32", stride_am="i32",
       stride_ak="i32", stride_cm="i32", stride_sm="i32"),
       dict(ACTIVATIONS=kind, FP32_MATH=False, BLOCK_R=32, BLOCK_K=64)) for kind, codes in ((1, "*i8"), (2, "*u8"))),
]
for arch in (89, 90, 120):
    for kernel, signature, constexprs in cases:
        source = ASTSource(fn=kernel, signature={**signature, **{name: "constexpr" for name in constexprs}},
                           constexprs=constexprs)
        compiled = triton.compile(source, target=GPUTarget("cuda", arch, 32), options={"num_warps": 8})
        assert compiled.asm.get("cubin"), (arch, kernel.__name__)
        print(f"sm_{arch} {kernel.__name__} ok")
'''


def test_the_step_kernels_compile_for_sm89_sm90_and_sm120():
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-4000:]
    assert done.stdout.count(" ok") == 3 * 24, done.stdout


def test_the_gemm_launches_of_a_step_compile_without_spilling_for_sm89_sm90_and_sm120():
    """Every expert and dense GEMM launch of a full-size layer, as the product's heuristics shape it per card (the
    tile sizes, Hopper's longer dense blocks and wider int4 expert tiles, activation codes read and written), builds
    for sm_89, sm_90 and sm_120 with no register spill and an MMA in its K loop: `bench/device/compile_kernels.py`
    (which reads the cubin with the cuobjdump Triton ships) for the default int4, and w8a8 / w4a8 reading codes,
    at one and four candidates."""
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    script = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "device", "compile_kernels.py")
    done = subprocess.run([sys.executable, script, "--archs", "89,90,120", "--variants", "int4,fp8-codes,int4-w4a8-codes",
                           "--tokens", "256,1024"], capture_output=True, text=True, timeout=900, env=env)  # fmt: skip
    assert done.returncode == 0 and "compile: PASS" in done.stdout, (done.stdout[-3000:], done.stderr[-3000:])
    assert done.stdout.count(" spill   0 B ") == 3 * 3 * 2 * 8, done.stdout[-3000:]  # archs x variants x tokens x launches

