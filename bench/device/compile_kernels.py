"""The expert GEMM compiled ahead of time for each GPU we target, no GPU needed: does it build, spill, use the MMA?

For each variant (int4 with the PTX unpack, int4 with Triton bit ops, affine int4, int4 weights under int8
activations (w4a8, PTX and bit-op unpack), w8a8 and w8a16 int8 / fp8, and what a GGUF Q4_K_M loads as:
Q4_K gate_up in affine int4 with two-level scales, int8 down in groups of 32)
and each launch of one MoE layer at the full shape (gate_up, down; 256 and 1,024 tokens) and of the layer's
stacked dense projections (q/k/v of each attention kind, the dense MLP's gated gate/up), builds the launch
the product would make (`fused_moe.expert_gemm_launch` on meta tensors: the same arguments, the same JIT
specialization of 1-valued and 16-divisible integers and pointers), compiles it with Triton for sm_89 (RTX
4090), sm_90 (H100/H200) and sm_120 (RTX 5090) with the ptxas Triton ships, and reads the cubin: registers,
spill stack, shared memory, which matrix instruction (HMMA / HGMMA / IMMA / IGMMA / QMMA / QGMMA) and how
many of its loads are 16 bytes wide. Exits 1 when a launch fails to build, spills, or has no MMA.

It also reads the K loop's machine code (the largest backward branch): its instructions a warp issues per
iteration, the matrix-op waits inside it (`WARPGROUP.DEPBAR`: a wgmma the warp waits for before going on), and
from these the **warp instructions per weight** (loop x warps / the weights one iteration covers), and how
many times each weight is unpacked (once per row block that reads it: the tokens over BLOCK_M for a dense
launch; for the experts, the blocks of an expert under uniform random top-k routing). Against each card's issue
rate (SMs x 4 schedulers x boost clock) and its memory bandwidth, `issue/read` is the time to issue the loop's
instructions for every unpack over the time to read the weights once from memory: above 1 the launch cannot
reach the weight-read floor even issuing every cycle. Summed over a denoising step (`LAYERS_PER_STEP`), the
step's GEMMs' issue-bound time per card, experts and dense apart. A lower bound, not a timing: stalls come on top
(the first-generation int4 kernel issued 0.50 instructions a weight and ran at ~31% of that bound on an H200;
bench/RESULTS.md).

Runs on a CPU-only machine (the tests do) and on a lent GPU machine, where it shows what that machine's
Triton makes of the same launches. Must run without TRITON_INTERPRET (it compiles real kernels).
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.compiler import CUDABackend
from triton.compiler import ASTSource
from triton.runtime.jit import native_specialize_impl

from dgemma_lsp.engine.kernels import expert_kernels, fused_moe, quant_formats

FULL = dict(experts=128, top_k=8, hidden=2816, width=704, group=128)
DENSE = {"qkv": (16 * 256 + 2 * 8 * 256, 2816), "qkv-full": (16 * 512 + 2 * 512, 2816), "mlp": (2112, 2816),
         "o": (2816, 16 * 256), "o-full": (2816, 16 * 512), "mlp-down": (2816, 2112)}
"""(output columns, inputs) of each dense launch of a layer: a sliding layer's stacked q/k/v (`StackedLinears`), a
full-attention layer's q/k (its v is k), the dense MLP's gated gate/up (its width; the weight holds twice as many
rows), each attention kind's o_proj and the dense MLP's down."""
VARIANTS = {
    # name: (weights, activations, asm) of both launches, or ((gate_up's), (down's), asm)
    "int4": ("int4", "none", True),
    "int4-bits": ("int4", "none", False),
    "int4-affine32": ("int4-affine", "none", True),
    "int4-w4a8": ("int4", "int8", True),  # int4 codes unpacked to int8 for the int8 MMA (opt-in)
    "int4-w4a8-bits": ("int4", "int8", False),
    "int8": ("int8", "int8", False),
    "int8-w8a16": ("int8", "none", False),
    "fp8": ("fp8", "fp8", False),
    "fp8-w8a16": ("fp8", "none", False),
    "int8-codes": ("int8", "int8", False),  # w8a8 reading `activation_codes`' codes (launch_settings opt-in)
    "fp8-codes": ("fp8", "fp8", False),
    "int4-w4a8-codes": ("int4", "int8", True),
    "gguf-q4_k_m": (("int4-q4k", "none"), ("int8-g32", "int8"), True),
}
LAYERS_PER_STEP = {"gate_up": 30, "down": 30, "qkv": 25, "qkv-full": 5, "mlp": 30, "o": 25, "o-full": 5, "mlp-down": 30}
"""How many times a denoising step makes each launch: 30 layers, 25 sliding-window and 5 full-attention."""
KERNEL_WEIGHTS = {"int4-q4k": "int4-affine", "int8-g32": "int8"}
"""The kernel's weight kind of a layout named here by what it holds (else the name itself)."""
MMA = re.compile(r"\b([HIQ]G?MMA)\.")
SASS_LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
BACKWARD = re.compile(r"\bBRA(?:\.\w+)*\s+(?:!?U?P\w+\s*,\s*)?(?:`\(\.L_x_\d+\)\s*)?0x([0-9a-f]+)")
CARDS = {
    89: (("RTX 4090", 128, 2.52e9, 1.0e12),),
    90: (("H100", 132, 1.98e9, 3.35e12), ("H200", 132, 1.98e9, 4.8e12)),
    120: (("RTX 5090", 170, 2.41e9, 1.8e12),),
}
"""Cards per target: (name, SMs, boost clock Hz, memory bandwidth bytes/s), from the vendors' data sheets
(the bandwidths of bench/dryrun.py's virtual GPUs; the H200 copies at ~4.3 TB/s in practice)."""
CUOBJDUMP = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")


