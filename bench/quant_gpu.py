"""`dgemma-lsp bench quant`: what each `--quantization` mode costs and saves.

For every mode (none, fp8, int8, int4) builds the DiffusionGemma architecture
with the same seeded random weights directly on the device (bf16 on CUDA),
quantizes it with `engine.quantization`, then measures: resident weight memory
(CUDA allocator after a free; on CPU the bytes of the text tensors), the
expert compression factor, the relative error of the decoder logits against
the unquantized model on one fixed prompt + canvas, and ms per denoising step
(one decoder forward over the prompt cache, batch 1) beside the weight-read
floor (bytes a step reads / HBM bandwidth) and beside bf16.

`--scale full` is google/diffusiongemma-26B-A4B-it's architecture
(engine/model/configs/, via bench/gpu.py) and needs CUDA; `--scale tiny` runs the
same code on the shrunk config on CPU (a test runs it so it is not dead
code). Random weights say nothing of quality: the error column compares
modes with each other, not with a real checkpoint. Tables and JSON go to
stdout, progress to stderr; torch is imported inside functions.
"""

from __future__ import annotations

import statistics
import time

import msgspec

from .gpu import FULL, HBM_BYTES_PER_S, SCALES, build_random, diffusion_config
from .report import say, write_report

W4A8_MODES = {"int4-w4a8": "int4"}
"""Bench-only modes: int4 weights meeting int8 activations in the MMA (`quantize_model(int4_activations="int8")`),
measured beside the product's modes until a GPU shows their agreement with bf16."""
INT4_BUDGET_BYTES = 18 * 10**9
"""Google's "fits in 18 GB quantized"; int4 must come in under it at full size."""
SEED = 0


