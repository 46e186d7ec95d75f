"""`dgemma-lsp bench gpu`: speed of the full-size DiffusionGemma architecture on a GPU.

Builds google/diffusiongemma-26B-A4B-it's architecture (engine/model/configs/, which
says which values are assumed) with random bf16 weights created directly on
the GPU (speed does not depend on weight values), then measures at batch 1:
ms per denoising step, ms per 256-token canvas at 16 fixed steps with early
stop off, tokens/s and peak memory for 512- and 4,096-token prompts, then 2
and 4 candidates per batch. In the same run the autoregressive baseline (the
Gemma 4 26B-A4B text model, random weights) decodes 256 tokens at batch 1.
Both run eagerly and on the optimized path (static cache + torch.compile /
CUDA graphs), and the report sets them beside the anchors: vLLM's 145.7 ms per
canvas (H100, FP8) and the weight-read floor per step.

`--scale tiny` runs the same code on a shrunk config on any device (CPU in
the tests), so none of it is dead code without a GPU. Uses transformers
directly, not the engine: this measures the model, not our pipeline. torch is
imported inside functions: the CLI imports this module on every start.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from pathlib import Path
from typing import Any

import msgspec

from dgemma_lsp.engine.model.architecture import AUTOREGRESSIVE_CONFIG, DIFFUSION_CONFIG

from .report import say, write_report

VLLM_MS_PER_CANVAS = 145.7
"""vLLM, one H100, batch 1, FP8, 4,096 input tokens, 16 fixed steps, no early stop."""
HBM_BYTES_PER_S = 3.0e12
"""Measured H100 memory bandwidth: every step of a 256-token canvas reads ~all weights."""
NO_EARLY_STOP = 1e-9
"""confidence_threshold that a real model never meets (0.0 crashes, None means 0.005)."""


class Scale(msgspec.Struct, frozen=True, kw_only=True):
    """What one run measures: the model size and the workload."""

    name: str
    text_overrides: dict[str, Any]
    """Replaces fields of both text configs; empty for the full size."""
    vision_overrides: dict[str, Any]
    canvas_length: int
    prompts: tuple[int, ...]
    steps: int
    candidates: tuple[int, ...]
    """Batch sizes after batch 1 (B candidates of the same prompt)."""
    autoregressive_tokens: int
    repeats: int
    """Timed runs per figure (the median is reported), after one warm-up run."""


FULL = Scale(
    name="full",
    text_overrides={},
    vision_overrides={},
    canvas_length=256,
    prompts=(512, 4096),
    steps=16,
    candidates=(2, 4),
    autoregressive_tokens=256,
    repeats=3,
)

TINY = Scale(
    name="tiny",
    # Same structure (5:1 sliding/full, MoE + shared MLP, softcap), a 2,000th of the size;
    # the longer prompt exceeds the sliding window, as 4,096 does for the full model. Expert width 64:
    # int4's tiles take K in whole 64-input blocks (the real 704 is 11), so the tiny experts run the same
    # fused kernels as the real ones (at 32 they fell back to the torch loop, whose bincount syncs).
    text_overrides={
        "vocab_size": 1024, "hidden_size": 64, "intermediate_size": 64, "num_hidden_layers": 6,
        "num_attention_heads": 2, "num_key_value_heads": 1, "num_global_key_value_heads": 1,
        "head_dim": 32, "global_head_dim": 32, "sliding_window": 64, "max_position_embeddings": 4096,
        "num_experts": 8, "top_k_experts": 2, "moe_intermediate_size": 64,
    },
    vision_overrides={
        "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 1,
        "num_key_value_heads": 1, "head_dim": 16, "position_embedding_size": 16, "patch_size": 4,
    },
    canvas_length=32,
    prompts=(32, 160),
    steps=4,
    candidates=(2,),
    autoregressive_tokens=16,
    repeats=1,
)

SCALES = {scale.name: scale for scale in (FULL, TINY)}


# -- report -------------------------------------------------------------------------------------


class DiffusionFigure(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """One DiffusionGemma measurement: one canvas for one prompt length and batch size."""

    mode: str
    """eager, or compiled (static cache + torch.compile, CUDA graphs on a GPU)."""
    prompt_tokens: int
    candidates: int
    """Canvases in the batch."""
    steps: int
    """Denoising steps per canvas (fixed: early stop off)."""
    ms_per_step: float
    """Median decoder step (timed between drafts)."""
    prefill_ms: float
    """Encoding the prompt: time to the first draft minus one step."""
    ms_per_canvas: float
    """Whole generate call for one canvas, prompt encoding included (no draft streaming)."""
    tokens_per_s: float
    """candidates * canvas_length / ms_per_canvas."""
    peak_memory_bytes: int | None
    """torch.cuda.max_memory_allocated during the call (None off CUDA)."""


class AutoregressiveFigure(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """The Gemma 4 26B-A4B baseline decoding a fixed number of tokens at batch 1."""

    mode: str
    prompt_tokens: int
    new_tokens: int
    total_ms: float
    """Whole generate call, prompt prefill included."""
    ms_per_token: float
    """Median time between decoded tokens (prefill excluded)."""
    tokens_per_s: float
    """new_tokens / total_ms."""
    peak_memory_bytes: int | None


class GpuReport(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    scale: str
    device: str
    dtype: str
    torch_version: str
    transformers_version: str
    attention: str
    experts: str
    canvas_length: int
    diffusion_parameters: int
    """Parameters of the diffusion model's text stack (the vision tower is not run)."""
    weight_bytes: int
    """Bytes of those parameters: what one step reads when the canvas routes to every expert."""
    floor_ms_per_step: float
    """weight_bytes at 3.0 TB/s (the H100 anchor); meaningful on a GPU only."""
    diffusion: list[DiffusionFigure]
    autoregressive: list[AutoregressiveFigure]
    speedup_vs_autoregressive: dict[str, float]
    """Per mode: diffusion tokens/s (batch 1, shortest prompt) / autoregressive tokens/s."""
    vllm_ms_per_canvas: float = VLLM_MS_PER_CANVAS


