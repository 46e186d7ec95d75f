"""`dgemma-lsp bench moe`: one quantized MoE layer, fused kernels against the per-expert loop.

For each packed mode (int4, int8, fp8) builds one DiffusionGemma experts
module and its router (transformers' own classes, seeded random weights) at
the tiny model's size or, with `--shape full`, google/diffusiongemma-26B-A4B-it's
(128 experts, top-8, hidden 2816, expert width 704; needs CUDA), routes a
random canvas of `--tokens` x `--batch` tokens, and reports:

- opsPerLayer: torch operator calls (a TorchDispatchMode) plus Triton
  launches of one experts forward on the product path (the router is the
  same module on both paths and is left out of both counts);
- referenceOpsPerLayer: the same count for the per-expert torch loop;
- maxRelError: max|out - ref| / max|ref|, ref = that loop in fp32 on the
  same packed weights;
- ms and referenceMs: median wall time per forward on CUDA (null on CPU,
  where the kernels run in Triton's interpreter and a time would mean nothing).

On CPU the kernels run under TRITON_INTERPRET=1 (set here before they are
imported), so the op count and the error are real measurements there too.
Targets (issue 12): opsPerLayer <= 24, maxRelError <= 0.02. JSON with
`--json`, else a table; progress to stderr; torch is imported inside functions.
"""

from __future__ import annotations

import os
import statistics
import time

import msgspec

from .report import say, write_report

MODES = ("int4", "int8", "fp8")
TARGET_OPS = 24
TARGET_REL_ERROR = 0.02
SEED = 0
INIT_STD = 0.02
"""Gemma's initializer range: realistic magnitudes for the quantization error."""


