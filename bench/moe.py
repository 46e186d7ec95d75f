"""`dgemma-lsp bench moe`: one quantized MoE layer, each kernel variant against its references and its floor.

Builds one DiffusionGemma experts module and its router (transformers' own
classes, seeded random weights) at the tiny model's size or, with `--shape
full`, google/diffusiongemma-26B-A4B-it's (128 experts, top-8, hidden 2816,
expert width 704; needs CUDA), routes a random canvas of `--tokens` x
`--batch` tokens, and runs each variant of `VARIANTS` asked for:

- int4 (product: tile layout, magic-number unpack in inline PTX on CUDA),
  int4-bits (the same in Triton bit ops, what the interpreter runs),
  int4-affine32 (scale + min per 32 inputs: the path of imported Q4_K / AWQ
  weights), int4-legacy (the first-generation kernel on the old layout),
  int4-w4a8 (the int4 weights under int8 activations quantized per row in
  the kernels: the int8 MMA; opt-in, not what `QuantizedExperts` runs);
- gguf-q4_k_m: a GGUF Q4_K_M file's layer as the GGUF loader holds it
  (`gguf_experts`): gate_up affine int4 under Q4_K's two-level scales (uint8
  sc and m per 32 inputs, fp16 d and -dmin per 256), down int8 with an fp16
  scale per 32 (Q8_0's) and int8 activations;
- int8 / fp8 (product: w8a8, activations quantized per row in the kernels;
  fp8 falls back to w8a16 below sm_89), int8-w8a16 / fp8-w8a16 (bf16
  activations), int8-legacy / fp8-legacy;
- int8-codes / fp8-codes / int4-w4a8-codes: w8a8 / w4a8 with each GEMM's
  activations rounded once in a launch of their own (`activation_codes`,
  opt-in) instead of in every program's K loop: the same output;
- int4-n64: int4 with 64 weight rows a program, the A/B of the 128 the
  experts' int4 takes on sm_90 (elsewhere the same as int4);
- bf16: transformers' own experts on the unquantized weights (grouped_mm
  where torch has it), the speed anchor.

For each: opsPerLayer (torch operator calls, a TorchDispatchMode, plus Triton
launches; the router is left out), tritonLaunches, maxRelError and relError
against the fp32 per-expert loop on the *same* packed weights (with the
variant's activation rounding: the kernel's own correctness), errorVsBf16 =
||out - ref|| / ||ref|| against the fp32 loop on the unquantized weights
(what the format costs), ms (median of CUDA-graph replays: device time
without Python's launch overhead; null on CPU), eagerMs, and xFloor = ms /
floorMs, floorMs = weight + scale bytes of the routed experts over the
card's measured device-to-device copy rate (`copyTBs`).

`modes` holds each mode's product variant (what `QuantizedExperts` runs on
this device), with referenceOpsPerLayer = the per-expert torch loop's count.
On CPU the kernels run under TRITON_INTERPRET=1 (set here before they are
imported), so op counts and errors are real measurements there too; by
default only the product variants run there (`--variants all` for every one).
Targets (issue 12): opsPerLayer <= 24, maxRelError <= 0.02; issue 50: one
layer at 256 tokens int4 <= 0.25 ms, fp8 / int8 <= 0.30 ms on an H100/H200.
JSON with `--json`, else a table; progress to stderr; torch is imported inside functions.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import time
from pathlib import Path

import msgspec

from .report import say, write_report

MODES = ("int4", "int8", "fp8")
TARGET_OPS = 24
TARGET_REL_ERROR = 0.02
TARGET_MS = {"int4": 0.25, "int8": 0.30, "fp8": 0.30}
"""Issue 50, one layer at 256 tokens on an H100/H200."""
SEED = 0
INIT_STD = 0.02
"""Gemma's initializer range: realistic magnitudes for the quantization error."""