# -- configs ------------------------------------------------------------------------------------


def _read_config(path: Path) -> dict[str, Any]:
    data = json.loads(path.read_text())
    data.pop("_provenance", None)
    data.pop("model_type", None)
    return data


def diffusion_config(scale: Scale):
    from transformers import DiffusionGemmaConfig

    data = _read_config(DIFFUSION_CONFIG)
    data["text_config"].update(scale.text_overrides)
    data["vision_config"].update(scale.vision_overrides)
    data["canvas_length"] = scale.canvas_length
    vocab = data["text_config"]["vocab_size"]
    if vocab < data["image_token_id"]:
        # Special image ids must lie inside a shrunk vocabulary.
        data.update(image_token_id=vocab - 1, boi_token_id=vocab - 2, eoi_token_id=vocab - 3)
    return DiffusionGemmaConfig(**data)


def autoregressive_config(scale: Scale):
    from transformers import Gemma4TextConfig

    data = _read_config(AUTOREGRESSIVE_CONFIG)
    data.update(scale.text_overrides)
    return Gemma4TextConfig(**data)


def build_random(model_class, config, device, dtype):
    """Random weights allocated and initialised on `device` directly: no 52 GB trip through host memory.

    The model is first built on the meta device. Built on the GPU, the decoder allocates its own copy of
    every layer before tying them to the encoder's: the full model's peak was ~100 GB, past an H100's 80.
    `initialize_weights` then draws every weight and recomputes the rotary tables, but leaves the layers'
    `layer_scalar` buffers (constant ones, set only in the constructor) as `to_empty` left them.
    """
    import torch

    with torch.device("meta"):
        model = model_class._from_config(config, dtype=dtype)
    _materialize(model, device)
    with torch.no_grad():
        model.initialize_weights()
        for name, buffer in model.named_buffers():
            if name.rsplit(".", 1)[-1] == "layer_scalar":
                buffer.fill_(1.0)
    return model.eval()


def _materialize(model, device) -> None:
    """`Module.to_empty`, but a tensor shared by several modules (the decoder's tied weights) is allocated once:
    to_empty gives every module its own copy, which both unties the weights and doubles the full model."""
    import torch

    made: dict[int, torch.Tensor] = {}
    for module in model.modules():
        for table in (module._parameters, module._buffers):
            for name, tensor in table.items():
                if tensor is None:
                    continue
                if id(tensor) not in made:
                    empty = torch.empty_like(tensor, device=device)
                    made[id(tensor)] = (
                        torch.nn.Parameter(empty, requires_grad=tensor.requires_grad)
                        if isinstance(tensor, torch.nn.Parameter) else empty
                    )  # fmt: skip
                table[name] = made[id(tensor)]


# -- timing -------------------------------------------------------------------------------------


