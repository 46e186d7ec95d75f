"""Where and how the trainer's arithmetic runs: the device, its precision, the optimizer, compilation, and what
a run costs there (issue 51: the same recipe and objective on one GPU).

A recipe's `train` section chooses (all optional; absent, a run is what it was on a CPU):
- `device`: "cpu" (the default), "cuda", or "auto" (CUDA when torch sees a GPU); `dgemma-lsp train --device`
  overrides it;
- `precision`: "bf16" (autocast: matmuls in bf16, weights, optimizer and the losses' softmax in fp32) or
  "fp32"; the default is bf16 on CUDA, fp32 on a CPU;
- `fusedAdam`: AdamW's fused kernel (one launch for every parameter; the default on CUDA);
- `compile`: "none" (the default until a GPU has measured it) or "layers": each transformer layer through
  `torch.compile` (regional compilation: one graph per layer kind, reused by every layer of that kind, with
  dynamic shapes; the encoder's cache update stays eager). On a GPU it fuses a layer's ~10 RMSNorms, its
  rotary embedding and activations, which an eager step runs as separate passes over memory.
- `maxWallS`: a time budget (`dgemma-lsp train --seconds` overrides it), below.

Cost, counted beside train.py's CPU-seconds (`CostMeter`): `gpuSeconds`, the wall seconds the trainer held a
GPU (from its start: building the model, compiling, steps, saves; summed over the run's sessions; 0 on a
CPU), and `flops`, 6·N·D: D the tokens a step reads (real prompt tokens + canvas tokens, train.py's
`tokens`), N `active_parameters` (the transformer layers' weights with only top-k of the experts, plus the
LM head, whose matmul runs at every loss position; not the embedding lookup, the vision tower or the
self-conditioning projection). It leaves out attention's scores and values (4·context·width a layer and
token) and the passes 6·N·D does not count: the self-conditioning pass (no gradient) and the answer's second
encoder pass, ~15% more at 400-token prompts. It is the figure to set against a card's peak, not a count.

The time budget (`Deadline`): training stops before a step that would end past it, saves its checkpoint
and exports its model as at the end of its schedule; the learning rate's cosine ends there too (`lr_total`:
the schedule's length, or the steps the measured pace fits before the deadline, whichever is less), so a
run cut by time is annealed, not stopped at its peak rate. Knows torch; knows nothing of the recipe's data.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable

import torch

log = logging.getLogger(__name__)

COMPILE_MODES = ("none", "layers")
PRECISIONS = ("fp32", "bf16")


@dataclasses.dataclass(frozen=True)
class Accelerator:
    """The device a run trains on and how: see the module docstring for the recipe knobs."""

    device: torch.device
    precision: str = "fp32"
    fused_adam: bool = False
    compile: str = "none"

    @classmethod
    def from_recipe(cls, schedule: dict, device: str | None = None) -> Accelerator:
        """The recipe's `train` section's choices, `device` (the command line's) first."""
        name = device or schedule.get("device", "cpu")
        if name == "auto":
            name = "cuda" if torch.cuda.is_available() else "cpu"
        chosen = torch.device(name)
        assert chosen.type in ("cpu", "cuda"), f"train.device {name!r}: cpu, cuda or auto"
        cuda = chosen.type == "cuda"
        precision = schedule.get("precision", "bf16" if cuda else "fp32")
        compile_mode = schedule.get("compile", "none")
        assert precision in PRECISIONS, f"train.precision {precision!r}: one of {PRECISIONS}"
        assert compile_mode in COMPILE_MODES, f"train.compile {compile_mode!r}: one of {COMPILE_MODES}"
        return cls(chosen, precision, bool(schedule.get("fusedAdam", cuda)), compile_mode)

    @property
    def is_cuda(self) -> bool:
        return self.device.type == "cuda"

    def describe(self) -> dict:
        """What the record and the log say about where the run trained."""
        name = torch.cuda.get_device_name(self.device) if self.is_cuda else "cpu"
        return {"device": name, "precision": self.precision, "fusedAdam": self.fused_adam, "compile": self.compile}

    def prepare(self, model):
        """The model on the device, its layers compiled when the recipe asks; returns it."""
        if self.is_cuda:
            # fp32 matmuls outside autocast (the fp32 head of an eager `LMHead`) on the tensor cores' tf32.
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
        model.to(self.device)
        if self.is_cuda and self.precision == "bf16":
            use_autocast_experts(model)
        if self.compile == "layers":
            compile_layers(model)
        return model

    def optimizer(self, parameters, *, lr: float, betas: tuple[float, float], weight_decay: float):
        """AdamW; fused (one kernel for all parameters) when the recipe or the device says so."""
        extra = {"fused": True} if self.fused_adam else {}
        return torch.optim.AdamW(parameters, lr=lr, betas=betas, weight_decay=weight_decay, **extra)

    def autocast(self):
        """The loss's forward under bf16 autocast, or as it is (fp32)."""
        if self.precision == "bf16":
            return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def generator(self, seed: int) -> torch.Generator:
        """The noise generator, on the device the noise is drawn on (objective.py draws on the batch's)."""
        return torch.Generator(device=self.device).manual_seed(seed)

    def restore_generator(self, generator: torch.Generator, state: torch.Tensor, reseed: int) -> bool:
        """Set `generator` to a checkpoint's `state`; a state of another device's generator (a CPU run resumed
        on a GPU) cannot be, and it is seeded with `reseed` instead. True when the state was restored."""
        try:
            generator.set_state(state)
            return True
        except RuntimeError:
            generator.manual_seed(reseed)
            log.info("the checkpoint's noise state is another device's: noise reseeded")
            return False

    def to_device(self, batch):
        """A collated Batch (objective.py) with every tensor on the device (pinned, copied asynchronously)."""
        if not self.is_cuda:
            return batch
        fields = {field.name: getattr(batch, field.name) for field in dataclasses.fields(batch)}
        return type(batch)(**{name: value.pin_memory().to(self.device, non_blocking=True)
                              for name, value in fields.items()})

    def synchronize(self) -> None:
        if self.is_cuda:
            torch.cuda.synchronize(self.device)


AUTOCAST_EXPERTS = "grouped_mm_autocast"
"""The experts implementation a bf16 run on CUDA uses (registered with transformers by `use_autocast_experts`)."""


class _ExpertsInDtype:
    """An experts module as transformers' grouped_mm forward reads it, its two weights cast to `dtype` (the cast
    is differentiable: the gradients reach the fp32 weights)."""

    def __init__(self, experts, dtype) -> None:
        self._experts = experts
        self.gate_up_proj = experts.gate_up_proj.to(dtype)
        self.down_proj = experts.down_proj.to(dtype)

    def __getattr__(self, name):
        return getattr(self._experts, name)


def _grouped_mm_autocast(self, hidden_states, top_k_index, top_k_weights):
    """transformers' grouped_mm experts, with their weights in the autocast dtype on CUDA.

    The CUDA grouped GEMM takes bf16 operands only (torch's meta check; the fake-CUDA test caught it), is not
    autocast-enabled, and transformers casts its input to the weights' dtype: fp32 here, the master weights."""
    from transformers.integrations.moe import grouped_mm_experts_forward

    device = hidden_states.device.type
    if device == "cuda" and torch.is_autocast_enabled(device):
        self = _ExpertsInDtype(self, torch.get_autocast_dtype(device))
    return grouped_mm_experts_forward(self, hidden_states, top_k_index, top_k_weights)


def use_autocast_experts(model) -> None:
    """The model's experts through `_grouped_mm_autocast` (not saved with the model: the config keeps
    transformers' own name out of its JSON, so an exported model loads with its default)."""
    from transformers.integrations.moe import ExpertsInterface

    ExpertsInterface.register(AUTOCAST_EXPERTS, _grouped_mm_autocast)
    model.set_experts_implementation(AUTOCAST_EXPERTS)


def compile_layers(model) -> int:
    """Each text layer of the encoder and the decoder through torch.compile with dynamic shapes; how many.

    Layers of one kind share their code, so one compiled graph serves every layer of the kind (a guard per
    layer type: sliding or full attention); the cache limit is raised so that no layer falls back to eager."""
    import torch._dynamo

    layers = [*model.model.encoder.language_model.layers, *model.model.decoder.layers]
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 8 * len(layers))
    for layer in layers:
        layer.compile(dynamic=True)
    return len(layers)


