"""Quantized residency of DiffusionGemma weights (`--quantization none|fp8|int8|int4`).

Owns: weight-only quantization of the fused MoE expert tensors and of the text
attention/MLP linears, applied in place to a loaded model; the modules that
dequantize on the fly in their forward; and save/load of the quantized model
so the next start skips the bf16 checkpoint. Knows nothing of prompts,
denoising, LSP, or where checkpoints live; the packing formats are in
`quant_formats`.

What is quantized (each tied tensor once: the encoder and decoder share every
text-layer weight, so both positions get the *same* quantized module):
- experts: `DiffusionGemmaTextExperts.gate_up_proj` `[E, 2I, H]` and
  `down_proj` `[E, H, I]` (~88% of the weights) -> `QuantizedExperts`, which
  dequantizes only the experts the router actually picked, one at a time, so
  no full-precision copy of a layer's experts ever exists.
- linears: q/k/v/o projections, the shared dense MLP and the decoder's
  self-conditioning MLP -> `QuantizedLinear`.
- kept in full precision: embeddings (tied to `lm_head`: quantizing the head
  alone would add a copy, not save one), router projections (routing decides
  which weights run at all; they are tiny) and norms. The vision tower is not
  loaded at all (text_model.py).

Why not a library (checked on torch 2.13 CPU, torchao 0.18, transformers 5.23):
- torchao `Int8WeightOnlyConfig` / `Float8WeightOnlyConfig` work for
  `nn.Linear` (and even 3-D parameters via `FqnToConfig`), but `quantize_`
  gives the encoder and decoder separate copies of every tied weight (the
  linears' memory doubles and `lm_head` unties), `Int4WeightOnlyConfig` needs
  the CUDA-only `mslk` package, and `IntxWeightOnlyConfig(int4)` stores one
  int8 per value (no saving) and rejects 3-D tensors. One format for both
  experts and linears keeps ties, save/load and int4 uniform.
- bitsandbytes quantizes only `nn.Linear` and never the fused 3-D experts.
- transformers' `FineGrainedFP8Config` needs a GPU at load time.
So the packing (~150 lines in `quant_formats`) is written here. On CUDA the
forwards run our fused Triton kernels (`fused_moe`: one launch for all
experts, weights unpacked in registers, no bf16 copy); on CPU, or where a
kernel does not apply (fp8 before sm_89, a group under 16, int4 with K not a
multiple of 64), they keep the plain torch path below (dequantize,
`F.linear`), which is also the reference the kernels are tested against.
`backend` on a module forces one or the other. `quantize_activations` (on by
default) lets the 8-bit modes' kernels quantize activations per row (w8a8:
int8 MMA everywhere, fp8 MMA on sm_89+); off, they keep bf16 activations.
`int4_activations = "int8"` (off by default: `quantize_model(..., int4_activations=)`)
has symmetric int4 weights meet int8 activations in the MMA too (w4a8: 2-4x the
bf16 tensor rate on the users' cards); its agreement with bf16 is a GPU's to measure.

Imported checkpoints (formats/) fill the same modules in the form that holds
their values exactly: each projection in its own mode (a GGUF Q4_K_M's experts
hold Q4_K gate_up as affine int4 and Q5_0 / Q8_0 / Q6_K down as int8:
`QuantizedExperts.down_mode`), affine int4 with a `mins` buffer beside the
scales, two-level scales (`super_scales` / `super_mins`: Q4_K's fp16 d and
-dmin per 256 inputs over uint8 sc and m per 32) and scales in the dtype the
checkpoint needs (fp16, float32), all of which the kernels read as they read
bf16 (`quant_formats`). `--quantization` itself packs every projection of a
model in one symmetric mode with bf16 scales.

Save format (a folder, version 4): `quantized-NNNNN.safetensors` shards hold
every parameter and buffer of the model once (non-persistent buffers too, so a
skeleton built on the meta device loads completely); `quantization.json`
records the format version, the mode, the group size, the shard files, the
modules replaced (with each experts module's down mode) and which names alias
which tensor (mins and super scales are buffers like the scales, absent where a
module has none). Saving and loading go one shard at a time, so neither ever
holds the whole model in host memory.
"""

from __future__ import annotations

import itertools
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Literal

import msgspec
import torch
from torch import nn

from ..kernels.quant_formats import (
    PACKED_MODES,
    dequantize,
    dequantize_activations,
    group_of,
    in_features_of,
    packed_bytes,
    quantize,
    values_per_element,
)
from ..kernels.quant_formats import quantize_activations as fake_quantize_activations

log = logging.getLogger(__name__)

