"""`dgemma-lsp bench step`: the product's denoising step (CUDA graphs + fused kernels) per quantization mode.

For each mode builds google/diffusiongemma-26B-A4B-it's architecture with
seeded random bf16 weights on the GPU, quantizes it in place (the fused Triton
MoE and dequant-GEMMs run on CUDA), and drives `CompiledDenoiser` — the path
`--compile on` serves requests with — over a random 512-token prompt, 16
fixed steps of one 256-token canvas (no early stop), for 1, 2 and 4
candidates. Reports per mode and batch: ms per step (median of the host-seen
intervals between drafts) and its ratio to the weight-read floor, ms per
canvas (16 steps), first-draft ms (request start to the first draft,
prompt restore and tail encode included), and peak GPU memory while
denoising. A first run per batch captures the graphs and is not timed.
`--fused on,off` measures the step with the fused decoder kernels
(`fused_decoder`) and with transformers' decoder, one after the other on the
same weights: the A/B of the non-expert work.
Targets (issue 12, H100): int4 <= 7 ms/step, fp8 <= 10, canvas <= 120 ms
(vLLM FP8: 145.7), 4 candidates <= 1.5x one, int4 peak <= 18 GB.

`--scale tiny` runs the same code eagerly on CPU (the fused sampler in
Triton's interpreter) so it is not dead code without a GPU; its times mean
nothing. torch is imported inside functions.
"""

from __future__ import annotations

import statistics
import time

import msgspec

from .gpu import FULL, HBM_BYTES_PER_S, SCALES, VLLM_MS_PER_CANVAS, build_random, diffusion_config
from .quant_gpu import W4A8_MODES
from .report import say, write_report

MODES = ("int4", "fp8", "int8", "none")
SEED = 0
PROMPT_TOKENS = {"full": 512, "tiny": 32}
CANDIDATES = {"full": (1, 2, 4), "tiny": (1,)}
TARGET_STEP_MS = {"int4": 7.0, "fp8": 10.0}
TARGET_CANVAS_MS = 120.0
TARGET_INT4_PEAK_BYTES = 18 * 10**9