def active_parameters(model) -> int:
    """N of 6·N·D: the text layers' weights (shared by the encoder and the decoder) with top-k of the experts
    counted, plus the LM head (tied to the embedding table, counted once, as a matmul)."""
    text = model.config.text_config
    share = text.top_k_experts / text.num_experts if text.num_experts else 1.0
    total = 0.0
    for name, parameter in model.model.encoder.language_model.layers.named_parameters():
        total += parameter.numel() * (share if ".experts." in name else 1.0)
    return int(total) + model.lm_head.weight.numel()


class CostMeter:
    """GPU-seconds and FLOPs of a run so far, earlier sessions' included (see the module docstring)."""

    def __init__(self, accelerator: Accelerator, flop_parameters: int, *, gpu_seconds: float = 0.0,
                 flops: float = 0.0, clock: Callable[[], float] = time.monotonic, started: float | None = None) -> None:
        self.on_gpu = accelerator.is_cuda
        self.flop_parameters = flop_parameters
        self.gpu_seconds_before, self.flops = gpu_seconds, flops
        self.clock = clock
        self.started = clock() if started is None else started
        """When this session began to hold the device (train.py: its start, by `clock`)."""

    def add_tokens(self, tokens: int) -> None:
        self.flops += 6.0 * self.flop_parameters * tokens

    def gpu_seconds(self) -> float:
        return self.gpu_seconds_before + (self.clock() - self.started if self.on_gpu else 0.0)

    def counters(self) -> dict:
        """What the checkpoint, each log line and the record keep."""
        return {"gpuSeconds": round(self.gpu_seconds(), 1), "flops": self.flops}