class _Clock:
    """Wall clock that waits for the device first, so queued GPU work is counted."""

    def __init__(self, device) -> None:
        import torch

        self._sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def now(self) -> float:
        self._sync()
        return time.perf_counter()


class _StepTimes:
    """Streamer that stamps every denoising draft (put_draft) or every decoded token (put)."""

    def __init__(self, clock: _Clock) -> None:
        self.clock = clock
        self.drafts: list[float] = []
        self.tokens: list[float] = []

    def put_draft(self, value=None, **_):
        self.drafts.append(self.clock.now())

    def put(self, value):
        self.tokens.append(self.clock.now())

    def end(self):
        pass


def _deltas_ms(stamps: list[float]) -> list[float]:
    return [(b - a) * 1000 for a, b in zip(stamps, stamps[1:], strict=False)]


class _Memory:
    def __init__(self, device) -> None:
        import torch

        self._cuda = torch.cuda if device.type == "cuda" else None

    def reset(self) -> None:
        if self._cuda:
            self._cuda.reset_peak_memory_stats()

    def peak(self) -> int | None:
        return int(self._cuda.max_memory_allocated()) if self._cuda else None


def _random_prompt(vocab_size: int, tokens: int, batch: int, device):
    import torch

    generator = torch.Generator().manual_seed(tokens)
    # Ids above 3 stay clear of pad/eos/bos; any text is as expensive as any other.
    row = torch.randint(4, vocab_size - 4, (1, tokens), generator=generator)
    return row.expand(batch, tokens).contiguous().to(device)


def measure_diffusion(model, scale: Scale, prompt_tokens: int, batch: int, mode: str, cache=None) -> DiffusionFigure:
    """One canvas at fixed steps: timed once without a streamer (ms/canvas) and once with one (ms/step)."""
    import torch

    device = model.device
    clock, memory = _Clock(device), _Memory(device)
    input_ids = _random_prompt(model.config.text_config.vocab_size, prompt_tokens, batch, device)
    kwargs = dict(
        max_new_tokens=scale.canvas_length,
        max_denoising_steps=scale.steps,
        confidence_threshold=NO_EARLY_STOP,
    )

    def generate(streamer=None):
        with torch.inference_mode():
            if cache is not None:
                cache.reset()
            return model.generate(input_ids, streamer=streamer, past_key_values=cache, **kwargs)

    generate()  # warm-up (and compilation on the compiled path; CUDA graphs record on a second call)
    if mode == "compiled":
        generate()
    canvas_ms, step_ms, prefill_ms = [], [], []
    memory.reset()
    for _ in range(scale.repeats):
        started = clock.now()
        generate()
        canvas_ms.append((clock.now() - started) * 1000)
        stamps = _StepTimes(clock)
        started = clock.now()
        generate(stamps)
        steps = _deltas_ms(stamps.drafts)
        assert len(stamps.drafts) == scale.steps, f"early stop was not off: {len(stamps.drafts)} of {scale.steps} steps"
        step = statistics.median(steps) if steps else (stamps.drafts[0] - started) * 1000
        step_ms.append(step)
        prefill_ms.append(max(0.0, (stamps.drafts[0] - started) * 1000 - step))
    per_canvas = statistics.median(canvas_ms)
    return DiffusionFigure(
        mode=mode,
        prompt_tokens=prompt_tokens,
        candidates=batch,
        steps=scale.steps,
        ms_per_step=round(statistics.median(step_ms), 3),
        prefill_ms=round(statistics.median(prefill_ms), 3),
        ms_per_canvas=round(per_canvas, 3),
        tokens_per_s=round(batch * scale.canvas_length / per_canvas * 1000, 1),
        peak_memory_bytes=memory.peak(),
    )


