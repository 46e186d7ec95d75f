"""The DiffusionGemma decoder's forward for one denoising step, with the non-expert work in fused kernels.

Owns the order of a step's decoder work when `compiled_step` runs it fused: the self-conditioning
signal, the canvas embedding, then per layer the projections (the model's own linear modules,
quantized or not), the head norms and rotary embedding, attention over the static cache plus the
canvas, the dense MLP, the router and the experts (the model's own experts module), with the norms,
residual adds and layer scalars between them in `fused_layer` kernels. Knows transformers'
DiffusionGemma layer structure (5.24) and its StaticCache layout; knows nothing of requests or graphs.

A layer is then: the q/k/v projections, one launch for the head norms, the rotary embedding and
the key/value buffer, attention, its output copied into o_proj's head order, o_proj, one
post-attention norm launch, the dense MLP, one router launch (its projection, top-k and weights:
`fused_layer.route`, which reads router.proj's weight, a bias-free Linear the weights room never
quantizes), the experts' own launches, one post-feed-forward norm launch, against ~150 kernels of
transformers' eager layer (`make dryrun`'s deviceKernelsPerStep counts them per step). Quantized
projections that read one input share a launch (`QuantizedLinear.stack_with`, in the weights room):
q/k/v are one GEMM, and the MLP's gate and up one gated GEMM with GELU-tanh x up in its epilogue,
then down: 10 + the experts' launches a layer. Unquantized (bf16) weights keep a launch a projection
and the GELU x up kernel: 14 + the experts' (13 on full-attention layers, whose v is k).
Attention is grouped-query attention with a mask, which no fused SDPA kernel reads in place; so each
key/value head is built once for SDPA and its group's query heads are folded into one sequence
(`fold_mask`): the key/value buffers a step moves shrink by the group size (2 on sliding layers, 8 on
full ones; 7.63 -> 1.74 GB at 4 candidates and a 4,096-token prompt, `make dryrun`), for one copy of
SDPA's output (~2 MB a layer and candidate) into o_proj's head order.
Quantized experts add their fp32 top-k sums into one buffer a step (`QuantizedExperts.add_sums_into`,
zeroed once), which post_ffn rounds as their cast did and clears for the next layer: no zero fill and
no cast a layer.
With `launch_settings(activation_codes=True)` the w8a8 / w4a8 launches read activations rounded once
(`fused_moe.ActivationCodes`), and the launch producing them writes them: the norms for q/k/v, the
dense MLP, the experts and the self-conditioning MLP, each gated GEMM for its down. Each consumer
names the layout it reads (`codes_layout`: kind and inputs per scale); only o_proj, whose input is
SDPA's, rounds in a launch of its own.

What stays transformers': every weight and module (so quantization and the experts' kernels are
whatever the model holds), the attention mask (`create_diffusion_decoder_attention_mask`, built per
canvas) and the rotary tables (`rotary_emb`, per canvas). Where the model differs from what this
forward implements (`unsupported`), the step keeps transformers' decoder.

Why hand-placed Triton kernels rather than `torch.compile` of the layer inside the captured graph:
nothing of inductor's CUDA output can be shown without a GPU (it compiles for the card it sees: on
CPU it emits C++, under fake tensors it runs nothing), so neither its numerics nor its kernel count
could be checked here, where a GPU comes for minutes; it adds compilation to each load, per
(candidates, length bucket) shape; and `make dryrun`'s operator watcher would see a compiled region
as one opaque call. Custom ops are one launch each to every one of those tools, run in Triton's
interpreter in the tests, and a CUDA graph captures them like any kernel.
"""

from __future__ import annotations

import contextlib
import contextvars

import torch

from . import fused_layer
from .fused_moe import ActivationCodes, CodesLayout


def unsupported(model) -> str | None:
    """Why this forward cannot run `model`'s decoder exactly, or None."""
    config = model.config.get_text_config(decoder=True)
    decoder = model.model.decoder
    if config._attn_implementation != "sdpa":
        return f"attention implementation {config._attn_implementation!r} (the fused forward calls SDPA)"
    if getattr(config, "attention_bias", False):
        return "attention projections with a bias"
    if config.hidden_activation != "gelu_pytorch_tanh":
        return f"activation {config.hidden_activation!r} (the kernel computes GELU-tanh)"
    top_k = config.top_k_experts
    if top_k & (top_k - 1):
        return f"top_k {top_k} is not a power of two"
    for layer in decoder.layers:
        dim = layer.self_attn.head_dim
        if dim & (dim - 1):
            return f"head_dim {dim} is not a power of two"
        # The route kernel multiplies by router.proj's weight itself: transformers' bias-free Linear, which the
        # weights room never quantizes (quantization.py keeps router projections in full precision).
        proj = layer.router.proj
        if type(proj) is not torch.nn.Linear or proj.bias is not None:
            return f"router projection {type(proj).__name__} (the route kernel reads a bias-free Linear's weight)"
    return None