class StepFigure(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    mode: str
    fused: bool
    """The decoder's non-expert work in fused kernels (CompiledDenoiser's `fused`); False: transformers' decoder."""
    candidates: int
    steps: int
    ms_per_step: float
    floor_ms: float
    """Weight bytes one step reads / HBM_BYTES_PER_S."""
    floor_ratio: float
    ms_per_canvas: float
    """Sum of the step intervals of one canvas (prompt excluded, as vLLM's per-canvas latency)."""
    first_draft_ms: float
    peak_bytes: int | None
    """torch.cuda.max_memory_allocated while denoising (weights included); None on CPU."""
    weight_bytes: int


ATTENTION_LAYOUTS = ("folded", "repeated")
"""`--attention`: the fused decoder's `attention_settings(fold_groups=)`, on and off."""


class StepReport(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    scale: str
    device: str
    prompt_tokens: int
    canvas_length: int
    figures: list[StepFigure]
    targets: dict[str, float]
    vllm_ms_per_canvas: float
    activation_codes: bool = False
    """w8a8 / w4a8 GEMMs read activations rounded once in a launch of their own (`--activation-codes`)."""
    attention: str = "folded"
    """The fused decoder's attention: "folded" (each group's query heads as one sequence against each key/value
    head once, the default) or "repeated" (key/value heads repeated for every query head; `--attention`)."""


def _timed_request(denoiser, prompt: list[int], batch: int, steps: int, canvas: int):
    """One request; returns (first-draft ms, per-step ms list)."""
    stamps: list[float] = []
    started = time.perf_counter()
    denoiser.denoise(
        stable=prompt[:-16], tail=prompt[-16:], cache_key="bench", batch=batch, steps=steps,
        max_tokens=canvas, entropy_bound=0.1, t_min=0.4, t_max=0.8, confidence_threshold=None, seed=SEED,
        on_step=lambda step, ids: stamps.append(time.perf_counter()),
    )  # fmt: skip
    deltas = [(b - a) * 1000 for a, b in zip([started, *stamps], stamps, strict=False)]
    return deltas[0], deltas[1:]


def measure_mode(config, mode: str, scale: str, device, dtype, *, steps: int, repeats: int, log=None,
                 fused_settings: tuple[bool | None, ...] = (None,)):  # fmt: skip
    import torch

    from dgemma_lsp.engine.kernels.compiled_step import CompiledDenoiser

    from .quant_gpu import _free, _model_class, _step_read_bytes, _text_bytes, quantize_bench_mode

    torch.manual_seed(SEED)
    model = build_random(_model_class(), config, device, dtype)
    quantize_bench_mode(model, mode)
    _free(device)
    weight_bytes = _text_bytes(model)
    floor_ms = _step_read_bytes(model) / HBM_BYTES_PER_S * 1000
    vocab = config.text_config.vocab_size
    prompt = torch.randint(4, vocab - 4, (PROMPT_TOKENS[scale],), generator=torch.Generator().manual_seed(SEED))
    prompt = prompt.tolist()
    figures = []
    for fused in fused_settings:
        denoiser = CompiledDenoiser(model, capture=device.type == "cuda", eos_ids=set(), pad_id=0, fused=fused)
        for batch in CANDIDATES[scale]:
            _timed_request(denoiser, prompt, batch, steps, config.canvas_length)  # captures this batch's graph
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            runs = [_timed_request(denoiser, prompt, batch, steps, config.canvas_length) for _ in range(repeats)]
            # One step only: its interval includes the prompt work, the best there is.
            step_ms = statistics.median([ms for _, deltas in runs for ms in deltas] or [first for first, _ in runs])
            figures.append(StepFigure(
                mode=mode, fused=denoiser.fused is not None, candidates=batch, steps=steps, ms_per_step=step_ms,
                floor_ms=floor_ms,
                # the first draft's interval also holds the prompt work: the canvas counts one median step for it
                floor_ratio=step_ms / floor_ms, ms_per_canvas=statistics.median(sum(d) for _, d in runs) + step_ms,
                first_draft_ms=statistics.median(first for first, _ in runs),
                peak_bytes=int(torch.cuda.max_memory_allocated(device)) if device.type == "cuda" else None,
                weight_bytes=weight_bytes,
            ))  # fmt: skip
            if log:
                f = figures[-1]
                log(f"{mode} {'fused' if f.fused else 'unfused'} x{batch}: {f.ms_per_step:.2f} ms/step "
                    f"({f.floor_ratio:.2f}x floor), {f.ms_per_canvas:.1f} ms/canvas, first draft {f.first_draft_ms:.1f} ms")  # fmt: skip
        denoiser.clear()
        del denoiser
        _free(device)
    del model
    _free(device)
    return figures


def run_benchmark(scale: str, device_name: str, modes, *, steps: int, repeats: int, log=None,
                  fused_settings: tuple[bool | None, ...] = (None,), activation_codes: bool = False,
                  attention: str = "folded") -> StepReport:  # fmt: skip
    import os

    import torch

    device = torch.device(device_name)
    if device.type == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")  # the fused sampler, before its first import
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    config = diffusion_config(SCALES[scale])
    figures = []
    from dgemma_lsp.engine.kernels import fused_decoder, fused_moe  # after TRITON_INTERPRET is set

    assert attention in ATTENTION_LAYOUTS, attention
    with fused_moe.launch_settings(activation_codes=activation_codes), \
            fused_decoder.attention_settings(fold_groups=attention == "folded"):  # read when each graph is captured
        for mode in modes:
            figures += measure_mode(config, mode, scale, device, dtype, steps=steps, repeats=repeats, log=log,
                                    fused_settings=fused_settings)  # fmt: skip
    return StepReport(
        scale=scale, device=str(device), prompt_tokens=PROMPT_TOKENS[scale], canvas_length=config.canvas_length,
        figures=figures, vllm_ms_per_canvas=VLLM_MS_PER_CANVAS, activation_codes=activation_codes, attention=attention,
        targets={"int4MsPerStep": TARGET_STEP_MS["int4"], "fp8MsPerStep": TARGET_STEP_MS["fp8"],
                 "msPerCanvas": TARGET_CANVAS_MS, "fourCandidatesOverOne": 1.5,
                 "int4PeakBytes": TARGET_INT4_PEAK_BYTES},
    )  # fmt: skip


def format_table(report: StepReport) -> str:
    lines = [
        f"denoising step (CUDA graphs + fused kernels), {report.scale} scale on {report.device}, "
        f"prompt {report.prompt_tokens}, canvas {report.canvas_length}, vLLM FP8 {report.vllm_ms_per_canvas} ms/canvas"
        f"{', activations rounded once a GEMM' if report.activation_codes else ''}, attention {report.attention}",
        f"{'mode':<5} {'fused':>5} {'cand':>4} {'ms/step':>8} {'floor':>7} {'ratio':>6} {'ms/canvas':>9} {'1st draft':>9} {'peak':>9}",
    ]
    for f in report.figures:
        peak = "-" if f.peak_bytes is None else f"{f.peak_bytes / 1e9:.2f} GB"
        lines.append(f"{f.mode:<5} {'on' if f.fused else 'off':>5} {f.candidates:>4} {f.ms_per_step:>8.2f} {f.floor_ms:>7.2f} {f.floor_ratio:>6.2f} "
                     f"{f.ms_per_canvas:>9.1f} {f.first_draft_ms:>9.1f} {peak:>9}")  # fmt: skip
    return "\n".join(lines)


def add_arguments(parser) -> None:
    parser.add_argument("--scale", choices=sorted(SCALES), default="full",
                        help="full: the real architecture (needs CUDA); tiny: the same code on CPU")  # fmt: skip
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma-separated subset of {','.join(MODES)}, or "
                        "int4-w4a8 (int4 weights, int8 activations: bench-only)")  # fmt: skip
    parser.add_argument("--steps", type=int, default=16, help="fixed denoising steps per canvas")
    parser.add_argument("--repeats", type=int, default=3, help="timed requests per figure (median)")
    parser.add_argument("--activation-codes", action="store_true",
                        help="w8a8 / w4a8: round each GEMM's activations once in a launch of their own (A/B against "
                        "the default, which rounds them in every program's K loop)")  # fmt: skip
    parser.add_argument("--attention", choices=ATTENTION_LAYOUTS, default="folded",
                        help="the fused decoder's attention: each group's query heads folded against each key/value "
                        "head once (default), or the key/value heads repeated for every query head (A/B)")  # fmt: skip
    parser.add_argument("--fused", default="auto",
                        help="comma-separated from auto,on,off: the decoder's fused kernels; on,off measures both (A/B)")  # fmt: skip


def run(args) -> int:
    import torch

    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or any(m not in MODES and m not in W4A8_MODES for m in modes):
        say(f"dgemma-lsp bench step: --modes must be a subset of {','.join((*MODES, *W4A8_MODES))}, got {args.modes!r}")
        return 2
    settings = {"auto": None, "on": True, "off": False}
    fused = [f.strip() for f in getattr(args, "fused", "auto").split(",") if f.strip()]
    if not fused or any(f not in settings for f in fused):
        say(f"dgemma-lsp bench step: --fused takes auto, on and off, got {args.fused!r}")
        return 2
    device = getattr(args, "device", None) or ("cuda" if torch.cuda.is_available() else "cpu")
    if args.scale == FULL.name and not device.startswith("cuda"):
        say("dgemma-lsp bench step: the full-size model needs a CUDA GPU (`--scale tiny` runs the code on CPU)")
        return 2
    report = run_benchmark(args.scale, device, modes, steps=args.steps, repeats=args.repeats, log=say,
                           fused_settings=tuple(settings[f] for f in fused),
                           activation_codes=bool(getattr(args, "activation_codes", False)),
                           attention=getattr(args, "attention", "folded"))  # fmt: skip
    write_report(report, getattr(args, "json", False), format_table)
    return 0