@dataclasses.dataclass(frozen=True)
class Variant:
    """One way to run the layer."""

    mode: str
    """Packed mode (int4, int8, fp8), or none for the bf16 anchor."""
    kernel: str = "tiles"
    """tiles (expert_kernels), legacy (moe_kernels.dequant_gemm_kernel) or transformers (bf16)."""
    activations: str = "none"
    """none, or the 8-bit kind the kernels round activations to (w8a8; int8 under int4 weights: w4a8)."""
    asm: bool | None = None
    """int4 unpack in inline PTX (None: the product's default, PTX on CUDA)."""
    affine_group: int | None = None
    """int4 with a min per this many inputs instead of symmetric codes."""
    gguf: str | None = None
    """A GGUF recipe's layout as the loader holds it (`gguf_experts`), instead of `QuantizedExperts.from_experts`'."""
    down_activations: str | None = None
    """The down launch's activations where they differ from gate_up's (None: `activations`)."""
    activation_codes: bool = False
    """w8a8 / w4a8 reading activations rounded once in a launch of their own (`launch_settings(activation_codes=)`)."""
    block_n: int | None = None
    """Weight rows a program (`launch_settings(block_n=)`; None: the heuristic's, 128 for int4 on sm_90)."""

    def activation_kinds(self) -> tuple[str, str]:
        """What the gate_up and the down launch round their activations to."""
        return self.activations, self.down_activations or self.activations


VARIANTS = {
    "int4": Variant("int4"),
    "int4-bits": Variant("int4", asm=False),
    "int4-n64": Variant("int4", block_n=64),  # the experts' 64 weight rows a program sm_90 took before 128
    "int4-affine32": Variant("int4", affine_group=32),
    "int4-legacy": Variant("int4", kernel="legacy"),
    "int4-w4a8": Variant("int4", activations="int8"),
    "int4-w4a8-codes": Variant("int4", activations="int8", activation_codes=True),
    "gguf-q4_k_m": Variant("int4", gguf="Q4_K_M", down_activations="int8"),
    "int8": Variant("int8", activations="int8"),
    "int8-codes": Variant("int8", activations="int8", activation_codes=True),
    "int8-w8a16": Variant("int8"),
    "int8-legacy": Variant("int8", kernel="legacy"),
    "fp8": Variant("fp8", activations="fp8"),
    "fp8-codes": Variant("fp8", activations="fp8", activation_codes=True),
    "fp8-w8a16": Variant("fp8"),
    "fp8-legacy": Variant("fp8", kernel="legacy"),
    "bf16": Variant("none", kernel="transformers"),
}


