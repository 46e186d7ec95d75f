"""`dgemma-lsp bench dryrun`: the product's CUDA path at full size on virtual GPUs, without a GPU.

For each virtual GPU (`GPUS`: compute capability, memory, bandwidth) and each
`--quantization` mode the loader accepts on it (its own fit rule, memory_plan),
this runs the code a completion runs on CUDA, on fake CUDA tensors
(`torch._subclasses.fake_tensor.FakeTensorMode`: shapes, dtypes and devices,
no data, no driver):
- the model as the loader builds it: the text-only skeleton on the meta device,
  filled by the streaming loader's own placement code (`streaming.SkeletonFiller`)
  from fake checkpoint tensors of the real shapes, packed in the mode;
- a request through the compiled path (`compiled_step.CompiledDenoiser`, the
  step function called eagerly, as it runs while being captured): the prompt
  cache's snapshot of the stable part, its restore into the live static cache,
  the tail encoded, then denoising steps with the fused sampler and the draft
  copied out after each, for 512- and 4,096-token prompts and 1 and 4 candidates.

A `TorchDispatchMode` watches every operator: device mismatches (FakeTensor
raises them), host syncs (a device value read on the host, a device-to-host
copy, an operator whose output shape depends on device data), operators and
custom-kernel launches (`dgemma::*` ops, one Triton launch each) per step, the
device kernels a step launches (`kernels_launched`: views, allocations and metadata
launch none), the bytes of live fake CUDA storages (peak against the card), the weight and
cache bytes one step reads (the bandwidth floor), and the matrix products' FLOPs a step does by operand
kind (`matmul_flops`: the compute floor at the card's tensor-core rate). `torch.cuda.get_device_capability`
gets each virtual GPU's answer; nothing else of the CUDA runtime is touched
(patching `is_available` reaches the real runtime and aborts the process).

What a fake run cannot see: kernel workspaces (cuBLAS, attention), the CUDA
context and allocator fragmentation (hence the 1 GB the targets keep free),
Triton compile errors, numerics and time. Needs the CUDA build of torch
(`make dryrun` installs it in `.venv-cuda`): the CPU build cannot make fake
CUDA tensors. torch is imported inside functions: the CLI imports this module
on every start.
"""

from __future__ import annotations

import collections
import contextlib
import gc
import os
import sys
import time
import traceback
from collections.abc import Iterator

import msgspec

from .quant_gpu import W4A8_MODES
from .report import say, write_report

GIB = 1024**3
VLLM_MS_PER_STEP = 9.1
"""vLLM, one H100, batch 1, FP8, 4,096-token prompt: 145.7 ms per 256-token canvas of 16 steps."""
SPARE_BYTES = GIB
"""Left free on every card beyond the peak: CUDA context, kernel workspaces, fragmentation."""
INT4_4090_TARGET_BYTES = 18 * 10**9
"""The issue's target for int4 on an RTX 4090 at 4 candidates and a 4,096-token prompt."""
PROMPTS = (512, 4096)
CANDIDATES = (1, 4)
STEPS = 2
"""Steps per canvas: the second is the steady state (self-conditioning on); more would repeat it."""
TAIL_TOKENS = 16
"""Prompt ids after the stable part: encoded per request, as a keystroke's tail is."""
MODES = ("int4", "fp8", "int8", "none")
KERNEL_OPS_LISTED = 40
LAYOUTS = {"int4-g32": ("int4", 32), "int8-g32": ("int8", 32), "fp8-g16": ("fp8", 16), "int4-w4a8": ("int4", 128),
           "fp8-codes": ("fp8", 128), "int8-codes": ("int8", 128), "int4-w4a8-codes": ("int4", 128)}
"""Uniform layouts the community's pre-quantized checkpoints become (engine/weights/formats/), every projection
in one mode: int4-g32, symmetric int4 in groups of 32, what GGUF's other 4-bit types (Q4_0, IQ4_*) are re-packed
into; int8-g32, GGUF Q8_0's (int8 per 32, its fp16 scales as bf16's bytes); fp8-g16, NVFP4's (FP8-dynamic's one
scale per row runs the fp8 path's own K step). int4-w4a8 is int4 whose modules take int8 activations
(`int4_activations`, bench-only so far). The `-codes` modes are fp8, int8 and int4-w4a8 with each GEMM's
activations rounded once in a launch of their own (`launch_settings(activation_codes=True)`, opt-in). A GGUF
Q4_K_M is none of these: see GGUF_LAYOUTS. Not in the default run; `--modes int4-g32,...` asks for them."""
CODES_SUFFIX = "-codes"
GGUF_LAYOUTS = {"gguf-q4_k_m": "Q4_K_M"}
"""Dry-run mode -> the GGUF recipe it loads exactly as formats/gguf.py places that recipe's file: its tensors'
types by llama-quantize's rules (`gguf.architecture_tensors`), the loader's per-projection plan (`gguf.plan`:
Q4_K gate_up and linears as affine int4 with two-level scales, uint8 sc and m per 32 under fp16 d and -dmin per
256; Q5_0 / Q8_0 / Q6_K down and linears as int8 with the file's block scales; an experts module's `down_mode`),
its planned bytes (`gguf.planned_bytes`), and `gguf.stream_load` itself fed fake rows (`gguf.empty_rows`).
Not in the default run."""


def mode_and_group(mode: str) -> tuple[str, int]:
    """(packed mode, requested group) of a dry-run mode name: a MODES entry in groups of 128, or a LAYOUTS one."""
    return LAYOUTS.get(mode, (mode, 128))


def _gguf_plan(skeleton, recipe: str):
    """(tensors, names, plan) of a `recipe` GGUF of `skeleton`'s architecture, as the loader plans a found file
    (formats.sizes with --quantization none)."""
    from dgemma_lsp.engine.weights.formats import gguf

    layers = skeleton.config.text_config.num_hidden_layers
    tensors, names = gguf.architecture_tensors(skeleton, layers, recipe)
    return tensors, names, gguf.plan(tensors, names, skeleton, "none")