def measure_autoregressive(model, scale: Scale, prompt_tokens: int, mode: str) -> AutoregressiveFigure:
    import torch

    device = model.device
    clock, memory = _Clock(device), _Memory(device)
    input_ids = _random_prompt(model.config.vocab_size, prompt_tokens, 1, device)
    new_tokens = scale.autoregressive_tokens
    # min_new_tokens keeps a random model from stopping at an early EOS.
    kwargs = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)
    if mode == "compiled":
        from transformers import CompileConfig

        # With a static cache transformers compiles the forward (CUDA graphs via "reduce-overhead");
        # off CUDA it would silently skip compiling, which the flag below overrides so that the CPU
        # run of `--scale tiny` takes the same path.
        compile_config = CompileConfig()
        compile_config._compile_all_devices = True
        kwargs.update(cache_implementation="static", compile_config=compile_config)

    def generate(streamer=None):
        with torch.inference_mode():
            return model.generate(input_ids, streamer=streamer, **kwargs)

    generate()
    if mode == "compiled":
        generate()
        if not hasattr(model, "_compiled_call"):  # name the path honestly rather than call it compiled
            mode = "static-cache (not compiled)"
    totals, per_token = [], []
    memory.reset()
    for _ in range(scale.repeats):
        started = clock.now()
        output = generate()
        totals.append((clock.now() - started) * 1000)
        assert output.shape[1] == prompt_tokens + new_tokens, "the baseline stopped early"
        stamps = _StepTimes(clock)
        generate(stamps)
        # tokens[0] is the prompt, tokens[1] the first decoded token (after prefill).
        per_token.append(statistics.median(_deltas_ms(stamps.tokens[1:])) if len(stamps.tokens) > 2 else math.nan)
    total = statistics.median(totals)
    return AutoregressiveFigure(
        mode=mode,
        prompt_tokens=prompt_tokens,
        new_tokens=new_tokens,
        total_ms=round(total, 3),
        ms_per_token=round(statistics.median(per_token), 3),
        tokens_per_s=round(new_tokens / total * 1000, 1),
        peak_memory_bytes=memory.peak(),
    )


# -- the run ------------------------------------------------------------------------------------


def _text_parameters(model) -> tuple[int, int]:
    count = size = 0
    for name, parameter in model.named_parameters():
        if "vision" in name:
            continue
        count += parameter.numel()
        size += parameter.numel() * parameter.element_size()
    return count, size


def _free(device) -> None:
    import gc

    import torch

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


MODELS = ("diffusion", "autoregressive")


def run_benchmark(scale: Scale, device_name: str, dtype_name: str, *, compiled: bool = True, eager: bool = True,
                  models=MODELS, log=None) -> GpuReport:
    """Everything in the module docstring, in order; `log` gets one line per figure as it lands.

    `models` picks the diffusion model, the autoregressive baseline or both: a lent GPU's minutes are
    few, and each full-size model costs a build and, on the compiled path, a compilation."""
    import torch
    import transformers

    log = log or (lambda line: None)
    device, dtype = torch.device(device_name), getattr(torch, dtype_name)
    modes = (("eager",) if eager else ()) + (("compiled",) if compiled else ())
    diffusion: list[DiffusionFigure] = []
    autoregressive: list[AutoregressiveFigure] = []
    parameters = weight_bytes = 0
    attention = experts = "not measured"
    if "diffusion" in models:
        parameters, weight_bytes, attention, experts = _measure_diffusion_model(scale, device, dtype, modes,
                                                                                diffusion, log)
    if "autoregressive" in models:
        _measure_autoregressive_model(scale, device, dtype, modes, autoregressive, log)

    speedup = {}
    for ar in autoregressive:
        same = [d for d in diffusion if d.mode == ar.mode and d.candidates == 1 and d.prompt_tokens == ar.prompt_tokens]
        if same:
            speedup[ar.mode] = round(same[0].tokens_per_s / ar.tokens_per_s, 2)
    return GpuReport(
        scale=scale.name,
        device=torch.cuda.get_device_name(device) if device.type == "cuda" else str(device),
        dtype=dtype_name,
        torch_version=str(torch.__version__),  # TorchVersion (a str subclass) msgspec will not encode
        transformers_version=transformers.__version__,
        attention=attention,
        experts=experts,
        canvas_length=scale.canvas_length,
        diffusion_parameters=parameters,
        weight_bytes=weight_bytes,
        floor_ms_per_step=round(weight_bytes / HBM_BYTES_PER_S * 1000, 2),
        diffusion=diffusion,
        autoregressive=autoregressive,
        speedup_vs_autoregressive=speedup,
    )


def _measure_diffusion_model(scale: Scale, device, dtype, modes, figures: list, log) -> tuple[int, int, str, str]:
    """Every diffusion figure into `figures`; returns the text parameters, their bytes, attention and experts."""
    from transformers import DiffusionGemmaForBlockDiffusion, StaticCache

    model = build_random(DiffusionGemmaForBlockDiffusion, diffusion_config(scale), device, dtype)
    parameters, weight_bytes = _text_parameters(model)
    log(f"diffusion model: {_count(parameters)} text parameters, {weight_bytes / 1e9:.2f} GB on {device}")
    attention = str(model.config.text_config._attn_implementation)
    experts = str(getattr(model.config.text_config, "_experts_implementation", None))
    for mode in modes:
        cache = None
        for batch in (1, *scale.candidates):
            if mode == "compiled":
                # One cache sized for the longest prompt: compiled graphs are reused across prompt lengths
                # (a new one per batch size).
                cache = StaticCache(
                    config=model.config.get_text_config(decoder=True),
                    max_cache_len=max(scale.prompts) + scale.canvas_length,
                )
            for prompt in scale.prompts:
                figure = measure_diffusion(model, scale, prompt, batch, mode, cache)
                figures.append(figure)
                log(_describe(figure))
        del cache
    del model
    _free(device)
    return parameters, weight_bytes, attention, experts


