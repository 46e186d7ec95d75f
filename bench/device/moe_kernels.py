"""The expert kernels on a lent GPU, in stages: check them, time them, see what a layer launches, sweep tiles.

Run from the repository root (bench/device/README.md), one stage per call so each has its own time limit:

- `check`: at the full shape, 256 tokens: the int4 unpack in inline PTX equals the Triton bit-op one
  bit for bit (gate_up outputs, symmetric, affine, GGUF Q4_K's affine under two-level scales, and w4a8's
  unpack of int4 to int8 codes); every
  variant of `bench moe` (gguf-q4_k_m included: a Q4_K_M file's layout) against the fp32 loop on its own
  packed weights and against the unquantized weights; every output element written (outputs poisoned
  with NaN first); each line printed as it is known, then PASS or FAIL.
- `time`: every variant at 256 and 1,024 tokens (4 candidates): CUDA-graph ms, x floor (the measured
  copy rate), eager ms; a row per variant as it comes.
- `profile`: torch.profiler over eager forwards of the product variants: the device kernels one layer
  launches, their count and device time (gate_up vs down vs routing vs the rest).
- `sweep`: the product int4 (and w8a8) layer under a grid of launch settings (BLOCK_M, BLOCK_N, swap,
  warps, stages) in a seeded random order until `--seconds`; the fastest with their difference from
  the default.

On CPU (`--shape tiny`, TRITON_INTERPRET=1) every stage runs its plumbing with nan times and no PTX
(tests/bench/test_bench_device_scripts.py). Stdout only; nothing else is written.
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import random
import sys
import time

if not __import__("torch").cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are imported

import torch  # noqa: E402

from dgemma_lsp.bench import moe  # noqa: E402
from dgemma_lsp.engine.kernels import fused_moe  # noqa: E402
from dgemma_lsp.engine.weights.quantization import QuantizedExperts  # noqa: E402


def say(*parts) -> None:
    print(*parts, flush=True)


def setup(shape: str, tokens: int):
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    config = moe.text_config_for(shape)
    torch.manual_seed(moe.SEED)
    experts = moe._random_experts(config, device, dtype)
    inputs = moe._routed_inputs(config, tokens, device, dtype)
    return device, experts, inputs


def packed_modes(experts, modes=moe.MODES) -> dict[str, moe._Packed]:
    packed = {}
    for mode in modes:
        module = QuantizedExperts.from_experts(experts, mode, 128)
        module.backend = "triton"
        packed[mode] = moe._Packed(module)
    return packed


def bf16_reference(experts, inputs):
    hidden, index, weights = inputs
    with torch.no_grad():
        return moe._expert_loop(hidden, index, weights,
                                lambda e: (experts.gate_up_proj[e].float(), experts.down_proj[e].float()))  # fmt: skip


def gate_up_outputs(packed: moe._Packed, inputs, *, asm: bool, affine: dict | None = None,
                    activations: str = "none") -> torch.Tensor:  # fmt: skip
    """The gate_up launch alone (no atomics: its bits do not depend on scheduling); `affine`: its data, scales,
    mins (and `gate_up_super`: two-level scales) instead of the product int4's; `activations` "int8": w4a8."""
    hidden, index, _ = inputs
    module = packed.module
    tensors = affine or {"gate_up_data": module.gate_up_data, "gate_up_scales": module.gate_up_scales,
                         "gate_up_mins": None}  # fmt: skip
    super_scales, super_mins = tensors.get("gate_up_super") or (None, None)
    routing = fused_moe.align_routing(index, module.num_experts, fused_moe.block_m_for(index.numel(), module.num_experts))
    with fused_moe.launch_settings(asm=asm):
        return torch.ops.dgemma.expert_gemm(
            hidden, tensors["gate_up_data"], tensors["gate_up_scales"], tensors["gate_up_mins"], routing.sorted_pairs,
            routing.block_experts, routing.rows_used, None, num_rows=routing.num_pairs, out_rows=routing.num_pairs,
            n=tensors["gate_up_data"].shape[1] // 2, a_row_div=index.shape[1], out_row_div=1, block_m=routing.block_m,
            weights="int4-affine" if affine else "int4", activations=activations, gated=True, ss=super_scales,
            sm=super_mins,
        )  # fmt: skip