class FusedDecoder:
    """`forward` computes what `decoder(...)` + its final norm computes for a step, in fused launches."""

    def __init__(self, model) -> None:
        reason = unsupported(model)
        assert reason is None, f"the fused decoder cannot run this model: {reason}"
        self.decoder = model.model.decoder
        self.config = model.config.get_text_config(decoder=True)
        self.layer_types: list[str] = list(self.config.layer_types)
        embed = self.decoder.embed_tokens
        # transformers multiplies by `embed_scale.to(dtype)`: the scale as the embeddings' dtype holds it
        # (sqrt(2816) = 53.07 is 53.0 in bf16). From the host float, so no device read.
        self.embed_scale = float(torch.tensor(embed.scalar_embed_scale).to(embed.weight.dtype))
        self.eps = float(self.config.rms_norm_eps)
        # One launch for the projections of one input, where their weights can share it (else None).
        self.qkv = [_stacked(layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj)
                    for layer in self.decoder.layers]  # fmt: skip
        self.gate_up = [_stacked(layer.mlp.gate_proj, layer.mlp.up_proj) for layer in self.decoder.layers]
        block = self.decoder.self_conditioning
        self.signal_gate_up = _stacked(block.gate_proj, block.up_proj)
        # Query heads per key/value head, per layer type (q and k heads have one width).
        self.groups: dict[str, int] = {}
        for layer_type, layer in zip(self.layer_types, self.decoder.layers, strict=True):
            attention = layer.self_attn
            group = attention.q_proj.out_features // attention.k_proj.out_features
            assert self.groups.setdefault(layer_type, group) == group, f"{layer_type} layers group heads alike"

    def rotary(self, positions: torch.Tensor, dtype: torch.dtype) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """Per layer type, (cos, sin) `[L, D]` of `positions` `[1, L]` as transformers' rotary_emb gives them."""
        probe = torch.empty(0, dtype=dtype, device=positions.device)
        tables = {}
        for layer_type in set(self.layer_types):
            cos, sin = self.decoder.rotary_emb(probe, positions, layer_type)  # [1, L, D] each
            tables[layer_type] = (cos[0], sin[0])
        return tables

    def forward(
        self,
        canvas: torch.Tensor,  # [B, L] int64
        logits: torch.Tensor,  # [B, L, V]: the last step's tempered logits (self-conditioning)
        self_conditioning_on: torch.Tensor,  # [B] bool
        cache,  # StaticCache holding the prompt
        masks: dict,  # layer type -> [B, 1, L, M + L] bool mask, or None; or as `attention_masks` folds them
        rotary: dict[str, tuple[torch.Tensor, torch.Tensor]],  # layer type -> (cos, sin) [L, D]
    ) -> torch.Tensor:
        """The decoder's last hidden state after its final norm, `[B * L, H]`."""
        decoder = self.decoder
        batch, length = canvas.shape
        vocab = logits.shape[-1]
        # Self-conditioning: softmax of the last logits (one launch, bf16 probabilities as transformers'
        # `.softmax(dtype=float32).to(bf16)`), their product with the embeddings (transformers' GEMM), then
        # the scale, the row mask and the block's pre-norm in one launch.
        rows = logits.view(batch * length, vocab)  # [T, V]
        probabilities = torch.empty_like(rows)
        fused_layer.softmax_rows(rows, probabilities)
        soft = torch.mm(probabilities, decoder.embed_tokens.weight)  # [T, H]
        del probabilities  # [T, V]: 0.5 GB at 4 candidates, not to be held through the layers
        block = decoder.self_conditioning
        device = canvas.device
        # Where a quantized launch rounds its activations ahead of it (`launch_settings(activation_codes=True)`),
        # the launch producing them writes them: the norms, and a gated GEMM for its down (`_Codes`).
        signal_codes = _Codes(_layout(self.signal_gate_up, device), soft)
        normed = fused_layer.signal_norm(soft, self_conditioning_on, block.pre_norm.weight, length,
                                         self.embed_scale, self.eps, *signal_codes.buffers)  # fmt: skip
        signal = block.down_proj(_gelu_mul(block, self.signal_gate_up, signal_codes.of(normed), device))
        layers = decoder.layers
        next_codes = _Codes(_layout(self.qkv[0], device), signal)
        hidden, layer_input = fused_layer.step_input(
            canvas.view(-1), decoder.embed_tokens.weight, signal, layers[0].input_layernorm.weight,
            self.embed_scale, self.eps, *next_codes.buffers,
        )  # fmt: skip
        sums = None  # the quantized experts' fp32 top-k sums: one buffer a step, zeroed once, post_ffn clears it
        for index, layer in enumerate(layers):
            layer_type = self.layer_types[index]
            attended = self._attention(layer.self_attn, self.qkv[index], next_codes.of(layer_input),
                                       cache.layers[index], masks.get(layer_type), rotary[layer_type], batch,
                                       length)  # fmt: skip
            mlp_codes = _Codes(_layout(self.gate_up[index], device), hidden)
            experts_codes = _Codes(_layout(layer.experts, device), hidden)
            hidden, mlp_in, experts_in, router_in = fused_layer.post_attention(
                attended, hidden, layer.post_attention_layernorm.weight, layer.pre_feedforward_layernorm.weight,
                layer.pre_feedforward_layernorm_2.weight, layer.router.scale, self.eps, layer.router.scalar_root_size,
                *mlp_codes.buffers, *experts_codes.buffers,
            )  # fmt: skip
            dense = layer.mlp.down_proj(_gelu_mul(layer.mlp, self.gate_up[index], mlp_codes.of(mlp_in), device))
            router = layer.router  # its projection, softmax, top-k, renormalisation and per-expert scale: one launch
            weights, experts = fused_layer.route(router_in, router.proj.weight, router.per_expert_scale,
                                                 self.config.top_k_experts)  # fmt: skip
            add_sums_into = getattr(layer.experts, "add_sums_into", None)  # QuantizedExperts'
            if add_sums_into is not None:
                sums = torch.zeros(hidden.shape, dtype=torch.float32, device=hidden.device) if sums is None else sums
                routed = add_sums_into(experts_codes.of(experts_in), experts, weights, sums)
            else:
                routed = layer.experts(experts_in, experts, weights)
            last = index + 1 == len(layers)
            following = decoder.norm if last else layers[index + 1].input_layernorm
            next_codes = _Codes(None if last else _layout(self.qkv[index + 1], device), hidden)
            hidden, layer_input = fused_layer.post_ffn(
                dense, routed, hidden, layer.post_feedforward_layernorm_1.weight,
                layer.post_feedforward_layernorm_2.weight, layer.post_feedforward_layernorm.weight,
                layer.layer_scalar, following.weight, self.eps, add_sums_into is not None, *next_codes.buffers,
            )  # fmt: skip
        return layer_input  # the last layer's "next norm" is the decoder's final norm

    def _attention(self, attention, qkv, x, cache_layer, mask, rotary, batch: int, length: int) -> torch.Tensor:
        """transformers' DiffusionGemmaDecoderTextAttention on a StaticCache layer: `[T, H]` (or its q/k/v launch's
        `ActivationCodes`) -> o_proj output."""
        dim = attention.head_dim
        if qkv is not None and qkv.runs_fused(x.device):  # one launch; column views of its output
            query, key, *value = qkv(x)  # [T, Hq * D], [T, Hkv * D] (, [T, Hkv * D])
            value = value[0] if value else key  # full-attention layers: v = k
        else:
            query = attention.q_proj(x)  # [T, Hq * D]
            key = attention.k_proj(x)  # [T, Hkv * D]
            value = attention.v_proj(x) if attention.v_proj is not None else key  # full-attention layers: v = k
        heads = query.shape[-1] // dim
        kv_heads = cache_layer.keys.shape[1]
        group = heads // kv_heads  # query heads a key/value head serves
        causal = mask is None and attention.is_causal and length > 1
        fold = not causal and _fold_groups()
        # transformers' `append_to_cache` makes a new tensor of the cache, then the canvas at
        # cumulative_length + [0, L), then zeros; here with the head norms and the rotary embedding, in one
        # launch, each key/value head once: each group's query heads are folded into one sequence of
        # group x L queries (`fold_mask`), so SDPA reads a cache row once a group, not once a query head
        # (what transformers' `repeat_kv` copies: masked SDPA has no kernel that reads grouped heads in place,
        # `enable_gqa` then falls back to the math kernel). A causal mask does not fold: those repeat the heads.
        cos, sin = rotary
        queries, keys, values = fused_layer.attention_inputs(
            query, key, value, attention.q_norm.weight, attention.k_norm.weight, cos, sin, cache_layer.keys,
            cache_layer.values, cache_layer.cumulative_length, length, self.eps, grouped=fold,
        )  # fmt: skip
        if fold:  # [B, Hq, L, D] as [B, Hkv, group * L, D]: query head g * group + r is rows r * L + [0, L)
            queries = queries.view(batch, kv_heads, group * length, dim)
            mask = fold_mask(mask, group, length)
        elif mask is not None and mask.shape[-2] != length:  # folded, for a step run unfolded: its first L rows
            mask = mask[:, :, :length]
        output = torch.nn.functional.scaled_dot_product_attention(
            queries, keys, values, attn_mask=mask, dropout_p=0.0, scale=attention.scaling, is_causal=causal,
        )  # fmt: skip
        del queries, keys, values  # [B, Hkv, M + L, D] each: not to be held for o_proj
        if not fold:
            output = output.transpose(1, 2)  # [B, L, Hq, D]
        else:  # [B, Hkv, group * L, D] -> [B, L, Hkv, group, D]: head g * group + r
            output = output.unflatten(2, (group, length)).permute(0, 3, 1, 2, 4)
        return attention.o_proj(output.reshape(batch * length, heads * dim))

    def attention_masks(self, masks: dict) -> dict:
        """transformers' decoder masks (layer type -> `[B, 1, L, M + L]` bool, or None) folded as `_attention` reads
        them (`fold_mask`), for a caller that keeps them for many steps (`compiled_step`'s step buffers): folded
        once a canvas, not in every step; as they are under `attention_settings(fold_groups=False)`."""
        if not _fold_groups():
            return dict(masks)
        return {name: fold_mask(mask, self.groups[name], mask.shape[-2]) if isinstance(mask, torch.Tensor) else mask
                for name, mask in masks.items()}  # fmt: skip