Mode = Literal["none", "fp8", "int8", "int4"]
Backend = Literal["auto", "torch", "triton"]
MODES: tuple[Mode, ...] = ("none", "fp8", "int8", "int4")
DEFAULT_GROUP_SIZE = 128
SAVE_FORMAT_VERSION = 4
"""4: per-projection modes (an experts module's `down_mode` in the manifest), affine int4's `*_mins` and two-level
scales' `*_super_scales` / `*_super_mins` buffers;
3: int4 in the kernel's tile layout (int16 words) and every scale group-major `[..., K / g, N]`
(quant_formats); 2: sharded (`files` in the manifest), no vision tower; 1 was one file with everything.
A cache of another version is rebuilt from the checkpoint (loading.py)."""
WEIGHTS_SHARD = "quantized-{:05d}.safetensors"
DEFAULT_SHARD_BYTES = 2 * 1024**3
MANIFEST_FILE = "quantization.json"


class QuantizationReport(msgspec.Struct, frozen=True):
    """What `quantize_model` / `load_quantized` did, in resident bytes (scales included)."""

    mode: str
    """none, fp8, int8 or int4."""
    group_size: int
    """Requested inputs per scale; a tensor whose input dim it does not divide uses the largest halving that does."""
    expert_bytes_before: int
    """Fused expert tensors before quantization, counted once per tied tensor, in their loaded dtype."""
    expert_bytes_after: int
    """Packed expert data + scales (+ mins and super scales where a projection has them)."""
    linear_bytes_before: int
    """Quantized attention/MLP linears before, counted once per tied tensor."""
    linear_bytes_after: int
    """Packed linear data + scales (+ mins and super scales)."""
    expert_modules: int
    """Distinct expert modules quantized (one per layer: encoder and decoder share it)."""
    linear_modules: int
    """Distinct linears quantized."""

    @property
    def expert_factor(self) -> float:
        """How many times smaller the experts became (1.0 for none)."""
        return self.expert_bytes_before / self.expert_bytes_after if self.expert_bytes_after else 1.0

    @property
    def linear_factor(self) -> float:
        return self.linear_bytes_before / self.linear_bytes_after if self.linear_bytes_after else 1.0