def q4_k_gate_up(packed: moe._Packed, experts) -> dict:
    """The gguf-q4_k_m variant's gate_up (Q4_K as the GGUF loader holds it), for `gate_up_outputs`."""
    moe._variant_forward("gguf-q4_k_m", moe.VARIANTS["gguf-q4_k_m"], packed, experts, 128)
    module = packed.gguf
    return {"gate_up_data": module.gate_up_data, "gate_up_scales": module.gate_up_scales,
            "gate_up_mins": module.gate_up_mins, "gate_up_super": module._super("gate_up")}  # fmt: skip


def stage_check(args) -> bool:
    device, experts, inputs = setup(args.shape, 256)
    packed = packed_modes(experts)
    reference = bf16_reference(experts, inputs)
    ok = True
    # Poison what the kernels store: an element never written stays NaN and fails every check below.
    original = fused_moe._gemm_output
    fused_moe._gemm_output = lambda a, rows, n, weighted, fake=False, dtype=None: (
        original(a, rows, n, weighted, fake, dtype) if weighted or fake
        else original(a, rows, n, weighted, dtype=dtype).fill_(math.nan)
    )
    if device.type == "cuda" and not fused_moe.interpreting():
        with torch.no_grad():
            pure = gate_up_outputs(packed["int4"], inputs, asm=False)
            ptx = gate_up_outputs(packed["int4"], inputs, asm=True)
            equal = torch.equal(pure, ptx) and bool(torch.isfinite(pure).all())
            say(f"int4 unpack, scaled as unpacked: inline PTX == bit ops, bit for bit: {equal}")
            moe._variant_forward("int4-affine32", moe.VARIANTS["int4-affine32"], packed["int4"], experts, 128)
            affine = {k: v for k, v in packed["int4"].affine.items() if k.startswith("gate_up")}
            pure = gate_up_outputs(packed["int4"], inputs, asm=False, affine=affine)
            ptx = gate_up_outputs(packed["int4"], inputs, asm=True, affine=affine)
            affine_equal = torch.equal(pure, ptx) and bool(torch.isfinite(pure).all())
            say(f"affine int4 unpack: inline PTX == bit ops, bit for bit: {affine_equal}")
            two_level = q4_k_gate_up(packed["int4"], experts)
            pure = gate_up_outputs(packed["int4"], inputs, asm=False, affine=two_level)
            ptx = gate_up_outputs(packed["int4"], inputs, asm=True, affine=two_level)
            q4_k_equal = torch.equal(pure, ptx) and bool(torch.isfinite(pure).all())
            say(f"Q4_K int4 unpack (two-level scales): inline PTX == bit ops, bit for bit: {q4_k_equal}")
            pure = gate_up_outputs(packed["int4"], inputs, asm=False, activations="int8")
            ptx = gate_up_outputs(packed["int4"], inputs, asm=True, activations="int8")
            w4a8_equal = torch.equal(pure, ptx) and bool(torch.isfinite(pure).all())
            say(f"w4a8 unpack (int4 to int8 codes): inline PTX == bit ops, bit for bit: {w4a8_equal}")
        ok = equal and affine_equal and q4_k_equal and w4a8_equal
    else:
        say("int4 unpack: inline PTX not checked (no CUDA)")
    for name in moe.variants_for(args.variants, moe.MODES, device):
        variant = moe.VARIANTS[name]
        if not moe._runs_here(name, device):
            say(f"{name}: skipped here")
            continue
        figure = moe.measure_variant(name, packed.get(variant.mode), experts, inputs, reference, group_size=128,
                                     repeats=1, copy_rate=None, timed=False)  # fmt: skip
        # The reference rounds where the kernels round (the bf16 intermediate, w8a8's codes); what is
        # left is summation order and the bf16 output: METHOD.md's bf16 band, 1e-3 to 1e-2.
        passed = math.isfinite(figure.rel_error) and figure.rel_error < 1e-2
        ok &= passed
        say(f"{name}: rel.err vs its fp32 reference {figure.rel_error:.2e} (max {figure.max_rel_error:.2e}), "
            f"vs unquantized {figure.error_vs_bf16:.3e}, {figure.ops_per_layer} ops, "
            f"{figure.triton_launches} launches: {'ok' if passed else 'FAIL'}")  # fmt: skip
    say("check: PASS" if ok else "check: FAIL")
    return ok