_FOLD_GROUPS: contextvars.ContextVar[bool] = contextvars.ContextVar("dgemma_fold_groups", default=True)


@contextlib.contextmanager
def attention_settings(*, fold_groups: bool):
    """Run the fused decoder's attention in this context with each group's query heads folded into one sequence
    against each key/value head once (True, the default), or against key/value heads repeated for every query
    head (False: transformers' `repeat_kv` layout; the A/B of `bench step --attention repeated`). Read when a step
    is built: a CUDA graph keeps what it captured."""
    token = _FOLD_GROUPS.set(fold_groups)
    try:
        yield
    finally:
        _FOLD_GROUPS.reset(token)


@torch.compiler.assume_constant_result
def _fold_groups() -> bool:
    return _FOLD_GROUPS.get()


def fold_mask(mask: torch.Tensor | None, group: int, length: int) -> torch.Tensor | None:
    """A `[B, 1, L, K]` attention mask for queries folded `group` heads into one sequence (`[B, 1, group * L, K]`:
    row r * L + i is row i); a mask already folded (or None) as it is."""
    if mask is None or group == 1 or mask.shape[-2] == group * length:
        return mask
    assert mask.shape[-2] == length, f"a mask of {mask.shape[-2]} query rows for {length} queries"
    return mask.repeat(1, 1, group, 1)


