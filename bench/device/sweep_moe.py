"""Launch-configuration sweep of the routed dequant GEMM: one MoE layer, a 256-token canvas, batch 1.

For each packed mode given, times `QuantizedExperts` (the product's fused path) with its default launch
and with every (BLOCK_N, BLOCK_K, num_warps, num_stages) of a small grid, in a seeded random order so
that a sweep cut short by `--seconds` still spans the grid, and prints the fastest configs with each
one's max relative difference to the default's output. Times are CUDA-event means over 10 forwards
after one warm-up; on CPU (`--shape tiny`, Triton's interpreter) they are nan and only the plumbing is
checked. Launch settings are swapped by replacing `fused_moe`'s three launch helpers for one call:
the kernels themselves are untouched. Run from the repository root (bench/device/README.md).
"""

from __future__ import annotations

import argparse
import itertools
import math
import random
import time

import torch

from dgemma_lsp.bench.moe import _random_experts, _routed_inputs, text_config_for
from dgemma_lsp.engine.kernels import fused_moe
from dgemma_lsp.engine.weights.quantization import QuantizedExperts

GRID = list(itertools.product((64, 128, 256), (64, 128), (4, 8), (2, 3, 4)))
"""(BLOCK_N, BLOCK_K, num_warps, num_stages); BLOCK_K falls back to the default where it does not divide the group."""


def mean_ms(forward, device, repeats: int = 10) -> float:
    forward()  # compiles this config's kernels
    if device.type != "cuda":
        return math.nan
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(repeats):
        forward()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / repeats


def launched_with(block_n: int, block_k: int, warps: int, stages: int):
    """Patch fused_moe's launch helpers to these settings; returns a function that puts them back."""
    saved = fused_moe._launch, fused_moe._block_n, fused_moe.block_k_for
    launch, _, default_block_k = saved
    fused_moe._block_n = lambda n: block_n if n >= 128 else min(block_n, 64)  # the grid is sized from it too
    fused_moe.block_k_for = lambda group: block_k if group % block_k == 0 else default_block_k(group)
    fused_moe._launch = lambda kernel, grid, *a, **kw: launch(
        kernel, grid, *a, **{**kw, "num_warps": warps, "num_stages": stages}
    )

    def restore() -> None:
        fused_moe._launch, fused_moe._block_n, fused_moe.block_k_for = saved

    return restore


def sweep(mode: str, experts, inputs, device, deadline: float) -> None:
    quantized = QuantizedExperts.from_experts(experts, mode, 128)
    quantized.backend = "triton"  # "auto" keeps the per-expert loop on CPU; the kernels are the point

    def forward():
        return quantized(*inputs)

    reference = forward().float()
    print(f"{mode} default: {mean_ms(forward, device):.3f} ms/layer", flush=True)
    configs = GRID.copy()
    random.Random(0).shuffle(configs)
    results = []
    for config in configs:
        if time.time() > deadline:
            print(f"{mode}: stopped at the deadline after {len(results)} configs", flush=True)
            break
        restore = launched_with(*config)
        try:
            difference = float((forward().float() - reference).abs().max() / reference.abs().max())
            results.append((mean_ms(forward, device), config, difference))
        except Exception as error:  # a config Triton cannot build (shared memory, say) is skipped
            print(f"  {config}: {type(error).__name__}: {str(error)[:120]}", flush=True)
        finally:
            restore()
    for ms, (block_n, block_k, warps, stages), difference in sorted(results)[:12]:
        print(f"  {mode} {ms:.3f} ms  BLOCK_N={block_n} BLOCK_K={block_k} warps={warps} stages={stages}  "
              f"diff {difference:.1e}", flush=True)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("modes", help="comma-separated packed modes: int4,int8,fp8")
    parser.add_argument("--shape", choices=["tiny", "full"], default="full")
    parser.add_argument("--seconds", type=float, default=150, help="stop starting new configs after this")
    args = parser.parse_args()
    deadline = time.time() + args.seconds
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    config = text_config_for(args.shape)
    torch.manual_seed(0)
    experts = _random_experts(config, device, dtype)
    inputs = _routed_inputs(config, 256, device, dtype)
    with torch.no_grad():
        for mode in args.modes.split(","):
            sweep(mode, experts, inputs, device, deadline)


if __name__ == "__main__":
    main()