def _measure_autoregressive_model(scale: Scale, device, dtype, modes, figures: list, log) -> None:
    from transformers import Gemma4ForCausalLM

    model = build_random(Gemma4ForCausalLM, autoregressive_config(scale), device, dtype)
    for mode in modes:
        figure = measure_autoregressive(model, scale, min(scale.prompts), mode)
        figures.append(figure)
        log(_describe(figure))
    del model
    _free(device)


def _describe(figure) -> str:
    if isinstance(figure, DiffusionFigure):
        return (
            f"diffusion {figure.mode:8} prompt {figure.prompt_tokens:5} x{figure.candidates}: "
            f"{figure.ms_per_step:8.2f} ms/step {figure.ms_per_canvas:9.1f} ms/canvas "
            f"{figure.tokens_per_s:8.1f} tok/s"
        )
    return (
        f"autoregressive {figure.mode:8} prompt {figure.prompt_tokens:5}: {figure.ms_per_token:8.2f} ms/token "
        f"{figure.total_ms:9.1f} ms/{figure.new_tokens} tokens {figure.tokens_per_s:8.1f} tok/s"
    )


def _count(parameters: int) -> str:
    return f"{parameters / 1e9:.2f}B" if parameters >= 1e9 else f"{parameters / 1e6:.2f}M"


def format_table(report: GpuReport) -> str:
    """The report as the lines `bench gpu` prints (anchors included)."""
    lines = [
        f"{report.scale} architecture on {report.device} ({report.dtype}, attention {report.attention}, "
        f"experts {report.experts}); {_count(report.diffusion_parameters)} text parameters",
        *(_describe(figure) for figure in report.diffusion),
        *(_describe(figure) for figure in report.autoregressive),
        *(f"speed-up over autoregressive ({mode}): {ratio:.2f}x" for mode, ratio in report.speedup_vs_autoregressive.items()),
        f"anchors: vLLM {report.vllm_ms_per_canvas} ms/canvas (H100, FP8, 4,096-token prompt); "
        f"weight-read floor {report.floor_ms_per_step} ms/step at 3.0 TB/s",
    ]
    return "\n".join(lines)


# -- command line -------------------------------------------------------------------------------


def add_arguments(parser) -> None:
    parser.add_argument("--scale", choices=sorted(SCALES), default="full",
                        help="full: the real architecture (needs CUDA); tiny: the same code on a shrunk config")
    parser.add_argument("--no-compile", dest="compiled", action="store_false",
                        help="skip the static-cache + torch.compile path")
    parser.add_argument("--no-eager", dest="eager", action="store_false",
                        help="skip the eager path (with --only autoregressive: the compiled baseline alone)")
    parser.add_argument("--only", choices=MODELS, help="measure one model (default: both)")
    parser.add_argument("--candidates", type=lambda text: tuple(int(n) for n in text.split(",") if n),
                        help="batch sizes after batch 1, comma-separated ('' for batch 1 only; default 2,4)")


def run(args) -> int:
    import torch

    scale = SCALES[args.scale]
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if scale is FULL and not device.startswith("cuda"):
        say("dgemma-lsp bench gpu: needs a CUDA GPU and none is visible "
             "(`--scale tiny` runs the same code on CPU)")
        return 2
    if device.startswith("cuda") and not torch.cuda.is_available():
        say("dgemma-lsp bench gpu: CUDA was asked for but torch sees no GPU")
        return 2
    dtype = args.dtype or ("bfloat16" if device.startswith("cuda") else "float32")
    if args.candidates is not None:
        scale = msgspec.structs.replace(scale, candidates=args.candidates)
    models = (args.only,) if args.only else MODELS
    report = run_benchmark(scale, device, dtype, compiled=args.compiled, eager=args.eager, models=models, log=say)
    write_report(report, getattr(args, "json", False), format_table)
    return 0