def _stacked(first, *others):
    """The quantized projections of one input as one launch (`QuantizedLinear.stack_with`), or None: a bf16
    `nn.Linear` has no `stack_with`; absent projections (a full-attention layer's v) are left out."""
    stack_with = getattr(first, "stack_with", None)
    return stack_with(tuple(m for m in others if m is not None)) if stack_with is not None else None


def _gelu_mul(mlp, gate_up, x, device: torch.device):
    """gelu_tanh(mlp.gate_proj(x)) * mlp.up_proj(x): one gated GEMM where the weights are stacked (x may be its
    `ActivationCodes`; its result is mlp.down_proj's where that launch reads codes), else three launches (each
    projection, then `fused_layer.gelu_mul`, which rounds where transformers does)."""
    if gate_up is not None and gate_up.runs_fused(device):
        return gate_up(x, gated=True, codes_out=_layout(mlp.down_proj, device))
    return fused_layer.gelu_mul(mlp.gate_proj(x), mlp.up_proj(x))


def _layout(consumer, device: torch.device) -> CodesLayout | None:
    """The `ActivationCodes` layout a consumer's launch reads (a quantized linear, stack or experts module's
    `codes_layout`), or None: it rounds its own activations, or takes them as they are."""
    codes_layout = getattr(consumer, "codes_layout", None)
    return None if codes_layout is None else codes_layout(device)


class _Codes:
    """A producer launch's optional codes outputs for `layout` (None: none), shaped as `like` `[T, H]`."""

    def __init__(self, layout: CodesLayout | None, like: torch.Tensor) -> None:
        self.buffers = (None, None) if layout is None else layout.empty(like, *like.shape)

    def of(self, x: torch.Tensor) -> torch.Tensor | ActivationCodes:
        """What the consumer reads of the producer's output `x`: its codes when written, else x."""
        codes, scales = self.buffers
        return x if codes is None else ActivationCodes(codes, scales, x.dtype)