class VirtualGpu(msgspec.Struct, frozen=True, rename="camel"):
    name: str
    capability: tuple[int, int]
    memory_bytes: int
    bandwidth_bytes_per_s: float
    tensor_flops_per_s: dict[str, float]
    """Dense tensor-core rate by operand kind (`matmul_flops`), with fp32 accumulation (int32 for int8)."""


GPUS = (
    # Ada and GeForce Blackwell data sheets: fp32-accumulate rates are half the fp16-accumulate ones.
    VirtualGpu("RTX 4090", (8, 9), 24 * GIB, 1.0e12, {"bf16": 165.2e12, "fp8": 330.3e12, "int8": 660.6e12}),
    VirtualGpu("RTX 5090", (12, 0), 32 * GIB, 1.8e12, {"bf16": 209.5e12, "fp8": 419.0e12, "int8": 838.0e12}),
    VirtualGpu("H100", (9, 0), 80 * GIB, 3.35e12, {"bf16": 989.4e12, "fp8": 1978.9e12, "int8": 1978.9e12}),
)


class RunFigure(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """One request on one virtual GPU in one mode."""

    gpu: str
    mode: str
    prompt_tokens: int
    candidates: int
    steps: int
    device_mismatches: int
    """Operators that mixed CPU and CUDA tensors (FakeTensorDeviceMismatchError)."""
    host_syncs_per_step: int
    """Inside one denoising step (the function a CUDA graph captures): must be 0."""
    host_syncs_per_canvas: int
    """The whole request (prompt cache, tail, one canvas of `steps` steps, drafts copied out)."""
    sync_sites: dict[str, int]
    """Where the request's host syncs happen: 'file:line op' -> count."""
    ops_per_step: int
    """Operators dispatched in one step (the last one)."""
    custom_kernel_launches_per_step: int
    """dgemma::* operators (one Triton launch each) in that step."""
    device_kernels_per_step: int
    """Kernels that step launches on the card (`kernels_launched`: views, allocations, metadata: none)."""
    device_kernels_by_op: dict[str, int]
    """The step's kernels per operator, the most first (the top KERNEL_OPS_LISTED)."""
    vocab_sized_allocations_per_step: int
    """New `[..., V]` tensors of at least a [B, L, V] bf16 logits' bytes in that step (they dominate activations)."""
    peak_bytes: int
    """Most bytes of live fake CUDA storages during the request, weights included."""
    peak_site: str
    """The line whose operator reached the peak."""
    resident_bytes: int
    """Bytes of the loaded model (weights and buffers) on the card."""
    card_bytes: int
    within_card: bool
    """peak_bytes <= card_bytes - SPARE_BYTES."""
    weight_bytes_per_step: int
    """Bytes of the model's weights the step's operators read (embedding lookups: the rows only)."""
    cache_bytes_per_step: int
    """Bytes of the static KV cache the step's operators read."""
    floor_ms_per_step: float
    """weight_bytes_per_step at the card's bandwidth."""
    floor_with_cache_ms_per_step: float
    attention_buffer_bytes_per_step: int = 0
    """Bytes of the key/value buffers the fused step builds for SDPA (`attention_inputs`' keys and values: the
    cache's rows, each head repeated for its group's queries, then the canvas's), written and then read by SDPA
    once each: twice these move a step, beside the cache read (0 where transformers' decoder runs)."""
    matmul_flops_per_step: dict[str, int] = {}
    """The step's matrix-product FLOPs (2 a multiply-add) by operand kind (`matmul_flops`)."""
    matmul_flops_by_op: dict[str, int] = {}
    """The same by operator; our GEMM's launches split into the experts' (routed) and the dense projections'."""
    compute_floor_ms_per_step: float = 0.0
    """matmul_flops_per_step at the card's tensor-core rates: a step takes at least the larger of this and
    floor_with_cache_ms_per_step."""
    error: str | None = None
    """The exception that stopped the request, if one did."""


class DryRunReport(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    torch_version: str
    transformers_version: str
    gpus: list[VirtualGpu]
    modes_offered: dict[str, list[str]]
    """Per virtual GPU: the modes the loader's fit rule accepts on a card with nothing else on it."""
    planned_bytes: dict[str, int]
    """Per mode: resident bytes the loader plans from the checkpoint's shapes."""
    runs: list[RunFigure]
    vllm_ms_per_step: float
    targets: dict[str, float]
    failures: list[str]
    """Runs that would fail on a real card (`failures()`), one line each; empty when everything holds."""
    targets_missed: list[str]
    """Product targets missed (`targets_missed()`)."""
    cpu_seconds: float
    wall_seconds: float


# -- watching operators --------------------------------------------------------------------------


def _site() -> str:
    """The innermost frame of our code or transformers' that led here."""
    frame = sys._getframe(1)
    while frame is not None:
        path = frame.f_code.co_filename
        if "/torch/" not in path and not path.endswith("dryrun.py") and "/contextlib.py" not in path:
            return f"{_short(path)}:{frame.f_lineno}"
        frame = frame.f_back
    return "?"


def _short(path: str) -> str:
    """transformers/..., engine/... or bench/... rather than a whole path."""
    if "/site-packages/" in path:
        return path.split("/site-packages/", 1)[1]
    for marker in ("/engine/", "/bench/"):
        if marker in path:
            return marker[1:] + path.split(marker, 1)[1]
    return path


class _StepFigures(msgspec.Struct):
    vocab_sized: int = 0
    ops: int = 0
    launches: int = 0
    kernels: int = 0
    kernels_by_op: dict[str, int] = msgspec.field(default_factory=dict)
    syncs: int = 0
    weight_bytes: int = 0
    cache_bytes: int = 0
    attention_buffer_bytes: int = 0
    flops: dict[str, int] = msgspec.field(default_factory=dict)
    flops_by_op: dict[str, int] = msgspec.field(default_factory=dict)

    def add_flops(self, kind: str, flops: int, op: str) -> None:
        self.flops[kind] = self.flops.get(kind, 0) + flops
        self.flops_by_op[op] = self.flops_by_op.get(op, 0) + flops


# Kernels per operator on CUDA, read in ATen's CUDA implementations (torch 2.13), for the operators a
# step dispatches whose count is not one. Everything else that reaches the dispatcher launches one.
_MULTI_KERNEL_OPS = {
    # sort over a row of <= 4,096 (the canvas): copy of the keys, an iota of the indices, one
    # in-register bitonic sort (sortKeyValueInplace); longer rows take CUB's segmented radix sort (more).
    "sort": 3,
    # radix select (gatherTopK), then a sort of the k results when sorted=True and k > 1.
    "topk": 2,
}
"""Operator name (the overload packet's) -> kernels it launches."""

_NO_KERNEL_OPS = frozenset({
    # allocations: the caching allocator hands out memory, no kernel runs
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "empty_permuted",
    # metadata and aliasing that FakeTensor / the dispatcher see as operators but never touch data
    "_unsafe_view", "_reshape_alias", "lift_fresh", "set_", "resize_", "is_same_size", "sym_size",
    "sym_stride", "sym_numel", "sym_storage_offset", "_has_compatible_shallow_copy_type",
    "record_stream", "_local_scalar_dense",  # a host read (a sync, counted as one): a memcpy, not a kernel
})
_NO_KERNEL_NAMESPACES = frozenset({"prim"})
"""`prim::device`, `prim::layout`...: a tensor's metadata asked through the dispatcher."""


def kernels_launched(func, args) -> int:
    """Device kernels one dispatched operator launches on CUDA (0, 1 or a few), by operator class.

    - 0: views (`OpOverload.is_view`: view, transpose, slice, expand, unsqueeze, t, permute, as_strided,
      detach, alias...) and the view-like `_unsafe_view`; `prim::*` metadata (`prim::device`); allocations (`empty*`, `new_empty*`: the
      caching allocator, no kernel); metadata (`sym_size`, `set_`...); a host read of a device scalar
      (`_local_scalar_dense`: a device-to-host memcpy, counted among the syncs, never inside a step);
      a `copy_` of a tensor onto itself; any operator on CPU tensors only.
    - a few: `_MULTI_KERNEL_OPS` (sort, topk), from ATen's CUDA implementations.
    - 1: everything else, including `dgemma::*` custom ops (one Triton launch each), GEMMs (cuBLAS may
      add a split-K reduction: still counted 1), casts (`_to_copy`), `copy_`, fills (`zeros`,
      `fill_`, `zero_`), `arange`, random draws and host-to-device copies (a memcpy node in a graph).
    SDPA is answered above the dispatcher (`_make_function_mode`) as the one fused kernel it runs.
    This is a count, not a timing: a profile on a GPU (bench/device/profile_step.py) lists the kernels
    that actually ran, to check it against.
    """
    import torch

    name = func._overloadpacket.__name__
    if func.is_view or name in _NO_KERNEL_OPS or func.namespace in _NO_KERNEL_NAMESPACES:
        return 0
    if name == "copy_" and args[0] is args[1]:
        return 0
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    if func.namespace != "dgemma" and tensors and all(t.device.type == "cpu" for t in tensors):
        return 0
    return _MULTI_KERNEL_OPS.get(name, 1)


def matmul_flops(func, args, kwargs) -> tuple[str, int, str]:
    """(operand kind, FLOPs, what) of a matrix-product operator, 2 a multiply-add; ("", 0, "") for anything else.

    aten's mm / addmm / bmm / baddbmm (bf16: the self-conditioning GEMM, lm_head, the dense projections where
    transformers runs them) and `_grouped_mm` (transformers' experts, every row a (token, expert) pair), and our `dgemma::*` GEMMs: `expert_gemm` / `expert_gemm_add` / `expert_gemm_codes` (routed rows are
    (token, expert) pairs, so the padding of the experts' row blocks is not counted; gated launches compute gate
    and up; "int8" / "fp8" when the activations are quantized into the MMA, else "bf16") and `route` (the
    router's projection). Attention is counted where SDPA is answered (`_make_function_mode`).
    """
    name = func._overloadpacket.__name__
    if func.namespace == "aten" and name in ("mm", "bmm", "addmm", "baddbmm"):
        a, b = args[-2:] if name in ("addmm", "baddbmm") else args[:2]
        return "bf16", 2 * a.numel() * b.shape[-1], f"aten::{name}"  # [.., M, K] x [.., K, N]
    if func.namespace == "aten" and name == "_grouped_mm":  # transformers' experts: rows [P, K] x [E, K, N] by offsets
        return "bf16", 2 * args[0].numel() * args[1].shape[-1], "experts (aten::_grouped_mm)"
    if func.namespace != "dgemma" or name not in ("expert_gemm", "expert_gemm_add", "expert_gemm_codes", "route"):
        return "", 0, ""
    bound = dict(zip((argument.name for argument in func._schema.arguments), args, strict=False))  # then kwargs
    bound.update(kwargs)
    if name == "route":
        x, proj = bound["x"], bound["proj_weight"]
        return "bf16", 2 * x.shape[0] * x.shape[1] * proj.shape[0], "dgemma::route"
    kind = "bf16" if bound["activations"] == "none" else bound["activations"]
    gated = bound.get("gated") or name == "expert_gemm_codes"  # that one is always the gated gate_up
    flops = 2 * bound["num_rows"] * bound["n"] * bound["a"].shape[1] * (2 if gated else 1)
    return kind, flops, "experts (dgemma::expert_gemm)" if bound["sorted_pairs"] is not None else "dense (dgemma::expert_gemm)"


def _make_watcher():
    import torch
    from torch._subclasses.fake_tensor import DynamicOutputShapeException, FakeTensorDeviceMismatchError
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    aten = torch.ops.aten
    scalar_read = aten._local_scalar_dense.default

    class Watcher(TorchDispatchMode):
        """Counts what the module docstring lists; sits above FakeTensorMode (entered after it)."""

        def __init__(self) -> None:
            super().__init__()
            self.live: dict[int, int] = {}  # id(storage) -> bytes, CUDA storages only
            self.live_bytes = 0
            self.peak_bytes = 0
            self.peak_site = ""
            self.recording = False  # where the peak happens: only during requests (a frame walk per new peak)
            self.mismatches = 0
            self.vocab_sized_bytes = 1 << 62  # a [B, L, V] bf16 tensor's bytes, set per request
            self.vocab = 0  # V: a "logits-sized" tensor also ends in the vocabulary
            self.fused_attention = 0  # SDPA calls accounted as a fused kernel (see _make_function_mode)
            self.syncs: collections.Counter[str] = collections.Counter()
            self.step: _StepFigures | None = None
            self.weights: dict[int, int] = {}  # id(storage) -> bytes of the model's tensors
            self.cache: dict[int, int] = {}  # id(storage) -> bytes of the live KV cache
            self._seen: set[int] = set()  # storages already counted in this step
            self._rows: collections.Counter[int] = collections.Counter()  # embedding rows gathered per storage

        # -- phases --
        def reset_peak(self) -> None:
            self.peak_bytes = self.live_bytes
            self.peak_site = ""
            self.recording = True

        @contextlib.contextmanager
        def in_step(self) -> Iterator[_StepFigures]:
            self.step, self._seen, self._rows = _StepFigures(), set(), collections.Counter()
            try:
                yield self.step
            finally:
                # Rows an embedding gathered, unless the step read the whole table anyway (tied lm_head).
                self.step.weight_bytes += sum(size for key, size in self._rows.items() if key not in self._seen)
                self.step = None

        # -- accounting --
        def _track(self, tensor) -> None:
            if tensor.device.type != "cuda":
                return
            storage = tensor.untyped_storage()
            key = id(storage)
            if key in self.live:
                return
            size = storage.nbytes()
            if self.step is not None and size >= self.vocab_sized_bytes and tensor.shape[-1:] == (self.vocab,):
                self.step.vocab_sized += 1
            self.live[key] = size
            self.live_bytes += size
            if self.live_bytes > self.peak_bytes:
                self.peak_bytes = self.live_bytes
                if self.recording:
                    self.peak_site = _site()
            import weakref

            weakref.finalize(storage, self._free, key)

        def _free(self, key: int) -> None:
            self.live_bytes -= self.live.pop(key, 0)

        def _sync(self, what: str) -> None:
            self.syncs[f"{_site()} {what}"] += 1
            if self.step is not None:
                self.step.syncs += 1

        def _reads(self, func, args) -> None:
            if func is aten.embedding.default:
                weight, indices = args[0], args[1]
                self._rows[id(weight.untyped_storage())] += indices.numel() * weight.shape[-1] * weight.element_size()
                return
            for arg in tree_flatten(args)[0]:
                if isinstance(arg, torch.Tensor):
                    key = id(arg.untyped_storage())
                    if key in self._seen:
                        continue
                    if key in self.weights:
                        self._seen.add(key)
                        self.step.weight_bytes += self.weights[key]
                    elif key in self.cache:
                        self._seen.add(key)
                        self.step.cache_bytes += self.cache[key]

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if self.step is not None:
                self.step.ops += 1
                if func.namespace == "dgemma":
                    self.step.launches += 1
                kernels = kernels_launched(func, args)
                if kernels:
                    self.step.kernels += kernels
                    name = f"{func.namespace}::{func._overloadpacket.__name__}"
                    self.step.kernels_by_op[name] = self.step.kernels_by_op.get(name, 0) + kernels
                kind, flops, label = matmul_flops(func, args, kwargs)
                if flops:
                    self.step.add_flops(kind, flops, label)
                self._reads(func, args)
            if func is scalar_read:
                # A value the fake world cannot know: reading a CUDA one stalls the host (a sync);
                # a CPU one (a draft already copied out) does not. Either way the answer is 0.
                if args[0].device.type == "cuda":
                    self._sync("item/tolist/bool of a CUDA tensor")
                return False if args[0].dtype == torch.bool else 0 if not args[0].is_floating_point() else 0.0
            if _device_to_host(func, args, kwargs):
                self._sync(f"{func.__name__} device to host")
            try:
                out = func(*args, **kwargs)
            except FakeTensorDeviceMismatchError:
                self.mismatches += 1
                raise
            except DynamicOutputShapeException:
                self._sync(f"{func.__name__} (output shape depends on device data)")
                raise
            for tensor in tree_flatten(out)[0]:
                if isinstance(tensor, torch.Tensor):
                    self._track(tensor)
            if self.step is not None and func.namespace == "dgemma" and func._overloadpacket.__name__ == "attention_inputs":
                self.step.attention_buffer_bytes += sum(t.numel() * t.element_size() for t in out[1:])  # keys, values
            return out

    def _device_to_host(func, args, kwargs) -> bool:
        if func is aten.copy_.default:
            return args[0].device.type == "cpu" and args[1].device.type == "cuda"
        if func is aten._to_copy.default:
            target = kwargs.get("device")
            return args[0].device.type == "cuda" and target is not None and torch.device(target).type == "cpu"
        return False

    return Watcher()


def _make_function_mode(watcher):
    """Two calls answered above the dispatcher: `Tensor.tolist` on a fake tensor reads every element
    (`_local_scalar_dense` each), so it is answered once per call with zeros of its shape and counted
    as one sync when the tensor is on CUDA (one copy out); SDPA is accounted as the fused kernel."""
    import torch
    from torch.overrides import TorchFunctionMode

    sdpa = torch.nn.functional.scaled_dot_product_attention

    class FunctionMode(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if func is sdpa:
                # On a GPU, SDPA runs a fused kernel (memory-efficient or flash) that keeps only its
                # output; on fake CUDA tensors it would decompose into the math fallback, with fp32
                # copies of q/k/v and the whole score matrix. Account it as the fused kernel.
                query, value = args[0], args[2] if len(args) > 2 else kwargs["value"]
                key = args[1] if len(args) > 1 else kwargs["key"]
                watcher.fused_attention += 1
                if watcher.step is not None:
                    # q k^T and the weights times v over every key in the buffer (the fused kernels skip no
                    # masked work at these lengths): 2 FLOPs a multiply-add, per query row per key
                    rows = query.numel() // query.shape[-1]
                    watcher.step.add_flops("bf16", 2 * rows * key.shape[-2] * (query.shape[-1] + value.shape[-1]),
                                           "sdpa (fused)")
                    watcher.step.kernels += 1
                    by_op = watcher.step.kernels_by_op
                    by_op["sdpa (fused)"] = by_op.get("sdpa (fused)", 0) + 1
                # The fused kernels write [B, L, H, D] and return it as [B, H, L, D] (a transposed view), so
                # the caller's `transpose(1, 2).reshape(...)` is a view on a GPU, not a copy.
                batch, heads, length = query.shape[:-1]
                return query.new_empty((batch, length, heads, value.shape[-1])).transpose(1, 2)
            if getattr(func, "__name__", None) == "tolist":
                tensor = args[0]
                if tensor.device.type == "cuda":
                    watcher._sync("tolist of a CUDA tensor")
                return _zeros(tuple(tensor.shape), tensor.dtype)
            return func(*args, **(kwargs or {}))

    return FunctionMode()


def _zeros(shape: tuple[int, ...], dtype):
    import torch

    value = False if dtype == torch.bool else 0.0 if dtype.is_floating_point else 0
    if not shape:
        return value
    return [_zeros(shape[1:], dtype) for _ in range(shape[0])]


# -- the model as the loader builds it -----------------------------------------------------------


def _config():
    from .gpu import FULL, diffusion_config

    return diffusion_config(FULL)


def _skeleton(config):
    import torch

    from dgemma_lsp.engine.weights.loading import _skeleton

    return _skeleton(config, torch.bfloat16)


def checkpoint_layout(skeleton) -> list[tuple[str, tuple[int, ...], object]]:
    """(name, shape, dtype) of every tensor the checkpoint holds for the text model: each tied
    tensor once, persistent buffers, no vision tower."""
    from dgemma_lsp.engine.weights.text_model import is_vision_key

    layout = []
    for name, parameter in skeleton.named_parameters():
        if not is_vision_key(name):
            layout.append((name, tuple(parameter.shape), parameter.dtype))
    for module_name, module in skeleton.named_modules():
        for attr, buffer in module._buffers.items():
            name = f"{module_name}.{attr}" if module_name else attr
            if buffer is not None and attr not in module._non_persistent_buffers_set and not is_vision_key(name):
                layout.append((name, tuple(buffer.shape), buffer.dtype))
    return layout


def planned_bytes(config) -> dict[str, int]:
    """The loader's own plan for each mode, from the checkpoint's shapes (streaming.planned_bytes; a GGUF
    layout: the GGUF loader's, gguf.planned_bytes)."""
    import torch

    from dgemma_lsp.engine.weights.formats import gguf
    from dgemma_lsp.engine.weights.streaming import TensorInfo
    from dgemma_lsp.engine.weights.streaming import planned_bytes as plan

    skeleton = _skeleton(config)
    names = {torch.bfloat16: "BF16", torch.float32: "F32"}
    infos = [TensorInfo(file=None, key=name, shape=shape, dtype=names.get(dtype, "BF16"))
             for name, shape, dtype in checkpoint_layout(skeleton)]  # fmt: skip
    planned = {mode: plan(infos, skeleton, *_plan_args(mode)) for mode in (*MODES, *LAYOUTS)}
    for mode, recipe in GGUF_LAYOUTS.items():  # the GGUF loader's own plan (formats.sizes)
        planned[mode] = gguf.planned_bytes(*_gguf_plan(skeleton, recipe), torch.bfloat16)
    return planned


def _plan_args(mode: str) -> tuple:
    import torch

    base, group = mode_and_group(mode)
    return base, torch.bfloat16, group


def modes_offered(gpu: VirtualGpu, planned: dict[str, int]) -> list[str]:
    """The modes the loader's fit check accepts on this card with nothing else on it."""
    from dgemma_lsp.engine.weights.memory_plan import FitPlan

    plan = FitPlan(mode="none", device="cuda", resident_bytes=planned, device_free_bytes=gpu.memory_bytes,
                   host_free_bytes=64 * GIB, host_pass_bytes=0)  # fmt: skip
    return [mode for mode in planned if plan.fits(mode)]


def load_fake(skeleton, layout, mode: str):
    """The model as the streaming loader builds it, on fake CUDA tensors (call inside the fake mode
    with the meta skeleton built outside it); a GGUF_LAYOUTS mode as the GGUF loader builds it."""
    import torch

    from dgemma_lsp.engine.weights.streaming import SkeletonFiller

    if mode in GGUF_LAYOUTS:
        from dgemma_lsp.engine.weights.formats import gguf

        tensors, names, the_plan = _gguf_plan(skeleton, GGUF_LAYOUTS[mode])  # before the load swaps modules in
        gguf.stream_load(skeleton, (), tensors, names, the_plan, device="cuda", dtype=torch.bfloat16,
                         source="the dry run's fake GGUF", rows=gguf.empty_rows())  # fmt: skip
        skeleton.eval()
        return skeleton
    base, group = mode_and_group(mode)
    filler = SkeletonFiller(skeleton, device="cuda", mode=base, group_size=group)
    for name, shape, dtype in layout:
        # What a shard read gives: a host tensor in the checkpoint's dtype.
        filler.put(name, lambda shape=shape, dtype=dtype: torch.empty(shape, dtype=dtype))
    filler.finish("the dry run's fake checkpoint")
    if mode.removesuffix(CODES_SUFFIX) in W4A8_MODES:  # bench-only: int4 modules taking int8 activations
        for module in skeleton.modules():
            if hasattr(module, "int4_activations"):
                module.int4_activations = "int8"
    skeleton.eval()
    return skeleton


def _storages(tensors) -> dict[int, int]:
    return {id(t.untyped_storage()): t.untyped_storage().nbytes() for t in tensors if t.device.type == "cuda"}


# -- one request ---------------------------------------------------------------------------------


def _denoiser_class():
    from dgemma_lsp.engine.kernels.compiled_step import CompiledDenoiser

    class WatchedDenoiser(CompiledDenoiser):
        """The product's denoiser; each step call runs inside the watcher's step phase."""

        watcher = None
        step_figures: list[_StepFigures]

        def _step_for(self, cache, batch, bucket):
            buffers, step = super()._step_for(cache, batch, bucket)
            watcher, figures = self.watcher, self.step_figures

            def watched_step() -> None:
                watcher.cache = _storages(t for layer in cache.layers for t in (layer.keys, layer.values))
                with watcher.in_step() as figure:
                    step()
                figures.append(figure)

            return buffers, watched_step

    return WatchedDenoiser


def run_request(model, watcher, gpu: VirtualGpu, mode: str, prompt_tokens: int, batch: int,
                resident: int, fused: bool | None = None) -> RunFigure:  # fmt: skip
    denoiser = _denoiser_class()(model, capture=False, eos_ids=set(), pad_id=0, fused=fused)
    denoiser.watcher, denoiser.step_figures = watcher, []
    # The fused decoder stacks projections of one input when it is built (StackedLinears): their buffers are
    # now views of the stacks, whose storages are what a step reads.
    watcher.weights = _storages(list(model.parameters()) + list(model.buffers()))
    prompt = [4 + (i % 1000) for i in range(prompt_tokens)]
    watcher.syncs.clear()
    watcher.mismatches = 0
    watcher.vocab_sized_bytes = batch * denoiser.canvas_length * denoiser.vocab * 2
    watcher.vocab = denoiser.vocab
    watcher.reset_peak()
    error = None
    try:
        denoiser.denoise(
            stable=prompt[:-TAIL_TOKENS], tail=prompt[-TAIL_TOKENS:], cache_key="dryrun", batch=batch,
            steps=STEPS, max_tokens=denoiser.canvas_length, entropy_bound=0.1, t_min=0.4, t_max=0.8,
            confidence_threshold=0.005, seed=0, on_step=lambda step, ids: None,
        )  # fmt: skip
    except Exception as exc:  # noqa: BLE001 - the run's finding, reported rather than raised
        error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]} at {_site_of(exc)}"
    figures = denoiser.step_figures
    steps_run = len(figures)
    last = denoiser.step_figures[-1] if denoiser.step_figures else _StepFigures()
    peak = watcher.peak_bytes
    denoiser.clear()  # drops the captured steps' closures (they hold the denoiser): refcounts free the rest
    del denoiser
    return RunFigure(
        gpu=gpu.name, mode=mode, prompt_tokens=prompt_tokens, candidates=batch,
        steps=steps_run,
        device_mismatches=watcher.mismatches,
        host_syncs_per_step=max((f.syncs for f in figures), default=0),
        host_syncs_per_canvas=sum(watcher.syncs.values()), sync_sites=dict(watcher.syncs),
        ops_per_step=last.ops, custom_kernel_launches_per_step=last.launches,
        device_kernels_per_step=last.kernels,
        device_kernels_by_op=dict(sorted(last.kernels_by_op.items(), key=lambda kv: -kv[1])[:KERNEL_OPS_LISTED]),
        vocab_sized_allocations_per_step=last.vocab_sized,
        peak_bytes=peak, peak_site=watcher.peak_site, resident_bytes=resident, card_bytes=gpu.memory_bytes,
        within_card=peak <= gpu.memory_bytes - SPARE_BYTES,
        weight_bytes_per_step=last.weight_bytes, cache_bytes_per_step=last.cache_bytes,
        attention_buffer_bytes_per_step=last.attention_buffer_bytes,
        floor_ms_per_step=round(last.weight_bytes / gpu.bandwidth_bytes_per_s * 1000, 2),
        floor_with_cache_ms_per_step=round((last.weight_bytes + last.cache_bytes) / gpu.bandwidth_bytes_per_s * 1000, 2),
        matmul_flops_per_step=dict(last.flops),
        matmul_flops_by_op=dict(sorted(last.flops_by_op.items(), key=lambda kv: -kv[1])),
        compute_floor_ms_per_step=round(sum(f / gpu.tensor_flops_per_s[k] for k, f in last.flops.items()) * 1000, 2),
        error=error,
    )  # fmt: skip


def _site_of(exc: BaseException) -> str:
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        if "/torch/" not in frame.filename:
            return f"{_short(frame.filename)}:{frame.lineno}"
    return "?"


@contextlib.contextmanager
def virtual_gpu(gpu: VirtualGpu) -> Iterator[None]:
    """torch.cuda.get_device_capability answers for `gpu`; the product's cached answer is dropped."""
    import torch

    from dgemma_lsp.engine.kernels import fused_moe

    original = torch.cuda.get_device_capability
    torch.cuda.get_device_capability = lambda device=None: gpu.capability
    fused_moe._capability.cache_clear()
    try:
        yield
    finally:
        torch.cuda.get_device_capability = original
        fused_moe._capability.cache_clear()


# -- the run ----------------------------------------------------------------------------------------


def run_dryrun(gpus=GPUS, modes=MODES, prompts=PROMPTS, candidates=CANDIDATES, *, config=None,
               log=None, fused: bool | None = None) -> DryRunReport:  # fmt: skip
    """Every (virtual GPU, offered mode, prompt, candidates) request; `config` defaults to the full size;
    `fused` False runs the step unfused (transformers' decoder: the A/B baseline)."""
    import torch
    import transformers
    from torch._subclasses.fake_tensor import FakeTensorMode

    from dgemma_lsp.engine.kernels import fused_moe

    log = log or (lambda line: None)
    started, cpu_started = time.perf_counter(), time.process_time()
    config = config if config is not None else _config()
    planned = planned_bytes(config)
    offered = {gpu.name: [m for m in modes_offered(gpu, planned) if m in modes] for gpu in gpus}
    runs: list[RunFigure] = []
    watcher = _make_watcher()
    for mode in modes:
        where = [gpu for gpu in gpus if mode in offered[gpu.name]]
        if not where:
            continue
        skeleton = _skeleton(config)  # on the meta device, as the loader builds it: before the fake mode
        layout = checkpoint_layout(skeleton)
        # Non-fake inputs allowed: the skeleton's meta tensors, which the loader replaces.
        with torch.no_grad(), FakeTensorMode(allow_non_fake_inputs=True), watcher, _make_function_mode(watcher):
            loaded = time.perf_counter()
            model = load_fake(skeleton, layout, mode)
            del skeleton
            resident = watcher.live_bytes
            log(f"{mode}: loaded on fake CUDA, {resident / 1e9:.2f} GB resident ({time.perf_counter() - loaded:.0f} s)")
            codes = mode.endswith(CODES_SUFFIX)
            for gpu in where:
                with virtual_gpu(gpu), fused_moe.launch_settings(activation_codes=codes):
                    for prompt in prompts:
                        for batch in candidates:
                            figure = run_request(model, watcher, gpu, mode, prompt, batch, resident, fused)
                            runs.append(figure)
                            log(_describe(figure))
            del model
            watcher.weights = {}
            gc.collect()
    return DryRunReport(
        torch_version=str(torch.__version__), transformers_version=transformers.__version__, gpus=list(gpus),
        modes_offered=offered, planned_bytes=planned, runs=runs, vllm_ms_per_step=VLLM_MS_PER_STEP,
        targets={"deviceMismatches": 0, "hostSyncsPerStep": 0, "spareBytes": SPARE_BYTES,
                 "int4Rtx4090PeakBytes": INT4_4090_TARGET_BYTES},
        failures=failures(runs), targets_missed=targets_missed(runs), cpu_seconds=round(time.process_time() - cpu_started, 1),
        wall_seconds=round(time.perf_counter() - started, 1),
    )  # fmt: skip


def run_parallel(gpus, modes, prompts, candidates, *, jobs: int, log=None, fused: bool | None = None) -> DryRunReport:
    """`run_dryrun` split by virtual GPU over `jobs` processes (each loads the modes its GPUs offer);
    the report lists the GPUs in the given order and sums the processes' CPU seconds."""
    import concurrent.futures
    import multiprocessing

    started = time.perf_counter()
    groups = _balanced_groups(gpus, modes, jobs)
    context = multiprocessing.get_context("spawn")  # no fork of a process that has torch loaded
    with concurrent.futures.ProcessPoolExecutor(len(groups), mp_context=context) as pool:
        parts = list(pool.map(_run_part, [([g.name for g in group], modes, prompts, candidates, fused)
                                          for group in groups]))  # fmt: skip
    reports = [msgspec.json.decode(part, type=DryRunReport) for part in parts]
    order = [gpu.name for gpu in gpus]
    runs = sorted((run for report in reports for run in report.runs), key=lambda run: order.index(run.gpu))
    first = reports[0]
    return msgspec.structs.replace(
        first, gpus=list(gpus), runs=runs, failures=failures(runs), targets_missed=targets_missed(runs),
        modes_offered={name: offered for report in reports for name, offered in report.modes_offered.items()},
        cpu_seconds=round(sum(report.cpu_seconds for report in reports), 1),
        wall_seconds=round(time.perf_counter() - started, 1),
    )  # fmt: skip


def _run_part(part) -> bytes:
    gpu_names, modes, prompts, candidates, fused = part
    gpus = [gpu for gpu in GPUS if gpu.name in gpu_names]
    return msgspec.json.encode(run_dryrun(gpus, modes, prompts, candidates, log=say, fused=fused))


def _balanced_groups(gpus, modes, jobs: int) -> list[list[VirtualGpu]]:
    """GPUs in `jobs` groups of about equal work (a load and the requests per offered mode)."""
    planned = planned_bytes(_config())
    work = {gpu.name: len([m for m in modes_offered(gpu, planned) if m in modes]) for gpu in gpus}
    groups: list[list[VirtualGpu]] = [[] for _ in range(max(1, min(jobs, len(gpus))))]
    for gpu in sorted(gpus, key=lambda g: -work[g.name]):
        min(groups, key=lambda group: sum(work[g.name] for g in group)).append(gpu)
    return [group for group in groups if group]


def failures(runs: list[RunFigure]) -> list[str]:
    """One line per run that would fail on a real card: an error, a device mismatch, a sync inside a
    step (no CUDA graph), a peak over the card minus 1 GiB. `bench dryrun` exits 1 on any."""
    lines = []
    for run in runs:
        name = f"{run.gpu} {run.mode} prompt {run.prompt_tokens} x{run.candidates}"
        if run.error:
            lines.append(f"{name}: stopped: {run.error}")
        if run.device_mismatches:
            lines.append(f"{name}: {run.device_mismatches} device mismatches")
        if run.host_syncs_per_step:
            lines.append(f"{name}: {run.host_syncs_per_step} host syncs inside a step")
        if not run.within_card:
            lines.append(f"{name}: peak {run.peak_bytes / 1e9:.2f} GB > card - 1 GB")
    return lines


def targets_missed(runs: list[RunFigure]) -> list[str]:
    """Product targets beyond working at all (reported, not an exit status): int4 on the 4090 <= 18 GB."""
    return [f"{run.gpu} int4 prompt 4096 x4: peak {run.peak_bytes / 1e9:.2f} GB > 18 GB" for run in runs
            if (run.gpu, run.mode, run.prompt_tokens, run.candidates) == ("RTX 4090", "int4", 4096, 4)
            and run.peak_bytes > INT4_4090_TARGET_BYTES]  # fmt: skip


def _describe(run: RunFigure) -> str:
    text = (f"{run.gpu:8} {run.mode:4} prompt {run.prompt_tokens:5} x{run.candidates}: "
            f"mismatches {run.device_mismatches}, syncs/step {run.host_syncs_per_step}, "
            f"syncs/canvas {run.host_syncs_per_canvas}, ops/step {run.ops_per_step}, kernels/step {run.device_kernels_per_step}, "
            f"launches/step {run.custom_kernel_launches_per_step}, peak {run.peak_bytes / 1e9:.2f} GB at {run.peak_site}, "
            f"weights/step {run.weight_bytes_per_step / 1e9:.2f} GB, cache/step {run.cache_bytes_per_step / 1e9:.2f} GB, "
            f"attention's key/value buffers/step {run.attention_buffer_bytes_per_step / 1e9:.2f} GB (written, read), "
            f"floor {run.floor_ms_per_step:.2f} ms, "
            f"matmul {sum(run.matmul_flops_per_step.values()) / 1e12:.2f} TFLOP, compute floor "
            f"{run.compute_floor_ms_per_step:.2f} ms")  # fmt: skip
    return text + (f"  ERROR {run.error}" if run.error else "")


def format_table(report: DryRunReport) -> str:
    width = max([4, *(len(run.mode) for run in report.runs)])  # the layouts' names are longer than the modes'
    lines = [
        f"virtual-GPU dry run (torch {report.torch_version}, fake CUDA tensors); vLLM anchor "
        f"{report.vllm_ms_per_step} ms/step (FP8, H100)",
        f"{'gpu':8} {'mode':{width}} {'prompt':>6} {'cand':>4} {'mism':>4} {'sync/step':>9} {'sync/canvas':>11} "
        f"{'ops/step':>8} {'kernels':>7} {'launch':>6} {'peak GB':>8} {'weights GB':>10} {'floor ms':>8} "
        f"{'TFLOP':>6} {'compute ms':>10}",
    ]
    for run in report.runs:
        lines.append(
            f"{run.gpu:8} {run.mode:{width}} {run.prompt_tokens:>6} {run.candidates:>4} {run.device_mismatches:>4} "
            f"{run.host_syncs_per_step:>9} {run.host_syncs_per_canvas:>11} {run.ops_per_step:>8} "
            f"{run.device_kernels_per_step:>7} "
            f"{run.custom_kernel_launches_per_step:>6} {run.peak_bytes / 1e9:>8.2f} "
            f"{run.weight_bytes_per_step / 1e9:>10.2f} {run.floor_ms_per_step:>8.2f} "
            f"{sum(run.matmul_flops_per_step.values()) / 1e12:>6.2f} {run.compute_floor_ms_per_step:>10.2f}"
            + (f"  {run.error}" if run.error else "")
        )  # fmt: skip
    lines += [f"FAILS: {line}" for line in report.failures] or ["no run fails: 0 mismatches, 0 syncs in a step, every peak fits"]
    lines += [f"target missed: {line}" for line in report.targets_missed]
    lines.append(f"{report.cpu_seconds} CPU s, {report.wall_seconds} s wall")
    return "\n".join(lines)


# -- command line -------------------------------------------------------------------------------------


def add_arguments(parser) -> None:
    parser.add_argument("--gpus", default=",".join(g.name for g in GPUS),
                        help="comma-separated subset of the virtual GPUs")  # fmt: skip
    parser.add_argument("--modes", default=",".join(MODES),
                        help=f"comma-separated subset of {','.join(MODES)}, or the pre-quantized layouts "
                             f"{','.join((*LAYOUTS, *GGUF_LAYOUTS))}")
    parser.add_argument("--prompts", default=",".join(map(str, PROMPTS)), help="prompt lengths in tokens")
    parser.add_argument("--candidates", default=",".join(map(str, CANDIDATES)), help="candidates per request")
    parser.add_argument("--fused", choices=("auto", "on", "off"), default="auto",
                        help="the step's fused decoder kernels (compiled_step's `fused`); off: transformers' decoder")  # fmt: skip
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1),
                        help="processes (the virtual GPUs are split between them)")  # fmt: skip


def run(args) -> int:
    import torch

    if torch.version.cuda is None:
        say(f"dgemma-lsp bench dryrun: needs the CUDA build of torch (this is {torch.__version__}); "
            "`make dryrun` installs one in .venv-cuda")  # fmt: skip
        return 2
    gpus = [g for g in GPUS if g.name in {n.strip() for n in args.gpus.split(",")}]
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    known = (*MODES, *LAYOUTS, *GGUF_LAYOUTS)
    if not gpus or any(m not in known for m in modes):
        say(f"dgemma-lsp bench dryrun: --gpus from {[g.name for g in GPUS]}, --modes from {known}")
        return 2
    prompts = tuple(int(p) for p in args.prompts.split(","))
    candidates = tuple(int(c) for c in args.candidates.split(","))
    fused = None if args.fused == "auto" else args.fused == "on"
    if args.jobs > 1 and len(gpus) > 1:
        report = run_parallel(gpus, modes, prompts, candidates, jobs=args.jobs, log=say, fused=fused)
    else:
        report = run_dryrun(gpus, modes, prompts, candidates, log=say, fused=fused)
    write_report(report, getattr(args, "json", False), format_table)
    return 1 if report.failures else 0