def meta(*shape, dtype=torch.bfloat16) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device="meta")


def packed(weights: str, n: int, k: int, group: int, experts: int):
    """Meta (data, scales, mins, super scales, super mins) of a stacked weight `[E, n, k]` in `weights`' layout
    (int4-q4k: formats/gguf.py's Q4_K, uint8 sc and m per 32 under fp16 d and -dmin per 256; int8-g32: Q8_0's /
    Q5_0's, an fp16 scale per 32)."""
    data_dtype = {"int4": torch.int16, "int4-affine": torch.int16, "int4-q4k": torch.int16, "int8": torch.int8,
                  "int8-g32": torch.int8, "fp8": torch.uint8}[weights]
    values = quant_formats.values_per_element("int4" if weights.startswith("int4") else "int8")
    group = 32 if weights in ("int4-affine", "int4-q4k", "int8-g32") else quant_formats.effective_group_size(k, group)
    scale_dtype = {"int4-q4k": torch.uint8, "int8-g32": torch.float16}.get(weights, torch.bfloat16)
    scales = meta(experts, k // group, n, dtype=scale_dtype)
    mins = meta(experts, k // group, n, dtype=scale_dtype) if weights in ("int4-affine", "int4-q4k") else None
    supers = (meta(experts, k // 256, n, dtype=torch.float16),) * 2 if weights == "int4-q4k" else (None, None)
    return meta(experts, n, k // values, dtype=data_dtype), scales, mins, *supers


def activation_input(rows: int, k: int, weights: str, activations: str, scales: torch.Tensor, codes: bool):
    """(a, a_scales) a launch reads: bf16 activations, or (`codes`) `activation_codes`' codes and scales."""
    if not codes or activations == "none":
        return meta(rows, k), None
    block_k = fused_moe.activation_block_k(KERNEL_WEIGHTS.get(weights, weights), k // scales.shape[-2])
    code_dtype = torch.uint8 if activations == "fp8" else torch.int8
    return meta(rows, k, dtype=code_dtype), meta(rows, k // block_k, dtype=torch.float32)


def layer_launches(variant: tuple, tokens: int, arch: int, codes: bool = False):
    """(name, grid, args, kwargs) of the gate_up and down launches of one layer in `variant` (VARIANTS' value),
    then the layer's dense launches (`DENSE`) in the gate_up's form, as the product launches them on `arch`;
    `codes`: their activations as `activation_codes` writes them."""
    e, top_k, hidden, width, group = (FULL[k] for k in ("experts", "top_k", "hidden", "width", "group"))
    specs = variant[:2] if isinstance(variant[0], tuple) else (variant[:2], variant[:2])
    pairs = tokens * top_k
    block_m = fused_moe.block_m_for(pairs, e)
    max_rows, max_blocks = fused_moe._routing_sizes(pairs, e, block_m)
    routing = (meta(max_rows, dtype=torch.int32), meta(max_blocks, dtype=torch.int32), meta(1, dtype=torch.int32))
    launches = []  # (name, grid, args, kwargs, bytes a weight in memory with its scales, times each is unpacked)
    routed_unpacks = uniform_routing_blocks(tokens, top_k, e, block_m)
    for name, rows, (weights, activations), n, k, out, route, a_div, out_div in (
        ("gate_up", tokens, specs[0], width, hidden, meta(pairs, width), None, top_k, 1),
        ("down", pairs, specs[1], hidden, width, meta(tokens, hidden, dtype=torch.float32), meta(tokens, top_k), 1,
         top_k),
    ):  # fmt: skip
        w, s, m, ss, sm = packed(weights, 2 * n if name == "gate_up" else n, k, group, e)
        a, a_scales = activation_input(rows, k, weights, activations, s, codes)
        out_scales = None
        if name == "gate_up" and codes and specs[1][1] != "none":  # it stores the down's codes (expert_gemm_codes)
            _, down_scales, *_ = packed(specs[1][0], hidden, width, group, e)
            out, out_scales = activation_input(pairs, width, specs[1][0], specs[1][1], down_scales, True)
        grid, args, kwargs = fused_moe.expert_gemm_launch(
            a, w, s, m, *routing, route, out, num_rows=pairs, n=n, a_row_div=a_div, out_row_div=out_div,
            block_m=block_m, weights=KERNEL_WEIGHTS.get(weights, weights), activations=activations,
            gated=name == "gate_up", super_scales=ss, super_mins=sm, a_scales=a_scales, out_scales=out_scales,
            out_dtype=torch.bfloat16 if out_scales is not None else None, hopper=arch == 90,
        )  # fmt: skip
        launches.append((name, grid, args, kwargs, _bytes_per_weight(w, s, m, ss, sm), routed_unpacks))
    dense_weights, dense_activations = KERNEL_WEIGHTS.get(specs[0][0], specs[0][0]), specs[0][1]
    for name, (n, k) in DENSE.items():  # dense: one launch for every token, in the gate_up's form
        gated = name == "mlp"
        w, s, m, ss, sm = packed(specs[0][0], 2 * n if gated else n, k, group, 1)
        a, a_scales = activation_input(tokens, k, specs[0][0], dense_activations, s, codes)
        most = fused_moe.hopper_dense_rows(dense_weights, dense_activations, a_scales is not None, torch.bfloat16,
                                           ss is not None) if arch == 90 else 0  # fmt: skip  # as fused_linear
        block_m = fused_moe.dense_block_m(tokens, n, gated=gated, affine=m is not None, hopper_rows=most)
        out, out_scales = meta(tokens, n), None
        if gated and codes and dense_activations != "none":  # it stores its down's codes (fused_linear's codes_out)
            _, down_scales, *_ = packed(specs[0][0], *DENSE["mlp-down"], group, 1)
            out, out_scales = activation_input(tokens, n, specs[0][0], dense_activations, down_scales, True)
        grid, args, kwargs = fused_moe.expert_gemm_launch(
            a, w, s, m, None, None, None, None, out, num_rows=tokens, n=n, a_row_div=1,
            out_row_div=1, block_m=block_m, weights=dense_weights, activations=dense_activations, gated=gated,
            super_scales=ss, super_mins=sm, a_scales=a_scales, out_scales=out_scales,
            out_dtype=torch.bfloat16 if out_scales is not None else None, hopper=arch == 90,
        )  # fmt: skip
        launches.append((name, grid, args, kwargs, _bytes_per_weight(w, s, m, ss, sm), -(-tokens // kwargs["BLOCK_M"])))
    return launches


def uniform_routing_blocks(tokens: int, top_k: int, experts: int, block_m: int) -> float:
    """Row blocks an expert's weights are unpacked for, on average over experts, when each token picks `top_k`
    distinct experts uniformly at random (seeded; a real router is less even, so more)."""
    generator = torch.Generator().manual_seed(0)
    picks = torch.rand(tokens, experts, generator=generator).argsort(dim=1)[:, :top_k]
    pairs = torch.bincount(picks.flatten(), minlength=experts)
    return float((-(-pairs // block_m)).sum()) / experts


def _bytes_per_weight(data, *scales) -> float:
    weights = data.numel() * quant_formats.values_per_element("int4" if data.dtype == torch.int16 else "int8")
    return sum(t.numel() * t.element_size() for t in (data, *scales) if t is not None) / weights


def compile_launch(args, kwargs, arch: int):
    """Compile `expert_gemm_kernel` for these launch arguments as the JIT would specialize them."""
    kernel = expert_kernels.expert_gemm_kernel
    signature, constexprs, attrs = {}, {}, {}
    runtime = [p for p in kernel.params if not p.is_constexpr]
    for index, (param, value) in enumerate(zip(runtime, args, strict=True)):
        kind, key = native_specialize_impl(CUDABackend, value, False, True, True)
        if kind == "constexpr":
            signature[param.name], constexprs[param.name] = "constexpr", value
        else:
            signature[param.name] = kind
            if key == "D":
                attrs[(index,)] = [["tt.divisibility", 16]]
    options = {"num_warps": kwargs.get("num_warps", 4), "num_stages": kwargs.get("num_stages", 3)}
    for param in kernel.params:
        if param.is_constexpr:
            signature[param.name], constexprs[param.name] = "constexpr", kwargs[param.name]
    source = ASTSource(fn=kernel, signature=signature, constexprs=constexprs, attrs=attrs)
    return triton.compile(source, target=GPUTarget("cuda", arch, 32), options=options)


def cubin_report(compiled) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as file:
        file.write(compiled.asm["cubin"])
    try:
        usage = subprocess.run([CUOBJDUMP, "-res-usage", file.name], capture_output=True, text=True).stdout
        sass = subprocess.run([CUOBJDUMP, "-sass", file.name], capture_output=True, text=True).stdout
    finally:
        os.unlink(file.name)
    registers, stack = (int(v) for v in re.search(r"REG:(\d+) STACK:(\d+)", usage).groups())
    loads = re.findall(r"\b(LDG(?:STS)?\.E[.\w]*)", sass)
    loop = hot_loop(sass)
    return {
        "registers": registers,
        "stack": stack,
        "shared": compiled.metadata.shared,
        "mma": dict(collections.Counter(MMA.findall(sass))),
        "wide_loads": sum(".128" in op for op in loads),
        "loads": len(loads),
        "loop": len(loop),
        "loop_mma_waits": sum(op.startswith("WARPGROUP.DEPBAR") for op in loop),
    }


def hot_loop(sass: str) -> list[str]:
    """The instructions of the largest loop in `sass` (a backward branch and what it jumps over): the K loop."""
    instructions = [(int(address, 16), text) for address, text in SASS_LINE.findall(sass)]
    index = {address: i for i, (address, _) in enumerate(instructions)}
    best: list[str] = []
    for i, (address, text) in enumerate(instructions):
        target = BACKWARD.search(text)
        if target and int(target.group(1), 16) < address and int(target.group(1), 16) in index:
            body = [op for _, op in instructions[index[int(target.group(1), 16)]:i + 1]]
            best = body if len(body) > len(best) else best
    return [re.sub(r"^@!?U?P\w+\s+", "", op) for op in best]  # without the predicate guard


def issue_figures(report: dict, kwargs: dict, bytes_per_weight: float, arch: int,
                  n: int | None = None) -> tuple[float, dict[str, float]]:  # fmt: skip
    """(warp instructions a weight in the K loop, {card: issue time / weight-read time}) of one launch; with its
    `n` output columns, counting the last column block's padding rows (unpacked like the others)."""
    weights = kwargs["BLOCK_N"] * kwargs["BLOCK_K"] * (2 if kwargs["GATED"] else 1)  # one K step of the tile
    per_weight = report["loop"] * kwargs.get("num_warps", 4) / weights
    if n is not None:
        per_weight *= -(-n // kwargs["BLOCK_N"]) * kwargs["BLOCK_N"] / n
    return per_weight, {name: (per_weight / (sms * 4 * clock)) / (bytes_per_weight / bandwidth)
                        for name, sms, clock, bandwidth in CARDS.get(arch, ())}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--archs", default="89,90,120", help="compute capabilities x10: 89 RTX 4090, 90 H100/H200, 120 RTX 5090")
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"subset of {','.join(VARIANTS)}")
    parser.add_argument("--tokens", default="256,1024", help="canvas tokens (1,024 = 4 candidates)")
    args = parser.parse_args()
    assert not fused_moe.interpreting(), "run without TRITON_INTERPRET: this compiles real kernels"
    print(f"triton {triton.__version__}, full shape {FULL}", flush=True)
    failures = 0
    for arch in (int(a) for a in args.archs.split(",")):
        for name in args.variants.split(","):
            asm = VARIANTS[name][2]
            for tokens in (int(t) for t in args.tokens.split(",")):
                with fused_moe.launch_settings(asm=asm):
                    launches = layer_launches(VARIANTS[name], tokens, arch, codes=name.endswith("-codes"))
                step = collections.defaultdict(float)  # (card, "experts" | "dense" | "read") -> seconds a step
                failed = 0  # launches of this step that did not build: its sum would leave them out
                for launch, grid, launch_args, kwargs, bytes_per_weight, unpacks in launches:
                    where = f"sm_{arch} {name:<13} {tokens:>4} tok {launch:<7}"
                    try:
                        report = cubin_report(compile_launch(launch_args, kwargs, arch))
                    except Exception as error:  # the report names every launch that does not build
                        failures += 1
                        failed += 1
                        print(f"{where} FAILED {type(error).__name__}: {str(error)[:300]}", flush=True)
                        continue
                    bad = report["stack"] > 0 or not report["mma"] or not report["loop"]
                    failures += bad
                    columns = launch_args[1].shape[1] // (2 if kwargs["GATED"] else 1)
                    per_weight, ratios = issue_figures(report, kwargs, bytes_per_weight, arch, columns)
                    issue = " ".join(f"{card} {ratio * unpacks:.2f}" for card, ratio in ratios.items())
                    weights = launch_args[1].numel() * (4 if launch_args[1].dtype == torch.int16 else 1)
                    for card, sms, clock, bandwidth in CARDS.get(arch, ()):
                        times = LAYERS_PER_STEP[launch]
                        part = "experts" if launch in ("gate_up", "down") else "dense"
                        step[card, part] += times * per_weight * unpacks * weights / (sms * 4 * clock)
                        step[card, "read"] += times * weights * bytes_per_weight / bandwidth
                    print(f"{where} regs {report['registers']:>3} spill {report['stack']:>3} B smem "
                          f"{report['shared']:>6} B grid {grid[0]:>5} BLOCK_M {kwargs['BLOCK_M']} BLOCK_N "
                          f"{kwargs['BLOCK_N']} swap {kwargs['SWAP']:d} mma {report['mma']} 16-byte loads "
                          f"{report['wide_loads']}/{report['loads']} loop {report['loop']} ({report['loop_mma_waits']} "
                          f"mma waits) {per_weight:.3f}/weight x {unpacks:.2f} unpacks issue/read {issue}"
                          f"{'  FAIL' if bad else ''}",
                          flush=True)  # fmt: skip
                for card, *_ in CARDS.get(arch, ()):
                    if failed:
                        print(f"sm_{arch} {name:<13} {tokens:>4} tok step's GEMMs ({card}): none, {failed} launches "
                              "did not build", flush=True)  # fmt: skip
                        continue
                    experts, dense, read = step[card, "experts"], step[card, "dense"], step[card, "read"]
                    print(f"sm_{arch} {name:<13} {tokens:>4} tok step's GEMMs ({card}): issue-bound "
                          f"{(experts + dense) * 1e3:.2f} ms (experts {experts * 1e3:.2f}, dense {dense * 1e3:.2f}), "
                          f"their weights read once {read * 1e3:.2f} ms", flush=True)  # fmt: skip
    print("compile: PASS" if not failures else f"compile: FAIL ({failures})", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