def stage_time(args) -> None:
    for tokens in [int(t) for t in args.tokens.split(",")]:
        device, experts, inputs = setup(args.shape, tokens)
        rate = moe.copy_tbs(device)
        say(f"== {tokens} tokens, {int(torch.unique(inputs[1]).numel())} experts routed, copy "
            f"{'-' if rate is None else f'{rate:.2f} TB/s'}")  # fmt: skip
        packed = packed_modes(experts)
        reference = bf16_reference(experts, inputs)
        for name in moe.variants_for(args.variants, moe.MODES, device):
            if not moe._runs_here(name, device):
                continue
            figure = moe.measure_variant(name, packed.get(moe.VARIANTS[name].mode), experts, inputs, reference,
                                         group_size=128, repeats=args.repeats, copy_rate=rate)  # fmt: skip
            say(f"{tokens} {moe._figure_line(figure)}, eager {figure.eager_ms}")
        del packed, experts
        if device.type == "cuda":
            torch.cuda.empty_cache()


def stage_profile(args) -> None:
    from torch.profiler import ProfilerActivity, profile

    device, experts, inputs = setup(args.shape, 256)
    packed = packed_modes(experts)
    hidden, index, weights = inputs
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    for mode, module in ((m, p.module) for m, p in packed.items()):
        with torch.no_grad():
            module(hidden, index, weights)  # compiled before the profile
            if device.type == "cuda":
                torch.cuda.synchronize()
            with profile(activities=activities) as prof:
                for _ in range(5):
                    module(hidden, index, weights)
                if device.type == "cuda":
                    torch.cuda.synchronize()
        say(f"== {mode} ({moe.product_variant(mode, device)}): what one layer runs (5 forwards)")
        on_device = [e for e in prof.events() if str(getattr(e, "device_type", "")).endswith("CUDA")]
        if on_device:
            say(f"  {len(on_device) / 5:.0f} device kernels a layer, "
                f"{sum(e.device_time_total for e in on_device) / 5:.1f} us device time")  # fmt: skip
        sort = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
        say(prof.key_averages().table(sort_by=sort, row_limit=14, max_name_column_width=70))


def stage_sweep(args) -> None:
    device, experts, inputs = setup(args.shape, 256)
    deadline = time.time() + args.seconds
    grid = list(itertools.product((16, 32, 64), (32, 64, 128), (True, False), (4, 8), (2, 3, 4)))
    random.Random(0).shuffle(grid)
    for mode in args.modes.split(","):
        module = packed_modes(experts, [mode])[mode].module

        def forward(module=module):
            return module(*inputs)

        with torch.no_grad():
            reference = forward().float()
            say(f"{mode} default: {moe.graph_ms(forward, device, 10) or math.nan:.3f} ms/layer")
            results = []
            for block_m, block_n, swap, warps, stages in grid[:args.configs]:
                if time.time() > deadline:
                    say(f"{mode}: stopped at the deadline after {len(results)} configs")
                    break
                config = dict(block_m=block_m, block_n=block_n, swap=swap, num_warps=warps, num_stages=stages)
                try:
                    with fused_moe.launch_settings(**config):
                        difference = float((forward().float() - reference).abs().max() / reference.abs().max())
                        ms = moe.graph_ms(forward, device, 10) or math.nan
                    results.append((ms, config, difference))
                    say(f"  {mode} {ms:.3f} ms {config} diff {difference:.1e}")
                except Exception as error:  # a config Triton cannot build (shared memory, say) is skipped
                    say(f"  {config}: {type(error).__name__}: {str(error)[:120]}")
            say(f"{mode} fastest:")
            for ms, config, difference in sorted(results, key=lambda r: r[0])[:8]:
                say(f"  {mode} {ms:.3f} ms  {config}  diff {difference:.1e}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("stage", choices=["check", "time", "profile", "sweep"])
    parser.add_argument("--shape", choices=["tiny", "full"], default="full")
    parser.add_argument("--variants", default="all", help="as bench moe's --variants")
    parser.add_argument("--tokens", default="256,1024", help="time: canvas tokens per run (1,024 = 4 candidates)")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--modes", default="int4,int8,fp8", help="sweep: the modes swept, in order")
    parser.add_argument("--configs", type=int, default=None, help="sweep: at most this many configs a mode")
    parser.add_argument("--seconds", type=float, default=120, help="sweep: no new config after this")
    args = parser.parse_args()
    say(f"torch {torch.__version__}, triton {__import__('triton').__version__}, "
        f"{torch.cuda.get_device_name() if torch.cuda.is_available() else 'no CUDA'}")  # fmt: skip
    if args.stage == "check":
        return 0 if stage_check(args) else 1
    {"time": stage_time, "profile": stage_profile, "sweep": stage_sweep}[args.stage](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