class Deadline:
    """A budget of wall seconds from the trainer's start (None: no budget), and the steps it still fits.

    The pace is the mean of the steps since the first (which compiles and warms up): a step is started
    only when it is expected to end before the budget's end."""

    def __init__(self, seconds: float | None, clock: Callable[[], float] = time.monotonic,
                 started: float | None = None) -> None:
        self.seconds = seconds
        self.clock = clock
        self.started = clock() if started is None else started
        self._paced_from: tuple[float, int] | None = None  # (time, step) after the first step
        self.ended = False
        """True once `allows_step` said no: the run stopped for time."""

    def step_done(self, step: int) -> None:
        if self._paced_from is None:
            self._paced_from = (self.clock(), step)

    def pace(self, step: int) -> float | None:
        """Mean seconds a step since the first one, or None before two steps."""
        if self._paced_from is None or step <= self._paced_from[1]:
            return None
        since, first = self._paced_from
        return (self.clock() - since) / (step - first)

    def left(self) -> float:
        return float("inf") if self.seconds is None else self.seconds - (self.clock() - self.started)

    def allows_step(self, step: int) -> bool:
        """Whether another step ends within the budget (at the pace so far; the first always starts)."""
        if self.seconds is None:
            return True
        pace = self.pace(step) or 0.0
        if self.left() < pace:
            self.ended = True
        return not self.ended

    def lr_total(self, step: int, total_steps: int) -> int:
        """The step the learning rate's cosine ends at: the schedule's end, or the last step the budget fits."""
        pace = self.pace(step)
        if self.seconds is None or pace is None:
            return total_steps
        return max(step + 1, min(total_steps, step + int(self.left() / pace)))