class QuantizedExperts(nn.Module):
    """Drop-in for `DiffusionGemmaTextExperts` holding packed weights.

    Same forward contract: hidden_states `[T, H]`, top_k_index `[T, K]`,
    top_k_weights `[T, K]` -> `[T, H]`. On the fused path the weights are
    unpacked in the kernels' registers; on the torch path each routed expert
    is dequantized to the activations' dtype just before its two matmuls.
    gate_up is in `mode`, down in `down_mode` (the same unless an imported
    checkpoint stores them in different types); a projection with `*_mins`
    is affine int4, one with `*_super_scales` has two-level scales.
    """

    def __init__(self, *, mode: str, num_experts: int, act_fn: nn.Module, down_mode: str | None = None) -> None:
        super().__init__()
        down_mode = down_mode or mode
        assert mode in PACKED_MODES and down_mode in PACKED_MODES, (
            f"QuantizedExperts needs packed modes, got {mode!r} / {down_mode!r}"
        )
        self.mode = mode
        """gate_up's mode; also the module's (most of its bytes are gate_up's)."""
        self.down_mode = down_mode
        self.num_experts = num_experts
        self.act_fn = act_fn
        self.backend: Backend = "auto"
        """auto: the fused kernels on CUDA where they apply, else the torch loop; torch/triton force one."""
        self.quantize_activations = True
        """8-bit modes on the fused path: activations quantized per row in the kernels (w8a8) where the card takes them."""
        self.int4_activations = "none"
        """"int8": symmetric int4 projections on the fused path meet activations quantized per row (w4a8)."""
        self.register_buffer("gate_up_data", torch.empty(0, dtype=torch.uint8))
        self.register_buffer("gate_up_scales", torch.empty(0))
        self.register_buffer("down_data", torch.empty(0, dtype=torch.uint8))
        self.register_buffer("down_scales", torch.empty(0))
        # Affine int4 only (weight = scale * code + min), shaped like the scales; None: symmetric / 8-bit.
        # Two-level scales (quant_formats): `[E, K / S, N]` per S inputs; None: one level.
        for which in ("gate_up", "down"):
            for part in _OPTIONAL_PARTS:
                self.register_buffer(f"{which}_{part}", None)

    @classmethod
    def from_experts(cls, experts: nn.Module, mode: str, group_size: int) -> QuantizedExperts:
        module = cls(mode=mode, num_experts=experts.num_experts, act_fn=experts.act_fn)
        # gate_up: [E, 2I, H] -> data [E, 2I, H or H/4], scales [E, H/group, 2I]
        module.gate_up_data, module.gate_up_scales = _quantize_per_expert(
            experts.gate_up_proj, mode, group_size
        )
        # down: [E, H, I] -> data [E, H, I or I/4], scales [E, I/group, H]
        module.down_data, module.down_scales = _quantize_per_expert(experts.down_proj, mode, group_size)
        return module

    def mode_of(self, which: str) -> str:
        """The mode of projection `which` ("gate_up" or "down")."""
        return self.down_mode if which == "down" else self.mode

    def resident_bytes(self) -> int:
        return sum(_packed_parts_bytes(self, which) for which in ("gate_up", "down"))

    def unpacked(self, which: str, dtype: torch.dtype, expert: int | None = None) -> torch.Tensor:
        """Projection `which` in `dtype`: the whole stack `[E, N, K]`, or one expert's `[N, K]`."""
        parts = {part: getattr(self, f"{which}_{part}") for part in ("data", "scales", *_OPTIONAL_PARTS)}
        if expert is not None:
            parts = {part: None if t is None else t[expert] for part, t in parts.items()}
        return dequantize(parts.pop("data"), parts.pop("scales"), self.mode_of(which), dtype, **parts)

    def expert_weights(self, expert: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """One expert's (gate_up `[2I, H]`, down `[H, I]`) in `dtype`."""
        return self.unpacked("gate_up", dtype, expert), self.unpacked("down", dtype, expert)

    def _super(self, which: str) -> tuple[torch.Tensor, torch.Tensor | None] | None:
        """(super scales, super mins) of projection `which` for the kernels; None where it has one level."""
        super_scales = getattr(self, f"{which}_super_scales")
        return None if super_scales is None else (super_scales, getattr(self, f"{which}_super_mins"))

    def _projections(self) -> tuple[tuple[str, int, int], ...]:
        """(mode, group, K) of gate_up and down: what decides whether the kernels take them."""
        projections = []
        for which in ("gate_up", "down"):
            mode, data, scales = self.mode_of(which), getattr(self, f"{which}_data"), getattr(self, f"{which}_scales")
            projections.append((mode, group_of(data, scales, mode), in_features_of(data, mode)))
        return tuple(projections)

    def forward(
        self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
    ) -> torch.Tensor:
        if self._runs_fused(hidden_states.device):
            return self._fused(hidden_states, top_k_index, top_k_weights)
        return self.forward_loop(hidden_states, top_k_index, top_k_weights)

    def add_sums_into(
        self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor,
        into: torch.Tensor,
    ) -> torch.Tensor:  # fmt: skip
        """Add the top-k sums `forward` would round and return into `into` (fp32 `[T, H]`), and return it: the
        fused decoder's one buffer a step, which its post_ffn rounds and clears (kernels/fused_decoder.py).
        `hidden_states` may be `fused_moe.ActivationCodes` in `codes_layout` (the fused path only)."""
        if self._runs_fused(hidden_states.device):
            return self._fused(hidden_states, top_k_index, top_k_weights, into=into)
        return into.add_(self.forward_loop(hidden_states, top_k_index, top_k_weights))

    def codes_layout(self, device: torch.device):
        """The `fused_moe.ActivationCodes` the fused gate_up reads as its input (what the fused decoder's
        post_attention writes for it), or None: it rounds its own, or takes bf16, or does not run fused."""
        if not self._runs_fused(device):
            return None
        from ..kernels.fused_moe import codes_layout, weight_kind

        mode, data, scales = self.mode, self.gate_up_data, self.gate_up_scales
        return codes_layout(weight_kind(mode, self.gate_up_mins), self.activations("gate_up", device),
                            group_of(data, scales, mode))  # fmt: skip

    def _runs_fused(self, device: torch.device) -> bool:
        # The kernel computes the GELU-tanh gate itself: any other activation keeps the loop.
        gelu_tanh = type(self.act_fn).__name__ == "GELUTanh"
        return gelu_tanh and _use_fused(self.backend, device, self._projections())

    def _fused(self, hidden_states, top_k_index, top_k_weights, into: torch.Tensor | None = None) -> torch.Tensor:
        from ..kernels.fused_moe import fused_experts

        device = hidden_states.device
        return fused_experts(
            hidden_states, top_k_index.contiguous(), top_k_weights.contiguous(),
            gate_up_data=self.gate_up_data, gate_up_scales=self.gate_up_scales, gate_up_mins=self.gate_up_mins,
            down_data=self.down_data, down_scales=self.down_scales, down_mins=self.down_mins,
            mode=self.mode, down_mode=self.down_mode,
            activations=self.activations("gate_up", device), down_activations=self.activations("down", device),
            gate_up_super=self._super("gate_up"), down_super=self._super("down"), into=into,
        )  # fmt: skip

    def activations(self, which: str, device: torch.device) -> str:
        """What the fused kernels do with projection `which`'s input (`_activation_kind`)."""
        mode, data, scales = self.mode_of(which), getattr(self, f"{which}_data"), getattr(self, f"{which}_scales")
        return _activation_kind(self.quantize_activations, device, mode, self.int4_activations,
                                getattr(self, f"{which}_mins") is not None, group_of(data, scales, mode))  # fmt: skip

    def activation_groups(self) -> tuple[int, int]:
        """Inputs per activation scale of the w8a8 kernels (gate_up, down): their K step."""
        from ..kernels.fused_moe import block_k_for

        return tuple(block_k_for(group) for _, group, _ in self._projections())

    def forward_loop(
        self,
        hidden_states: torch.Tensor,
        top_k_index: torch.Tensor,
        top_k_weights: torch.Tensor,
        activations: str = "none",
    ) -> torch.Tensor:
        """The torch path: one dequantized expert at a time (CPU, and the kernels' reference).

        `activations` "int8" / "fp8" rounds the input of each matmul the fused kernels would round to that kind
        (`activations`: weights of that kind, or int4 taking int8 activations) as they do (the reference for
        them); any other projection keeps its input as it is.
        """
        gate_up_group, down_group = self.activation_groups() if activations != "none" else (0, 0)
        gate_up_activations, down_activations = (
            activations if activations != "none" and self.activations(which, hidden_states.device) == activations
            else "none"
            for which in ("gate_up", "down")
        )  # fmt: skip
        top_k = top_k_index.shape[-1]
        output = torch.zeros_like(hidden_states)  # [T, H]
        flat_experts = top_k_index.reshape(-1)  # [T*K]
        flat_weights = top_k_weights.reshape(-1)  # [T*K]
        # Sort the (token, slot) pairs by expert once; one host sync for the counts
        # instead of one per expert, and unrouted experts are never touched.
        order = torch.argsort(flat_experts, stable=True)  # [T*K]
        counts = torch.bincount(flat_experts, minlength=self.num_experts).tolist()
        start = 0
        for expert, count in enumerate(counts):
            if count == 0:
                continue
            pairs = order[start : start + count]  # [n]
            start += count
            tokens = pairs // top_k  # [n]
            gate_up, down = self.expert_weights(expert, hidden_states.dtype)
            rows = _fake_quantized(hidden_states[tokens], gate_up_group, gate_up_activations)
            gate, up = nn.functional.linear(rows, gate_up).chunk(2, dim=-1)  # [n, I] each
            inner = _fake_quantized(self.act_fn(gate) * up, down_group, down_activations)
            expert_out = nn.functional.linear(inner, down)  # [n, H]
            expert_out = expert_out * flat_weights[pairs, None]
            output.index_add_(0, tokens, expert_out.to(output.dtype))
        return output


_OPTIONAL_PARTS = ("mins", "super_scales", "super_mins")
"""Buffers a packed projection has only in some forms (affine int4, two-level scales): None otherwise."""


def _packed_parts_bytes(module: nn.Module, which: str) -> int:
    """Resident bytes of projection `which` ("gate_up", "down", "weight") of a packed module: every part it has."""
    parts = [getattr(module, f"{which}_{part}") for part in _OPTIONAL_PARTS]
    return packed_bytes(getattr(module, f"{which}_data"), getattr(module, f"{which}_scales"),
                        *(t for t in parts if t is not None))


def _fake_quantized(rows: torch.Tensor, group: int, activations: str) -> torch.Tensor:
    """`rows` rounded as the w8a8 kernels round their activations (per row, per `group` inputs); as is for none."""
    if activations == "none":
        return rows
    codes, scales = fake_quantize_activations(rows, group, activations)
    return dequantize_activations(codes, scales).to(rows.dtype)


def _activation_kind(quantize_activations: bool, device: torch.device, mode: str, int4_activations: str = "none",
                     affine: bool = False, group: int = 0) -> str:  # fmt: skip
    """What the fused kernels do with activations: the weights' own 8-bit kind (w8a8) where supported; int8 for
    symmetric int4 in whole 64-input groups when asked (w4a8); else none."""
    from ..kernels.expert_kernels import INT4_BLOCK_K
    from ..kernels.fused_moe import w8a8_supported

    if mode == "int4":
        w4a8 = int4_activations == "int8" and not affine and group % INT4_BLOCK_K == 0
        return "int8" if w4a8 and w8a8_supported(device, "int8") else "none"
    return mode if quantize_activations and w8a8_supported(device, mode) else "none"


def _use_fused(backend: str, device: torch.device, projections: tuple[tuple[str, int, int], ...]) -> bool:
    """Whether a forward runs the Triton kernels on every one of its `projections` ((mode, group, K) each);
    imports them (and triton) only when they could apply."""
    if backend == "torch" or (backend == "auto" and device.type != "cuda"):
        return False
    from ..kernels.fused_moe import fused_supported

    supported = all(fused_supported(device, mode, group, in_features=(k,)) for mode, group, k in projections)
    assert supported or backend == "auto", (
        f"backend 'triton' cannot run (mode, group, K) {projections} on {device} (CPU needs"
        " TRITON_INTERPRET=1; fp8 needs sm_89+; groups must be >= 16; int4 needs K % 64 == 0)"
    )
    return supported


def _quantize_per_expert(
    stack: torch.Tensor, mode: str, group_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize `[E, N, K]` one expert at a time: the fp32 temporaries stay one expert big
    (a whole full-size layer in fp32 would be 2 GB per temporary next to a 52 GB bf16 model)."""
    packed = [quantize(stack[expert], mode, group_size) for expert in range(stack.shape[0])]
    return torch.stack([data for data, _ in packed]), torch.stack([scales for _, scales in packed])


class QuantizedLinear(nn.Module):
    """Drop-in for a bias-free `nn.Linear` holding a packed weight (in any form an experts projection takes),
    dequantized per call."""

    def __init__(self, *, mode: str, in_features: int, out_features: int) -> None:
        super().__init__()
        assert mode in PACKED_MODES, f"QuantizedLinear needs a packed mode, got {mode!r}"
        self.mode = mode
        self.in_features = in_features
        self.out_features = out_features
        self.register_buffer("weight_data", torch.empty(0, dtype=torch.uint8))
        self.register_buffer("weight_scales", torch.empty(0))
        for part in _OPTIONAL_PARTS:  # affine int4, two-level scales (QuantizedExperts)
            self.register_buffer(f"weight_{part}", None)
        self.backend: Backend = "auto"
        """auto: the fused dequant-GEMM on CUDA where it applies, else dequantize + F.linear."""
        self.quantize_activations = True
        """8-bit modes on the fused path: activations quantized per row in the kernel (w8a8) where the card takes them."""
        self.int4_activations = "none"
        """"int8": symmetric int4 on the fused path meets activations quantized per row (w4a8)."""

    @classmethod
    def from_linear(cls, linear: nn.Linear, mode: str, group_size: int) -> QuantizedLinear:
        assert linear.bias is None, "the DiffusionGemma text linears have no bias; a biased one would lose it"
        module = cls(mode=mode, in_features=linear.in_features, out_features=linear.out_features)
        module.weight_data, module.weight_scales = quantize(linear.weight, mode, group_size)
        return module

    def resident_bytes(self) -> int:
        return _packed_parts_bytes(self, "weight")

    def unpacked(self, dtype: torch.dtype) -> torch.Tensor:
        """The weight `[out, in]` in `dtype`."""
        return dequantize(self.weight_data, self.weight_scales, self.mode, dtype, mins=self.weight_mins,
                          super_scales=self.weight_super_scales, super_mins=self.weight_super_mins)

    def stack_with(self, others: tuple[nn.Module, ...]) -> StackedLinears | None:
        """This linear and `others` (ones that read the same input) as one launch, or None when they cannot
        share one: another kind of module, another form (mode, group, parts, dtypes, backend, activations),
        or a form the fused kernels do not run on this device. The fused decoder asks (kernels/fused_decoder.py)."""
        modules = (self, *others)
        if not all(isinstance(m, QuantizedLinear) for m in modules) or len({id(m) for m in modules}) < len(modules):
            return None
        if len({m._form() for m in modules}) != 1 or not self._runs_fused(self.weight_data.device):
            return None
        return StackedLinears(modules)

    def _form(self) -> tuple:
        parts = tuple(None if t is None else (t.dtype, t.shape[:-1]) for t in self._parts())
        return (self.mode, self.in_features, self.weight_data.dtype, self.weight_scales.dtype,
                self.weight_scales.shape[:-1], parts, self.backend, self.quantize_activations, self.int4_activations)

    def _parts(self) -> tuple[torch.Tensor | None, ...]:
        return tuple(getattr(self, f"weight_{part}") for part in _OPTIONAL_PARTS)

    def _runs_fused(self, device: torch.device) -> bool:
        group = group_of(self.weight_data, self.weight_scales, self.mode)
        return _use_fused(self.backend, device, ((self.mode, group, self.in_features),))

    def activations(self, device: torch.device) -> str:
        """What the fused kernel does with the input (`_activation_kind`)."""
        return _activation_kind(self.quantize_activations, device, self.mode, self.int4_activations,
                                self.weight_mins is not None, group_of(self.weight_data, self.weight_scales, self.mode))

    def codes_layout(self, device: torch.device):
        """The `fused_moe.ActivationCodes` the fused launch reads as its input, or None (`QuantizedExperts`')."""
        if not self._runs_fused(device):
            return None
        from ..kernels.fused_moe import codes_layout, weight_kind

        return codes_layout(weight_kind(self.mode, self.weight_mins), self.activations(device),
                            group_of(self.weight_data, self.weight_scales, self.mode))  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """`x @ weight.T`; x may be `fused_moe.ActivationCodes` in `codes_layout` (the fused path only)."""
        if self._runs_fused(x.device):
            from ..kernels.fused_moe import fused_linear

            return fused_linear(x, self.weight_data, self.weight_scales, self.mode, mins=self.weight_mins,
                                activations=self.activations(x.device), super_scales=self.weight_super_scales,
                                super_mins=self.weight_super_mins)
        return nn.functional.linear(x, self.unpacked(x.dtype))

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, mode={self.mode}"


class StackedLinears:
    """Quantized linears that read one input, run as one launch: an attention's q / k / v projections, an MLP's
    gate and up (`gated`: with GELU-tanh(gate) x up in the kernel's epilogue).

    Built once, when the fused decoder is (`QuantizedLinear.stack_with`): the packed weights are stacked along
    N, and each member's buffers become views of the stack (its rows of the data, its columns of the scales,
    mins and super scales), so the stack costs no memory and each member still runs alone (transformers'
    decoder, the torch path, a save). Each output column is the member's own dot product over the same K
    steps; only the launch is shared: a step launches one kernel where it launched two or three.
    """

    def __init__(self, modules: tuple[QuantizedLinear, ...]) -> None:
        self.modules = modules
        self.widths = tuple(m.out_features for m in modules)
        self.starts = tuple(itertools.accumulate(self.widths[:-1], initial=0))
        self.data = torch.cat([m.weight_data for m in modules])
        self.scales = torch.cat([m.weight_scales for m in modules], dim=-1)
        self.parts = tuple(None if first is None else torch.cat([m._parts()[i] for m in modules], dim=-1)
                           for i, first in enumerate(modules[0]._parts()))  # fmt: skip
        for module, start, width in zip(modules, self.starts, self.widths, strict=True):
            rows = slice(start, start + width)
            module.weight_data, module.weight_scales = self.data[rows], self.scales[..., rows]
            for part, stacked in zip(_OPTIONAL_PARTS, self.parts, strict=True):
                if stacked is not None:
                    setattr(module, f"weight_{part}", stacked[..., rows])

    def runs_fused(self, device: torch.device) -> bool:
        """Whether the launch applies now (a member's backend may have been set to torch since)."""
        return all(module._runs_fused(device) for module in self.modules)

    def codes_layout(self, device: torch.device):
        """The `fused_moe.ActivationCodes` the launch reads as its input, or None (`QuantizedLinear.codes_layout`)."""
        return self.modules[0].codes_layout(device) if self.runs_fused(device) else None

    def __call__(self, x, *, gated: bool = False, codes_out=None):
        """Each member's output, as column views of one result; `gated` (gate and up): gelu_tanh(gate) * up.
        `x` may be `fused_moe.ActivationCodes` in `codes_layout`; `codes_out` (gated): the result as
        `ActivationCodes` in that layout (the next launch's, the down's `codes_layout`)."""
        from ..kernels.fused_moe import fused_linear

        first = self.modules[0]
        assert not gated or (len(self.widths) == 2 and self.widths[0] == self.widths[1]), "gated: a gate and an up"
        mins, super_scales, super_mins = self.parts
        out = fused_linear(x, self.data, self.scales, first.mode, mins=mins,
                           activations=first.activations(x.device), super_scales=super_scales,
                           super_mins=super_mins, gated=gated, codes_out=codes_out)  # fmt: skip
        if gated:
            return out
        return tuple(out[..., start:start + width] for start, width in zip(self.starts, self.widths, strict=True))


def quantize_model(
    model: nn.Module, mode: Mode, *, group_size: int = DEFAULT_GROUP_SIZE, int4_activations: str = "none"
) -> QuantizationReport:
    """Quantize `model` (a DiffusionGemmaForBlockDiffusion) in place; the old weights are freed.

    Call after the model is on its device: quantizing on the GPU is fast and the
    bf16 tensors leave memory as each module is replaced. `int4_activations="int8"`
    sets every int4 module's `int4_activations` (w4a8; benches only so far).
    """
    assert int4_activations in ("none", "int8"), f"int4 activations are none or int8, got {int4_activations!r}"
    assert mode in MODES, f"quantization must be one of {MODES}, got {mode!r}"
    experts_groups, linear_groups = _quantizable_modules(model)
    expert_before = sum(
        _param_bytes(modules[0][1].gate_up_proj, modules[0][1].down_proj) for modules in experts_groups
    )
    linear_before = sum(_param_bytes(modules[0][1].weight) for modules in linear_groups)
    if mode == "none":
        return QuantizationReport(
            mode=mode,
            group_size=group_size,
            expert_bytes_before=expert_before,
            expert_bytes_after=expert_before,
            linear_bytes_before=linear_before,
            linear_bytes_after=linear_before,
            expert_modules=0,
            linear_modules=0,
        )
    expert_after = linear_after = 0
    expert_count, linear_count = len(experts_groups), len(linear_groups)
    with torch.no_grad():
        # Pop each group so its full-precision module is unreferenced (and freed) once replaced:
        # peak memory is the model plus one layer's temporaries, not the model twice.
        while experts_groups:
            modules = experts_groups.pop()
            quantized = QuantizedExperts.from_experts(modules[0][1], mode, group_size)
            quantized.int4_activations = int4_activations
            expert_after += quantized.resident_bytes()
            for name, _ in modules:
                _replace_module(model, name, quantized)
            del modules
        while linear_groups:
            modules = linear_groups.pop()
            quantized = QuantizedLinear.from_linear(modules[0][1], mode, group_size)
            quantized.int4_activations = int4_activations
            linear_after += quantized.resident_bytes()
            for name, _ in modules:
                _replace_module(model, name, quantized)
            del modules
    model._dgemma_quantization = (mode, group_size)  # read by save_quantized
    return QuantizationReport(
        mode=mode,
        group_size=group_size,
        expert_bytes_before=expert_before,
        expert_bytes_after=expert_after,
        linear_bytes_before=linear_before,
        linear_bytes_after=linear_after,
        expert_modules=expert_count,
        linear_modules=linear_count,
    )


def save_quantized(model: nn.Module, folder: Path, *, shard_bytes: int = DEFAULT_SHARD_BYTES) -> None:
    """Write the whole quantized model (every tensor once) to `folder`, replacing what was there.

    Tensors go to host memory one shard (about `shard_bytes`) at a time, so saving a
    model that lives on the GPU never needs a host copy of all of it.
    """
    from safetensors.torch import save_file

    mode, group_size = getattr(model, "_dgemma_quantization", ("none", DEFAULT_GROUP_SIZE))
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / MANIFEST_FILE).unlink(missing_ok=True)  # the folder is incomplete until the manifest is back
    unique: dict[int, str] = {}
    canonical_tensors: list[tuple[str, torch.Tensor]] = []
    aliases: dict[str, str] = {}
    kinds: dict[str, str] = {}
    for name, tensor, kind in all_tensors(model):
        kinds[name] = kind
        canonical = unique.setdefault(id(tensor), name)
        if canonical == name:
            canonical_tensors.append((name, tensor))
        else:
            aliases[name] = canonical
    replaced = {
        name: {"kind": type(module).__name__, "mode": module.mode, **_module_shape(module)}
        for name, module in model.named_modules(remove_duplicate=False)
        if isinstance(module, QuantizedExperts | QuantizedLinear)
    }
    files: list[str] = []
    shard: dict[str, torch.Tensor] = {}
    size = 0

    def flush() -> None:
        nonlocal shard, size
        name = WEIGHTS_SHARD.format(len(files) + 1)
        # A temporary name first: a crash mid-save must not leave a folder that looks complete.
        save_file(shard, folder / (name + ".partial"))
        (folder / (name + ".partial")).replace(folder / name)
        files.append(name)
        shard, size = {}, 0

    for name, tensor in canonical_tensors:
        shard[name] = tensor.detach().contiguous().cpu()
        if shard[name]._base is not None:  # a view of a stack (StackedLinears): safetensors takes no shared storage
            shard[name] = shard[name].clone()
        size += tensor.numel() * tensor.element_size()
        if size >= shard_bytes:
            flush()
    if shard or not files:
        flush()
    manifest = {
        "format_version": SAVE_FORMAT_VERSION,
        "mode": mode,
        "group_size": group_size,
        "files": files,
        "modules": replaced,
        "aliases": aliases,
        "kinds": kinds,
    }
    (folder / (MANIFEST_FILE + ".partial")).write_text(json.dumps(manifest, indent=1), "utf-8")
    (folder / (MANIFEST_FILE + ".partial")).replace(folder / MANIFEST_FILE)


def saved_format_version(folder: Path) -> int | None:
    """The format version of the packed weights in `folder`, or None when there are none (or half)."""
    try:
        return int(json.loads((Path(folder) / MANIFEST_FILE).read_text("utf-8"))["format_version"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def load_quantized(
    model_skeleton: nn.Module,
    folder: Path,
    *,
    device: str | torch.device = "cpu",
    progress: Callable[[int, int], None] | None = None,
) -> QuantizationReport:
    """Fill `model_skeleton` in place from a folder written by `save_quantized`, one shard at a time.

    The skeleton is an unquantized DiffusionGemma of the same config; build it on
    the meta device so no memory or time goes into weights that are about to be
    replaced:
        with torch.device("meta"): model = TextOnlyDiffusionGemma(config)
        load_quantized(model, folder, device="cuda")
    `progress(done, total)` runs after each shard. The expert/linear byte counts in
    the returned report are of the loaded packed tensors; "before" is what the
    same tensors take in bf16.
    """
    from safetensors import safe_open

    folder = Path(folder)
    manifest = json.loads((folder / MANIFEST_FILE).read_text("utf-8"))
    assert manifest["format_version"] == SAVE_FORMAT_VERSION, (
        f"{folder} holds quantization format {manifest['format_version']}, this build reads {SAVE_FORMAT_VERSION}"
    )
    shared: dict[tuple, nn.Module] = {}
    for name, spec in manifest["modules"].items():
        original = model_skeleton.get_submodule(name)
        # Modules that shared weights before saving share one quantized module again.
        key = (
            spec["kind"],
            *(manifest["aliases"].get(f"{name}.{b}", f"{name}.{b}") for b in _buffers_of(spec)),
        )
        if key not in shared:
            shared[key] = _empty_quantized(spec, original)
        _replace_module(model_skeleton, name, shared[key])
    names_of: dict[str, list[str]] = {}
    for name in manifest["kinds"]:
        names_of.setdefault(manifest["aliases"].get(name, name), []).append(name)
    if progress is not None:
        progress(0, len(manifest["files"]))
    for done, file in enumerate(manifest["files"], start=1):
        with safe_open(str(folder / file), framework="pt", device=str(device)) as shard:
            for canonical in shard.keys():
                tensor = shard.get_tensor(canonical)
                params: dict[int, nn.Parameter] = {}  # per tensor: ids of freed tensors get reused
                for name in names_of.get(canonical, []):
                    _assign(model_skeleton, name, tensor, manifest["kinds"][name], params)
        if progress is not None:
            progress(done, len(manifest["files"]))
    leftovers = [n for n, t, _ in all_tensors(model_skeleton) if t.device.type == "meta"]
    assert not leftovers, f"{folder} does not cover the skeleton: {leftovers[:5]}"
    model_skeleton._dgemma_quantization = (manifest["mode"], manifest["group_size"])
    if manifest["mode"] == "none":
        return quantize_model(model_skeleton, "none", group_size=manifest["group_size"])
    return _report_from_loaded(model_skeleton, manifest["mode"], manifest["group_size"])


def _quantizable_modules(
    model: nn.Module,
) -> tuple[list[list[tuple[str, nn.Module]]], list[list[tuple[str, nn.Module]]]]:
    """Experts and text linears, grouped by the tensor they hold (tied positions share a group)."""
    experts: dict[int, list[tuple[str, nn.Module]]] = {}
    linears: dict[int, list[tuple[str, nn.Module]]] = {}
    for name, module in model.named_modules(remove_duplicate=False):
        if type(module).__name__ == "DiffusionGemmaTextExperts":
            experts.setdefault(id(module.gate_up_proj), []).append((name, module))
        elif isinstance(module, nn.Linear) and _is_quantized_linear(name):
            linears.setdefault(id(module.weight), []).append((name, module))
    return list(experts.values()), list(linears.values())


def _is_quantized_linear(name: str) -> bool:
    in_text = name.startswith(
        ("model.encoder.language_model.layers.", "model.decoder.layers.", "model.decoder.self_conditioning.")
    )
    return in_text and not name.endswith("router.proj")


def _param_bytes(*tensors: torch.Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _replace_module(model: nn.Module, name: str, module: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent_name) if parent_name else model, child, module)


def all_tensors(model: nn.Module):
    """(name, tensor, kind) for every parameter and buffer, tied names included, non-persistent buffers too."""
    for module_name, module in model.named_modules(remove_duplicate=False):
        prefix = f"{module_name}." if module_name else ""
        for name, param in module._parameters.items():
            if param is not None:
                yield prefix + name, param, "parameter"
        for name, buffer in module._buffers.items():
            if buffer is not None:
                yield prefix + name, buffer, "buffer"


def _assign(
    model: nn.Module, name: str, tensor: torch.Tensor, kind: str, params: dict[int, nn.Parameter]
) -> None:
    """Set one loaded tensor; tied names get the same Parameter object, as after from_pretrained."""
    module_name, _, attr = name.rpartition(".")
    module = model.get_submodule(module_name) if module_name else model
    if kind == "parameter":
        if id(tensor) not in params:
            params[id(tensor)] = nn.Parameter(tensor, requires_grad=False)
        module._parameters[attr] = params[id(tensor)]
    else:
        persistent = attr not in module._non_persistent_buffers_set
        module.register_buffer(attr, tensor, persistent=persistent)


def _empty_quantized(spec: dict, original: nn.Module) -> nn.Module:
    if spec["kind"] == "QuantizedExperts":
        return QuantizedExperts(mode=spec["mode"], num_experts=spec["num_experts"], act_fn=original.act_fn,
                                down_mode=spec["down_mode"])
    assert spec["kind"] == "QuantizedLinear", f"unknown quantized module kind {spec['kind']!r}"
    return QuantizedLinear(
        mode=spec["mode"], in_features=spec["in_features"], out_features=spec["out_features"]
    )


def _module_shape(module: nn.Module) -> dict:
    if isinstance(module, QuantizedExperts):
        return {"num_experts": module.num_experts, "down_mode": module.down_mode}
    return {"in_features": module.in_features, "out_features": module.out_features}


def _buffers_of(spec: dict) -> tuple[str, ...]:
    if spec["kind"] == "QuantizedExperts":
        return ("gate_up_data",)
    return ("weight_data",)


def _report_from_loaded(model: nn.Module, mode: str, group_size: int) -> QuantizationReport:
    experts = {id(m): m for m in model.modules() if isinstance(m, QuantizedExperts)}
    linears = {id(m): m for m in model.modules() if isinstance(m, QuantizedLinear)}

    def bf16_bytes(module: nn.Module) -> int:
        if isinstance(module, QuantizedExperts):
            packed = [(module.gate_up_data, module.mode), (module.down_data, module.down_mode)]
        else:
            packed = [(module.weight_data, module.mode)]
        return sum(2 * data.numel() * values_per_element(mode) for data, mode in packed)

    return QuantizationReport(
        mode=mode,
        group_size=group_size,
        expert_bytes_before=sum(bf16_bytes(m) for m in experts.values()),
        expert_bytes_after=sum(m.resident_bytes() for m in experts.values()),
        linear_bytes_before=sum(bf16_bytes(m) for m in linears.values()),
        linear_bytes_after=sum(m.resident_bytes() for m in linears.values()),
        expert_modules=len(experts),
        linear_modules=len(linears),
    )