class QuantFigure(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """One quantization mode, measured."""

    mode: str
    expert_bytes_before: int
    expert_bytes_after: int
    expert_factor: float
    linear_factor: float
    weight_bytes: int
    """Bytes of every text tensor (each tied tensor once) after quantization."""
    allocated_bytes: int | None
    """CUDA allocator after quantization and a free (None on CPU)."""
    quantize_s: float
    expert_weight_rel_error: float
    """||W_dequantized - W|| / ||W|| over layer 0's first experts: the rounding itself."""
    logits_rel_error: float | None
    """||logits - logits_none|| / ||logits_none||, decoder logits on a fixed input; None without a none run."""
    top1_agreement: float | None
    """Share of canvas positions whose argmax token matches the unquantized model's."""
    step_ms: float
    """Median ms per denoising step (decoder forward + head), batch 1."""
    floor_ms: float
    """Weight bytes one step reads / assumed HBM bandwidth (meaningful on a GPU only)."""


class QuantReport(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    scale: str
    device: str
    dtype: str
    group_size: int
    canvas_length: int
    prompt_tokens: int
    figures: list[QuantFigure]


def measure_mode(
    config, mode: str, *, device, dtype, group_size: int, prompt_tokens: int, steps: int, reference=None
) -> tuple[QuantFigure, object]:
    """Build, quantize and measure one mode; returns the figure and its logits (CPU) for later comparison."""
    import torch

    torch.manual_seed(SEED)
    model = build_random(_model_class(), config, device, dtype)
    sample = _expert_sample(model)
    started = time.perf_counter()
    report = quantize_bench_mode(model, mode, group_size=group_size)
    _sync(device)
    quantize_s = time.perf_counter() - started
    _free(device)
    allocated = int(torch.cuda.memory_allocated(device)) if device.type == "cuda" else None

    text = config.text_config
    generator = torch.Generator().manual_seed(SEED)
    prompt = torch.randint(4, text.vocab_size - 4, (1, prompt_tokens), generator=generator).to(device)
    canvas = torch.randint(4, text.vocab_size - 4, (1, config.canvas_length), generator=generator).to(device)
    with torch.no_grad():
        first = model(input_ids=prompt, decoder_input_ids=canvas)
        cache, logits = first.past_key_values, first.logits  # logits: [1, canvas, vocab]
        times = []
        for _ in range(steps + 1):  # the first step warms up kernels and is dropped
            _sync(device)
            began = time.perf_counter()
            step = model(past_key_values=cache, decoder_input_ids=canvas, self_conditioning_logits=logits)
            _sync(device)
            times.append((time.perf_counter() - began) * 1000)
        del step
    logits_cpu = logits.float().cpu()
    error = agreement = None
    if reference is not None:
        error = float((logits_cpu - reference).norm() / reference.norm())
        agreement = float((logits_cpu.argmax(-1) == reference.argmax(-1)).float().mean())
    figure = QuantFigure(
        mode=mode,
        expert_bytes_before=report.expert_bytes_before,
        expert_bytes_after=report.expert_bytes_after,
        expert_factor=report.expert_factor,
        linear_factor=report.linear_factor,
        weight_bytes=_text_bytes(model),
        allocated_bytes=allocated,
        quantize_s=quantize_s,
        expert_weight_rel_error=_expert_sample_error(model, sample),
        logits_rel_error=error,
        top1_agreement=agreement,
        step_ms=statistics.median(times[1:]),
        floor_ms=_step_read_bytes(model) / HBM_BYTES_PER_S * 1000,
    )
    del model, cache, logits, first
    _free(device)
    return figure, logits_cpu


def quantize_bench_mode(model, mode: str, *, group_size: int | None = None):
    """`quantize_model` for a `--quantization` mode or a bench-only one (`W4A8_MODES`)."""
    from dgemma_lsp.engine.weights.quantization import DEFAULT_GROUP_SIZE, quantize_model

    int4_activations = "int8" if mode in W4A8_MODES else "none"
    return quantize_model(model, W4A8_MODES.get(mode, mode), group_size=group_size or DEFAULT_GROUP_SIZE,
                          int4_activations=int4_activations)  # fmt: skip


def run_benchmark(
    scale_name: str,
    device_name: str,
    dtype_name: str,
    modes: list[str],
    *,
    group_size: int,
    prompt_tokens: int | None,
    steps: int,
    log=None,
) -> QuantReport:
    import torch

    scale = SCALES[scale_name]
    device = torch.device(device_name)
    dtype = getattr(torch, dtype_name)
    config = diffusion_config(scale)
    prompt_tokens = prompt_tokens or scale.prompts[0]
    figures, reference = [], None
    # "none" first: it is the reference the other modes' logits are compared with.
    for mode in sorted(modes, key=lambda m: m != "none"):
        figure, logits = measure_mode(
            config,
            mode,
            device=device,
            dtype=dtype,
            group_size=group_size,
            prompt_tokens=prompt_tokens,
            steps=steps,
            reference=reference,
        )
        if mode == "none":
            reference = logits
        figures.append(figure)
        if log:
            log(
                f"{mode}: {_gb(figure.weight_bytes)} weights, experts x{figure.expert_factor:.2f}, "
                f"{figure.step_ms:.1f} ms/step"
            )
    return QuantReport(
        scale=scale.name,
        device=str(device),
        dtype=dtype_name,
        group_size=group_size,
        canvas_length=config.canvas_length,
        prompt_tokens=prompt_tokens,
        figures=figures,
    )


def format_table(report: QuantReport) -> str:
    baseline = next((f.step_ms for f in report.figures if f.mode == "none"), None)
    lines = [
        f"quantization, {report.scale} scale on {report.device} ({report.dtype}), group {report.group_size}, "
        f"batch 1, canvas {report.canvas_length}, prompt {report.prompt_tokens}",
        f"{'mode':<5} {'weight rel.err':>14} {'logits rel.err':>14} {'top-1 agree':>11} {'experts before':>14} {'after':>10} "
        f"{'factor':>6} {'weights':>9} {'allocated':>9} {'ms/step':>8} {'floor ms':>8} {'vs none':>7}",
    ]
    for f in report.figures:
        error = "-" if f.logits_rel_error is None else f"{f.logits_rel_error:.4f}"
        agree = "-" if f.top1_agreement is None else f"{f.top1_agreement:.3f}"
        allocated = "-" if f.allocated_bytes is None else _gb(f.allocated_bytes)
        versus = "-" if not baseline else f"{f.step_ms / baseline:.2f}x"
        lines.append(
            f"{f.mode:<5} {f.expert_weight_rel_error:>14.4f} {error:>14} {agree:>11} {_gb(f.expert_bytes_before):>14} {_gb(f.expert_bytes_after):>10} "
            f"{f.expert_factor:>6.2f} {_gb(f.weight_bytes):>9} {allocated:>9} {f.step_ms:>8.1f} {f.floor_ms:>8.2f} "
            f"{versus:>7}"
        )
    int4 = next((f for f in report.figures if f.mode == "int4"), None)
    if int4 is not None and report.scale == FULL.name:
        resident = int4.allocated_bytes or int4.weight_bytes
        verdict = "fits" if resident <= INT4_BUDGET_BYTES else "does NOT fit"
        lines.append(f"int4 resident {_gb(resident)}: {verdict} in {_gb(INT4_BUDGET_BYTES)}")
    return "\n".join(lines)


def add_arguments(parser) -> None:
    # The CLI builds this parser on every start (`--stdio` and `engine serve` too): the
    # defaults come from the quantization module in run(), so parsing never imports torch.
    parser.add_argument(
        "--scale",
        choices=sorted(SCALES),
        default="full",
        help="full: the real architecture (needs CUDA); tiny: the same code on a shrunk config",
    )
    parser.add_argument("--modes", default=None, help="comma-separated subset of none,fp8,int8,int4 (default all), "
                        "or int4-w4a8 (int4 weights, int8 activations: not yet a --quantization mode)")  # fmt: skip
    parser.add_argument("--group-size", type=int, default=None, help="inputs per scale (default 128)")
    parser.add_argument("--prompt-tokens", type=int, default=None, help="prompt length in the cache")
    parser.add_argument("--steps", type=int, default=5, help="timed denoising steps per mode (median)")


def run(args) -> int:
    import torch

    from dgemma_lsp.engine.weights.quantization import DEFAULT_GROUP_SIZE, MODES

    modes = [m.strip() for m in (args.modes or ",".join(MODES)).split(",") if m.strip()]
    unknown = [m for m in modes if m not in MODES and m not in W4A8_MODES]
    if unknown or not modes:
        say(f"dgemma-lsp bench quant: unknown mode(s) {unknown}; choose from {', '.join((*MODES, *W4A8_MODES))}")
        return 2
    device = getattr(args, "device", None) or ("cuda" if torch.cuda.is_available() else "cpu")
    if args.scale == FULL.name and not device.startswith("cuda"):
        say(
            "dgemma-lsp bench quant: the full-size model needs a CUDA GPU and none is visible "
            "(`--scale tiny` runs the same code on CPU)"
        )
        return 2
    if device.startswith("cuda") and not torch.cuda.is_available():
        say("dgemma-lsp bench quant: CUDA was asked for but torch sees no GPU")
        return 2
    dtype = getattr(args, "dtype", None) or ("bfloat16" if device.startswith("cuda") else "float32")
    report = run_benchmark(
        args.scale,
        device,
        dtype,
        modes,
        group_size=args.group_size or DEFAULT_GROUP_SIZE,
        prompt_tokens=args.prompt_tokens,
        steps=args.steps,
        log=say,
    )
    write_report(report, getattr(args, "json", False), format_table)
    return 0


def _model_class():
    from transformers import DiffusionGemmaForBlockDiffusion

    return DiffusionGemmaForBlockDiffusion


SAMPLE_EXPERTS = 8


def _expert_sample(model):
    """A copy of layer 0's first experts (gate_up, down), to measure the rounding after quantization."""
    experts = model.model.decoder.layers[0].experts
    return experts.gate_up_proj[:SAMPLE_EXPERTS].detach().clone(), experts.down_proj[
        :SAMPLE_EXPERTS
    ].detach().clone()


def _expert_sample_error(model, sample) -> float:
    import torch

    experts = model.model.decoder.layers[0].experts
    if hasattr(experts, "expert_weights"):
        pairs = [experts.expert_weights(e, sample[0].dtype) for e in range(len(sample[0]))]
        now = torch.stack([g for g, _ in pairs]), torch.stack([d for _, d in pairs])
    else:
        now = experts.gate_up_proj[:SAMPLE_EXPERTS].detach(), experts.down_proj[:SAMPLE_EXPERTS].detach()
    squared_error = sum(float((a.float() - b.float()).norm() ** 2) for a, b in zip(now, sample, strict=True))
    squared_norm = sum(float(b.float().norm() ** 2) for b in sample)
    return (squared_error / squared_norm) ** 0.5


def _unique_tensors(module):
    seen = {}
    for tensor in list(module.parameters()) + list(module.buffers()):
        seen.setdefault(id(tensor), tensor)
    return seen.values()


def _text_bytes(model) -> int:
    """Every tensor except the vision tower's, each once."""
    vision = {id(t) for t in _unique_tensors(model.model.encoder.vision_tower)}
    return sum(t.numel() * t.element_size() for t in _unique_tensors(model) if id(t) not in vision)


def _step_read_bytes(model) -> int:
    """What one decoder step reads: the decoder's weights and the (tied) head, minus the embedding
    lookup, which reads a canvas' rows, not the table; a 256-token canvas routes to ~all experts."""
    import torch

    tensors = {id(t): t for t in _unique_tensors(model.model.decoder)}
    tensors.update({id(t): t for t in _unique_tensors(model.lm_head)})
    size = sum(t.numel() * t.element_size() for t in tensors.values())
    embed = model.model.decoder.embed_tokens.weight
    if model.lm_head.weight is not embed and isinstance(embed, torch.Tensor):
        size -= embed.numel() * embed.element_size()
    return size


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _free(device) -> None:
    import gc

    import torch

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _gb(size: int) -> str:
    return f"{size / 1e9:.2f} GB" if size >= 1e8 else f"{size / 1e6:.2f} MB"