class MoeFigure(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    variant: str
    backend: str
    """triton (compiled for the GPU), triton-interpreter (CPU), torch (the loop: kernels not applicable), transformers."""
    ops_per_layer: int
    triton_launches: int
    reference_ops_per_layer: int | None
    """The per-expert torch loop's count (product figures only)."""
    max_rel_error: float
    """max|out - ref| / max|ref|, ref = the fp32 loop on the same packed weights."""
    rel_error: float
    """||out - ref|| / ||ref||, same ref."""
    error_vs_bf16: float
    """||out - ref|| / ||ref||, ref = the fp32 loop on the unquantized weights."""
    weight_bytes: int
    """Packed data + scales (+ mins, super scales) of the routed experts: what one forward must read."""
    floor_ms: float | None
    ms: float | None
    """Median device time of one forward (CUDA-graph replays); None on CPU."""
    x_floor: float | None
    eager_ms: float | None
    """Median wall time of one eager forward (Python launch overhead included); None on CPU."""


class MoeReport(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    shape: str
    device: str
    dtype: str
    tokens: int
    batch: int
    experts: int
    routed_experts: int
    top_k: int
    hidden: int
    expert_width: int
    group_size: int
    copy_tbs: float | None
    """Measured device-to-device copy rate (bytes read + written per second / 1e12); None on CPU."""
    modes: dict[str, MoeFigure]
    variants: dict[str, MoeFigure]
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

    # What a loaded model dispatches to (transformers' default): the bf16 anchor's speed; eager on CPU.
    text_config._experts_implementation = "grouped_mm" if torch.device(device).type == "cuda" else "eager"
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


def eager_ms(function, device, repeats: int) -> float | None:
    """Median wall time of `function()` with a sync each side; None off CUDA."""
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


def graph_ms(function, device, repeats: int, replays: int = 10) -> float | None:
    """Median device time of `function()` captured in a CUDA graph (events around `replays` replays,
    `repeats` times); the eager time where capture fails (said on stderr); None off CUDA."""
    import torch

    if device.type != "cuda":
        return None
    function()
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        function()  # warm-up on a side stream, as capture wants
    torch.cuda.current_stream(device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            function()
    except Exception as error:  # a path that cannot be captured is timed eagerly, and said so
        say(f"bench moe: capture failed ({type(error).__name__}: {str(error)[:160]}); eager time instead")
        return eager_ms(function, device, repeats)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    graph.replay()
    times = []
    for _ in range(repeats):
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / replays)
    return statistics.median(times)


def copy_tbs(device) -> float | None:
    """The card's device-to-device copy rate in TB/s (bytes read + written), median of 10; None off CUDA."""
    import torch

    if device.type != "cuda":
        return None
    source = torch.empty(1 << 29, dtype=torch.uint8, device=device).random_(0, 255)  # 512 MiB, not zeros
    target = torch.empty_like(source)
    target.copy_(source)
    ms = graph_ms(lambda: target.copy_(source), device, repeats=10, replays=5)
    return 2 * source.numel() / (ms / 1000) / 1e12


@dataclasses.dataclass
class _Packed:
    """One mode's packed experts: the product module and, built on first use, other layouts."""

    module: object  # QuantizedExperts
    legacy: tuple | None = None
    affine: dict | None = None
    gguf: object | None = None  # QuantizedExperts in the GGUF loader's layout (`gguf_experts`)


def _expert_loop(hidden, index, weights, expert_weights, activations=("none", "none"), groups=(0, 0)):
    """The experts forward in fp32, one expert at a time: `expert_weights(e)` -> fp32 (gate_up, down).

    Rounds where the kernels round: the intermediate to the activations' dtype (the gate_up launch
    stores it so), and with w8a8 each matmul's input (`activations`: gate_up's, down's) per row and per
    `groups` inputs.
    """
    import torch
    import torch.nn.functional as F

    from dgemma_lsp.engine.kernels.quant_formats import dequantize_activations, quantize_activations

    def rounded(rows, group, kind):
        if kind == "none":
            return rows
        return dequantize_activations(*quantize_activations(rows, group, kind))

    top_k = index.shape[1]
    stored = hidden.dtype
    hidden = hidden.float()
    output = torch.zeros_like(hidden)
    flat = index.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=int(flat.max()) + 1).tolist()
    start = 0
    for expert, count in enumerate(counts):
        if count == 0:
            continue
        pairs = order[start : start + count]
        start += count
        tokens = pairs // top_k
        gate_up, down = expert_weights(expert)
        gate, up = (rounded(hidden[tokens], groups[0], activations[0]) @ gate_up.T).chunk(2, dim=-1)
        inner = rounded((F.gelu(gate, approximate="tanh") * up).to(stored).float(), groups[1], activations[1])
        output.index_add_(0, tokens, (inner @ down.T) * weights.reshape(-1)[pairs, None].float())
    return output


def _variant_forward(name: str, variant: Variant, packed: _Packed | None, experts, group_size: int):
    """(forward(hidden, index, weights), fp32 expert weights per expert, weight bytes per expert, act. groups)."""
    import torch

    from dgemma_lsp.engine.kernels import fused_moe
    from dgemma_lsp.engine.kernels.quant_formats import dequantize, legacy_layout, quantize_int4_affine

    if variant.kernel == "transformers":
        per_expert = (experts.gate_up_proj[0].numel() + experts.down_proj[0].numel()) * experts.gate_up_proj.element_size()
        return (experts, lambda e: (experts.gate_up_proj[e].float(), experts.down_proj[e].float()), per_expert,
                (0, 0))  # fmt: skip
    module = packed.module
    mode = variant.mode
    if variant.gguf:
        if packed.gguf is None:
            packed.gguf = gguf_experts(experts, variant.gguf)
        module = packed.gguf
    tensors = {"gate_up_data": module.gate_up_data, "gate_up_scales": module.gate_up_scales,
               "down_data": module.down_data, "down_scales": module.down_scales}  # fmt: skip
    mins = {"gate_up_mins": module.gate_up_mins} if variant.gguf else {}  # Q4_K's; Q8_0's int8 down has none
    # Two-level scales and the down's own mode (the GGUF layout's): what QuantizedExperts.forward passes.
    layout = {"down_mode": module.down_mode, "gate_up_super": module._super("gate_up"),
              "down_super": module._super("down")} if variant.gguf else {}  # fmt: skip
    supers = [t for which in ("gate_up", "down") for t in (module._super(which) or ()) if t is not None]
    if variant.affine_group:
        if packed.affine is None:
            gate_up = [quantize_int4_affine(experts.gate_up_proj[e], variant.affine_group) for e in range(module.num_experts)]
            down = [quantize_int4_affine(experts.down_proj[e], variant.affine_group) for e in range(module.num_experts)]
            packed.affine = {
                "gate_up_data": torch.stack([t[0] for t in gate_up]), "gate_up_scales": torch.stack([t[1] for t in gate_up]),
                "gate_up_mins": torch.stack([t[2] for t in gate_up]), "down_data": torch.stack([t[0] for t in down]),
                "down_scales": torch.stack([t[1] for t in down]), "down_mins": torch.stack([t[2] for t in down]),
            }  # fmt: skip
        tensors = {k: v for k, v in packed.affine.items() if not k.endswith("_mins")}
        mins = {k: v for k, v in packed.affine.items() if k.endswith("_mins")}
    if variant.kernel == "legacy":
        if packed.legacy is None:
            packed.legacy = (legacy_layout(module.gate_up_data, module.gate_up_scales, mode),
                             legacy_layout(module.down_data, module.down_scales, mode))  # fmt: skip
        (gate_up_data, gate_up_scales), (down_data, down_scales) = packed.legacy

        def forward(hidden, index, weights):
            return fused_moe.fused_experts_legacy(hidden, index, weights, gate_up_data=gate_up_data,
                                                  gate_up_scales=gate_up_scales, down_data=down_data,
                                                  down_scales=down_scales, mode=mode)  # fmt: skip
    else:
        settings = {} if variant.asm is None else {"asm": variant.asm}
        if variant.activation_codes:
            settings["activation_codes"] = True
        if variant.block_n is not None:
            settings["block_n"] = variant.block_n

        gate_up_activations, down_activations = variant.activation_kinds()

        def forward(hidden, index, weights):
            with fused_moe.launch_settings(**settings):
                return fused_moe.fused_experts(hidden, index, weights, mode=mode, activations=gate_up_activations,
                                               down_activations=down_activations, **tensors, **mins, **layout)  # fmt: skip

    def expert_weights(e):
        if variant.gguf:  # the module's own dequantization: each projection in its mode, two-level scales
            return module.expert_weights(e, torch.float32)

        def weight(which):
            which_mins = mins.get(f"{which}_mins")
            return dequantize(tensors[f"{which}_data"][e], tensors[f"{which}_scales"][e], mode, torch.float32,
                              mins=None if which_mins is None else which_mins[e])  # fmt: skip

        return weight("gate_up"), weight("down")

    per_expert = sum(t[0].numel() * t.element_size() for t in (*tensors.values(), *mins.values(), *supers))
    groups = module.activation_groups() if variant.activation_kinds() != ("none", "none") else (0, 0)
    return forward, expert_weights, per_expert, groups


def gguf_experts(experts, recipe: str):
    """`experts`' weights as the GGUF loader holds a `recipe` file's experts module: a QuantizedExperts whose
    gate_up is Q4_K's exact form (affine int4, uint8 sc and m per 32 under fp16 d and -dmin per 256) and down
    Q8_0's (int8, an fp16 scale per 32), placed by the loader's own `_pack` (tile packing, group-major scales,
    the buffers' names and dtypes) from rows in `_exact_rows`' form (`gguf_rows`) instead of a file's blocks.

    Q4_K_M's `ffn_down_exps` is Q5_0 on most layers of the published file and Q8_0 on the `use_more_bits`
    ones (formats/gguf.py `recipe_types`); both load as this int8 layout, so the kernels' work is the same.
    """
    import gguf as gguf_py

    from dgemma_lsp.engine.weights.formats import gguf as loader
    from dgemma_lsp.engine.weights.quantization import QuantizedExperts

    assert recipe == "Q4_K_M", f"only Q4_K_M's layout is built here, not {recipe}"
    module = QuantizedExperts(mode="int4", down_mode="int8", num_experts=experts.num_experts, act_fn=experts.act_fn)
    for which, kind in (("gate_up", "Q4_K"), ("down", "Q8_0")):
        weight = getattr(experts, f"{which}_proj").detach()  # [E, N, K]
        rows = weight.reshape(-1, weight.shape[-1])  # [E * N, K], as the loader reads a GGUF tensor's rows
        qtype = int(gguf_py.GGMLQuantizationType[kind])
        tensor = loader.GgufTensor(Path(), f"blk.0.ffn_{which}_exps.weight", qtype, tuple(weight.shape), 0, 0)
        source = loader.RowSource(exact=lambda _, first, count, rows=rows, kind=kind: gguf_rows(
            rows[first : first + count], kind), values=None)  # fmt: skip  # exact rows only: values are never read
        mode, group = loader.packed_mode_of(qtype)
        loader._pack(module, which, tensor, mode, group, str(weight.device), source, exact=True)
    return module


def gguf_rows(values, kind: str) -> tuple:
    """Rows `[R, K]` quantized to GGUF `kind`, in the loader's exact form of it (formats/gguf.py `_exact_rows`),
    on `values`' device: Q4_K -> codes uint8 `[R, K]` (0..15), sc and m uint8 `[R, K / 32]`, d and -dmin fp16
    `[R, K / 256]`; Q8_0 -> codes int8 `[R, K]`, d fp16 `[R, K / 32]`.

    Q8_0 is gguf's own quantizer step for step (`gguf.quants.Q8_0`: d = absmax / 127, codes rounded half away
    from zero at x / d): the same codes and scales, bit for bit. Q4_K is llama.cpp's quantize_row_q4_K_ref
    from the sub-blocks' fit on (6-bit sc and m under fp16 d = largest scale / 63 and dmin = largest min / 63,
    codes from the rounded products), but fits each 32 by its min and max, without make_qkx2_quants' search
    over 21 scales: gguf 0.19 has no Q4_K quantizer, and the port of llama.cpp's in bench/format_writers.py
    (numpy, one core) takes about a second per full-size expert, two minutes a layer: more than a loan's
    `moe-check` stage. In torch on the card it takes well under a second, loses about what llama.cpp's does
    (tests/bench/test_bench_moe.py), and the layout, the bytes and the kernels' work are the product's.
    A row shorter than 256 inputs (the tiny shape's hidden, 64) is one short super-block.
    """
    import torch

    rows, k = values.shape
    x = values.float().reshape(rows, k // 32, 32)  # [R, G, 32]
    if kind == "Q8_0":
        d = x.abs().amax(-1, keepdim=True) / 127  # [R, G, 1]
        codes = _round_half_away(x * torch.where(d == 0, 0.0, 1 / d))
        return codes.to(torch.int8).reshape(rows, k), d.to(torch.float16).reshape(rows, -1)
    assert kind == "Q4_K", f"no exact form of {kind} here"
    size = min(256, k)  # inputs per super-block
    assert k % size == 0 and size % 32 == 0, f"Q4_K rows of {k} inputs do not tile super-blocks of {size}"
    x = x.reshape(rows, k // size, size // 32, 32)  # [R, S, 8, 32]
    low = x.amin(-1).clamp(max=0.0)  # [R, S, 8]: llama.cpp's min is never above 0
    scale, minimum = (x.amax(-1) - low) / 15, -low
    largest_scale, largest_min = scale.amax(-1, keepdim=True), minimum.amax(-1, keepdim=True)  # [R, S, 1]
    sc = _round_half_away(torch.where(largest_scale > 0, 63 / largest_scale, 0.0) * scale).clamp(max=63)
    m = _round_half_away(torch.where(largest_min > 0, 63 / largest_min, 0.0) * minimum).clamp(max=63)
    d, dmin = (largest_scale / 63).to(torch.float16), (largest_min / 63).to(torch.float16)
    step, offset = (d.float() * sc).unsqueeze(-1), (dmin.float() * m).unsqueeze(-1)  # [R, S, 8, 1]
    codes = torch.where(step > 0, _round_half_away((x + offset) / step), 0.0).clamp(0, 15)
    fields = (codes, sc, m)
    return (*(f.to(torch.uint8).reshape(rows, -1) for f in fields), d.reshape(rows, -1), (-dmin).reshape(rows, -1))


def _round_half_away(values):
    """Round half away from zero, as gguf's `np_roundf` (and C's roundf) computes it."""
    import torch

    magnitude = values.abs()
    whole = torch.floor(magnitude)
    return torch.sign(values) * (whole + torch.floor(2 * (magnitude - whole)))


def product_variant(mode: str, device) -> str:
    """The variant `QuantizedExperts` runs on `device` by default."""
    from dgemma_lsp.engine.kernels.fused_moe import w8a8_supported

    if mode == "int4":
        return "int4"
    return mode if w8a8_supported(device, mode) else f"{mode}-w8a16"


def measure_variant(name: str, packed: _Packed | None, experts, inputs, bf16_reference, *, group_size: int,
                    repeats: int, copy_rate: float | None, timed: bool = True) -> MoeFigure:  # fmt: skip
    """One variant's figure; `timed=False` leaves the times out (a correctness pass)."""
    import torch

    from dgemma_lsp.engine.kernels import fused_moe

    variant = VARIANTS[name]
    hidden, index, weights = inputs
    forward, expert_weights, per_expert_bytes, groups = _variant_forward(name, variant, packed, experts, group_size)
    routed = int(torch.unique(index).numel())
    weight_bytes = per_expert_bytes * routed
    with torch.no_grad():
        if variant.kernel == "transformers":
            reference = bf16_reference
        else:
            reference = _expert_loop(hidden, index, weights, expert_weights, variant.activation_kinds(), groups)
        output, ops, launches = count_ops(lambda: forward(hidden, index, weights))
        difference = output.float() - reference
        max_rel = float(difference.abs().max() / reference.abs().max())
        rel = float(difference.norm() / reference.norm())
        vs_bf16 = float((output.float() - bf16_reference).norm() / bf16_reference.norm())
        ms = graph_ms(lambda: forward(hidden, index, weights), hidden.device, repeats) if timed else None
        eager = eager_ms(lambda: forward(hidden, index, weights), hidden.device, repeats) if timed else None
    floor = weight_bytes / (copy_rate * 1e12) * 1000 if copy_rate else None
    if variant.kernel == "transformers":
        backend = "transformers"
    elif launches == 0:
        backend = "torch"
    else:
        backend = "triton-interpreter" if fused_moe.interpreting() else "triton"
    return MoeFigure(
        variant=name, backend=backend, ops_per_layer=ops + launches, triton_launches=launches,
        reference_ops_per_layer=None, max_rel_error=max_rel, rel_error=rel, error_vs_bf16=vs_bf16,
        weight_bytes=weight_bytes, floor_ms=floor, ms=ms, x_floor=ms / floor if ms and floor else None, eager_ms=eager,
    )  # fmt: skip


def variants_for(names: str, modes, device) -> list[str]:
    """`names`: all, product, default (all on CUDA, product on CPU) or a comma-separated list."""
    if names == "default":
        names = "all" if device.type == "cuda" else "product"
    if names == "product":
        return [product_variant(mode, device) for mode in modes]
    if names == "all":
        return [n for n, v in VARIANTS.items() if v.mode in modes or v.mode == "none"]
    chosen = [n.strip() for n in names.split(",") if n.strip()]
    unknown = [n for n in chosen if n not in VARIANTS]
    assert not unknown, f"unknown variants {unknown}; choose from {', '.join(VARIANTS)}"
    return chosen


def run_benchmark(
    shape: str, device_name: str, *, tokens: int, batch: int, group_size: int, modes=MODES, variants="default",
    repeats: int = 10, log=None,
) -> MoeReport:  # fmt: skip
    import torch

    device = torch.device(device_name)
    if device.type == "cpu":
        # Before the first import of the kernels: their decorators read it.
        os.environ.setdefault("TRITON_INTERPRET", "1")
    from dgemma_lsp.engine.weights.quantization import QuantizedExperts

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    text_config = text_config_for(shape)
    torch.manual_seed(SEED)
    experts = _random_experts(text_config, device, dtype)
    inputs = _routed_inputs(text_config, tokens * batch, device, dtype)
    hidden, index, weights = inputs
    rate = copy_tbs(device)
    if log and rate:
        log(f"device-to-device copy: {rate:.2f} TB/s")
    with torch.no_grad():
        bf16_reference = _expert_loop(hidden, index, weights,
                                      lambda e: (experts.gate_up_proj[e].float(), experts.down_proj[e].float()))  # fmt: skip
    names = variants_for(variants, modes, device)
    packed: dict[str, _Packed] = {}
    figures: dict[str, MoeFigure] = {}
    product: dict[str, MoeFigure] = {}
    for name in names:
        mode = VARIANTS[name].mode
        if mode != "none" and mode not in packed:
            module = QuantizedExperts.from_experts(experts, mode, group_size)
            module.backend = "triton"
            packed[mode] = _Packed(module)
        if not _runs_here(name, device):
            if log:
                log(f"{name}: skipped (not on {device}: inline PTX needs CUDA, fp8 MMA sm_89+)")
            continue
        figure = measure_variant(name, packed.get(mode), experts, inputs, bf16_reference, group_size=group_size,
                                 repeats=repeats, copy_rate=rate)  # fmt: skip
        if mode != "none" and name == product_variant(mode, device):
            module = packed[mode].module
            _, reference_ops, _ = count_ops(lambda m=module: m.forward_loop(hidden, index, weights))
            _, ops, launches = count_ops(lambda m=module: m(hidden, index, weights))  # the module's own path
            figure = msgspec.structs.replace(figure, reference_ops_per_layer=reference_ops,
                                             ops_per_layer=ops + launches, triton_launches=launches)  # fmt: skip
            product[mode] = figure
        figures[name] = figure
        if log:
            log(_figure_line(figure))
    return MoeReport(
        shape=shape,
        device=str(device),
        dtype=str(dtype).removeprefix("torch."),
        tokens=tokens,
        batch=batch,
        experts=text_config.num_experts,
        routed_experts=int(torch.unique(index).numel()),
        top_k=text_config.top_k_experts,
        hidden=text_config.hidden_size,
        expert_width=text_config.moe_intermediate_size,
        group_size=group_size,
        copy_tbs=rate,
        modes=product,
        variants=figures,
        targets={"opsPerLayer": TARGET_OPS, "maxRelError": TARGET_REL_ERROR,
                 **{f"{mode}Ms": TARGET_MS[mode] for mode in MODES}},  # fmt: skip
    )


def _runs_here(name: str, device) -> bool:
    """Inline PTX needs CUDA; fp8 weights need sm_89+ on CUDA (Triton's e4m3), fp8 MMA too."""
    import torch

    variant = VARIANTS[name]
    if variant.asm and device.type != "cuda":
        return False
    return variant.mode != "fp8" or device.type != "cuda" or torch.cuda.get_device_capability(device) >= (8, 9)


def _figure_line(f: MoeFigure) -> str:
    ms = "-" if f.ms is None else f"{f.ms:.3f} ms"
    floor = "" if f.x_floor is None else f" ({f.x_floor:.1f}x floor {f.floor_ms:.3f})"
    return (f"{f.variant}: {f.backend}, {f.ops_per_layer} ops, {f.triton_launches} launches, rel.err {f.rel_error:.1e} "
            f"(max {f.max_rel_error:.1e}), vs bf16 {f.error_vs_bf16:.2e}, {ms}{floor}")  # fmt: skip


def format_table(report: MoeReport) -> str:
    rate = "" if report.copy_tbs is None else f", copy {report.copy_tbs:.2f} TB/s"
    lines = [
        f"MoE layer, {report.shape} shape ({report.experts} experts, top-{report.top_k}, hidden {report.hidden}, "
        f"width {report.expert_width}) on {report.device} ({report.dtype}), {report.tokens} tokens x {report.batch}"
        f"{rate}",
        f"{'variant':<14} {'backend':<18} {'ops':>4} {'rel.err':>8} {'vs bf16':>8} {'ms':>7} {'x floor':>7} "
        f"{'floor':>6} {'eager':>7}",
    ]
    for name, f in report.variants.items():
        def num(value, digits=3):
            return "-" if value is None else f"{value:.{digits}f}"

        lines.append(f"{name:<14} {f.backend:<18} {f.ops_per_layer:>4} {f.rel_error:>8.1e} {f.error_vs_bf16:>8.2e} "
                     f"{num(f.ms):>7} {num(f.x_floor, 1):>7} {num(f.floor_ms):>6} {num(f.eager_ms):>7}")  # fmt: skip
    lines.append(f"targets: ops <= {TARGET_OPS}, max rel. error <= {TARGET_REL_ERROR}; at 256 tokens on an H100/H200 "
                 f"int4 <= {TARGET_MS['int4']} ms, fp8/int8 <= {TARGET_MS['fp8']} ms")  # fmt: skip
    return "\n".join(lines)


def add_arguments(parser) -> None:
    parser.add_argument("--shape", choices=["tiny", "full"], default="tiny",
                        help="tiny: the --model tiny layer; full: the 26B-A4B layer (needs CUDA)")  # fmt: skip
    parser.add_argument("--tokens", type=int, default=256, help="canvas tokens per batch row")
    parser.add_argument("--batch", type=int, default=1, help="canvases (candidates) in the batch")
    parser.add_argument("--group-size", type=int, default=128, help="inputs per scale")
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma-separated subset of {','.join(MODES)}")
    parser.add_argument("--variants", default="default",
                        help=f"all, product, default (all on CUDA, product on CPU) or a list of {','.join(VARIANTS)}")  # fmt: skip
    parser.add_argument("--repeats", type=int, default=20, help="timed repeats per figure on CUDA (median)")


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
    try:
        variants_for(args.variants, modes, torch.device(device))
    except AssertionError as error:
        say(f"dgemma-lsp bench moe: {error}")
        return 2
    report = run_benchmark(args.shape, device, tokens=args.tokens, batch=args.batch, group_size=args.group_size,
                           modes=modes, variants=args.variants, repeats=args.repeats, log=say)  # fmt: skip
    write_report(report, getattr(args, "json", False), format_table)
    return 0