class MoeFigure(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    backend: str
    """triton (compiled for the GPU), triton-interpreter (CPU) or torch (the loop: kernels not applicable)."""
    ops_per_layer: int
    triton_launches: int
    reference_ops_per_layer: int
    max_rel_error: float
    ms: float | None
    reference_ms: float | None


class MoeReport(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    shape: str
    device: str
    dtype: str
    tokens: int
    batch: int
    experts: int
    top_k: int
    hidden: int
    expert_width: int
    group_size: int
    modes: dict[str, MoeFigure]
    targets: dict[str, float]


def text_config_for(shape: str):
    from transformers import DiffusionGemmaTextConfig

    if shape == "full":
        from .gpu import FULL, diffusion_config

        return diffusion_config(FULL).text_config
    from dgemma_lsp.engine.model.tiny_model import TEXT_CONFIG

    return DiffusionGemmaTextConfig(**TEXT_CONFIG)


def _routed_inputs(text_config, tokens: int, device, dtype):
    """hidden `[T, H]` and the real router's top-k `[T, K]` for a random canvas."""
    import torch
    from transformers.models.diffusion_gemma.modeling_diffusion_gemma import DiffusionGemmaTextRouter

    with torch.device(device):
        router = DiffusionGemmaTextRouter(text_config).to(dtype)
    with torch.no_grad():
        router.proj.weight.normal_(0, INIT_STD)
        hidden = torch.randn(tokens, text_config.hidden_size, device=device, dtype=dtype)
        _, weights, index = router(hidden)
    return hidden, index.contiguous(), weights.contiguous()


def _random_experts(text_config, device, dtype):
    import torch
    from transformers.models.diffusion_gemma.modeling_diffusion_gemma import DiffusionGemmaTextExperts

    with torch.device(device):
        experts = DiffusionGemmaTextExperts(text_config).to(dtype)
    with torch.no_grad():
        experts.gate_up_proj.normal_(0, INIT_STD)
        experts.down_proj.normal_(0, INIT_STD)
    return experts


def count_ops(function) -> tuple[object, int, int]:
    """Run `function()`; return its result, torch operator calls and Triton launches inside it."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from dgemma_lsp.engine.kernels.fused_moe import count_launches

    class OpCounter(TorchDispatchMode):
        def __init__(self, launches) -> None:
            super().__init__()
            self.launches = launches
            self.ops = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            # The interpreter's own host copies during a launch are not the layer's operators.
            if not self.launches.inside:
                self.ops += 1
            return func(*args, **(kwargs or {}))

    with count_launches() as launches, OpCounter(launches) as counter:
        result = function()
    return result, counter.ops, launches.launches


def _median_ms(function, device, repeats: int) -> float | None:
    import torch

    if device.type != "cuda":
        return None
    function()  # warm-up: compiles the kernels for these shapes
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize(device)
        began = time.perf_counter()
        function()
        torch.cuda.synchronize(device)
        times.append((time.perf_counter() - began) * 1000)
    return statistics.median(times)


def measure_mode(experts, mode: str, inputs, *, group_size: int, repeats: int) -> MoeFigure:
    import torch

    from dgemma_lsp.engine.kernels import fused_moe
    from dgemma_lsp.engine.weights.quantization import QuantizedExperts

    hidden, index, weights = inputs
    quantized = QuantizedExperts.from_experts(experts, mode, group_size)
    if hidden.device.type == "cpu" and fused_moe.interpreting():
        quantized.backend = "triton"  # "auto" keeps the loop on CPU; here the interpreted kernels are the point
    with torch.no_grad():
        reference = quantized.forward_loop(hidden.float(), index, weights.float())  # fp32, same packed weights
        output, ops, launches = count_ops(lambda: quantized(hidden, index, weights))
        _, reference_ops, _ = count_ops(lambda: quantized.forward_loop(hidden, index, weights))
        error = float((output.float() - reference).abs().max() / reference.abs().max())
        ms = _median_ms(lambda: quantized(hidden, index, weights), hidden.device, repeats)
        reference_ms = _median_ms(lambda: quantized.forward_loop(hidden, index, weights), hidden.device, repeats)
    if launches == 0:
        backend = "torch"
    else:
        backend = "triton-interpreter" if fused_moe.interpreting() else "triton"
    return MoeFigure(
        backend=backend,
        ops_per_layer=ops + launches,
        triton_launches=launches,
        reference_ops_per_layer=reference_ops,
        max_rel_error=error,
        ms=ms,
        reference_ms=reference_ms,
    )


def run_benchmark(
    shape: str, device_name: str, *, tokens: int, batch: int, group_size: int, modes=MODES, repeats: int = 10, log=None
) -> MoeReport:
    import torch

    device = torch.device(device_name)
    if device.type == "cpu":
        # Before the first import of the kernels: their decorators read it.
        os.environ.setdefault("TRITON_INTERPRET", "1")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    text_config = text_config_for(shape)
    torch.manual_seed(SEED)
    experts = _random_experts(text_config, device, dtype)
    inputs = _routed_inputs(text_config, tokens * batch, device, dtype)
    figures = {}
    for mode in modes:
        figures[mode] = measure_mode(experts, mode, inputs, group_size=group_size, repeats=repeats)
        if log:
            f = figures[mode]
            log(f"{mode}: {f.backend}, {f.ops_per_layer} ops (loop {f.reference_ops_per_layer}), "
                f"max rel. error {f.max_rel_error:.2e}")  # fmt: skip
    return MoeReport(
        shape=shape,
        device=str(device),
        dtype=str(dtype).removeprefix("torch."),
        tokens=tokens,
        batch=batch,
        experts=text_config.num_experts,
        top_k=text_config.top_k_experts,
        hidden=text_config.hidden_size,
        expert_width=text_config.moe_intermediate_size,
        group_size=group_size,
        modes=figures,
        targets={"opsPerLayer": TARGET_OPS, "maxRelError": TARGET_REL_ERROR},
    )


def format_table(report: MoeReport) -> str:
    lines = [
        f"MoE layer, {report.shape} shape ({report.experts} experts, top-{report.top_k}, hidden {report.hidden}, "
        f"width {report.expert_width}) on {report.device} ({report.dtype}), {report.tokens} tokens x {report.batch}",
        f"{'mode':<5} {'backend':<18} {'ops':>4} {'loop ops':>8} {'max rel.err':>11} {'ms':>8} {'loop ms':>8}",
    ]
    for mode, f in report.modes.items():
        ms = "-" if f.ms is None else f"{f.ms:.3f}"
        loop_ms = "-" if f.reference_ms is None else f"{f.reference_ms:.3f}"
        lines.append(
            f"{mode:<5} {f.backend:<18} {f.ops_per_layer:>4} {f.reference_ops_per_layer:>8} "
            f"{f.max_rel_error:>11.2e} {ms:>8} {loop_ms:>8}"
        )
    lines.append(f"targets: ops <= {TARGET_OPS}, max rel. error <= {TARGET_REL_ERROR}")
    return "\n".join(lines)


def add_arguments(parser) -> None:
    parser.add_argument("--shape", choices=["tiny", "full"], default="tiny",
                        help="tiny: the --model tiny layer; full: the 26B-A4B layer (needs CUDA)")  # fmt: skip
    parser.add_argument("--tokens", type=int, default=256, help="canvas tokens per batch row")
    parser.add_argument("--batch", type=int, default=1, help="canvases (candidates) in the batch")
    parser.add_argument("--group-size", type=int, default=128, help="inputs per scale")
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma-separated subset of {','.join(MODES)}")
    parser.add_argument("--repeats", type=int, default=20, help="timed forwards per figure on CUDA (median)")


def run(args) -> int:
    import torch

    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or any(m not in MODES for m in modes):
        say(f"dgemma-lsp bench moe: --modes must be a subset of {','.join(MODES)}, got {args.modes!r}")
        return 2
    device = getattr(args, "device", None) or ("cuda" if torch.cuda.is_available() else "cpu")
    if args.shape == "full" and not device.startswith("cuda"):
        say("dgemma-lsp bench moe: --shape full needs a CUDA GPU (fp32 full-size experts exceed host memory "
             "budgets and the interpreter would take hours); use --shape tiny here")  # fmt: skip
        return 2
    report = run_benchmark(args.shape, device, tokens=args.tokens, batch=args.batch, group_size=args.group_size,
                           modes=modes, repeats=args.repeats, log=say)  # fmt: skip
    write_report(report, getattr(args, "json", False), format_table)
    return 0

