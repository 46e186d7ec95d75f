"""Where a denoising step's time goes: torch.profiler over the product's step (`CompiledDenoiser`).

Per mode and `--fused` setting: builds the full-size random model (as `bench step` does), quantizes it,
and times the median step of two 8-step requests (one 2-step request on CPU) eagerly (graph capture off, so every kernel is its own
profiler row) and, on CUDA, captured (what `bench step` reports). Then profiles eager requests of 2 and
6 steps (1 and 2 on CPU): the difference per step between is the device kernels one step launches (the figure `make dryrun`
predicts as deviceKernelsPerStep), listed by kernel name; then the top operators by self device time,
and again by input shapes (the dense linears' dequant-GEMMs apart from the experts').
With the fused decoder it first compares one decoder forward, fused and transformers', on the card.
On CUDA it also prints which SDPA backend attention takes for the step's shapes (a masked, grouped-query
attention over the static cache: flash needs no mask, so memory-efficient or math). On CPU (`--scale
tiny`, the sampler in Triton's interpreter) it only checks the plumbing. Run from the repository root
(bench/device/README.md).
"""

from __future__ import annotations

import argparse
import collections
import statistics

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from dgemma_lsp.bench.gpu import SCALES, build_random, diffusion_config
from dgemma_lsp.bench.quant_gpu import _free, _model_class
from dgemma_lsp.bench.step_gpu import PROMPT_TOKENS, _timed_request
from dgemma_lsp.engine.kernels.compiled_step import (
    CompiledDenoiser,
    StaticPromptCache,
    bucket_for,
    self_conditioning_signal,
    soft_embeddings,
)
from dgemma_lsp.engine.kernels.fused_decoder import FusedDecoder
from dgemma_lsp.engine.model.cache_keyword import with_cache
from dgemma_lsp.engine.weights.quantization import quantize_model

PROFILED_STEPS = {"cuda": (2, 6), "cpu": (1, 2)}
"""Two eager requests profiled; the difference of their kernels over the steps between is one step's.
Fewer on CPU, where the kernels run in Triton's interpreter and only the plumbing is checked."""
TIMED_STEPS = {"cuda": 8, "cpu": 2}
TIMED_REQUESTS = {"cuda": 2, "cpu": 1}
KERNELS_LISTED = 30
FUSED = {"auto": None, "on": True, "off": False}


def _device_kernels(denoiser, prompt: list[int], steps: int, canvas: int, device):
    """(kernel and memcpy/memset events on the device by name, the profiler) of one eager `steps`-step request."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities, record_shapes=True) as profiler:
        _timed_request(denoiser, prompt, 1, steps, canvas)
        if device.type == "cuda":
            torch.cuda.synchronize()
    return collections.Counter(e.name for e in profiler.events() if e.device_type == DeviceType.CUDA), profiler


def _sdpa_backends(config, device, dtype) -> None:
    """The backend SDPA picks for each layer type's decoder attention at prompt 512 (bucket 1,024)."""
    text = config.text_config
    canvas, cached = config.canvas_length, bucket_for(PROMPT_TOKENS["full"] + config.canvas_length)
    for layer_type in sorted(set(text.layer_types)):
        dim = text.per_layer_config[layer_type].head_dim
        keys = (min(cached, text.sliding_window) if layer_type == "sliding_attention" else cached) + canvas
        q = torch.zeros((1, text.num_attention_heads, canvas, dim), dtype=dtype, device=device)
        kv = torch.zeros((1, text.num_attention_heads, keys, dim), dtype=dtype, device=device)
        mask = torch.ones((1, 1, canvas, keys), dtype=torch.bool, device=device)
        choice = torch._fused_sdp_choice(q, kv, kv, mask, 0.0, False, scale=1.0)
        print(f"SDPA backend for {layer_type} (head_dim {dim}, {keys} keys, bool mask): "
              f"{torch.nn.attention.SDPBackend(choice).name}", flush=True)  # fmt: skip


@torch.no_grad()
def compare_decoders(model, prompt: list[int], device, dtype) -> None:
    """One decoder forward, transformers' and the fused one, on the same cache, canvas and self-conditioning
    logits: how far apart their hidden states and lm_head argmaxes are on this card (on CPU in bf16 they
    are equal bit for bit; here reductions run in other orders and the experts sum with atomics)."""
    decoder = model.model.decoder
    canvas_length, vocab = model.config.canvas_length, model.config.text_config.vocab_size
    generator = torch.Generator().manual_seed(1)
    cache, _ = StaticPromptCache(model).checkout(None, prompt, 1, bucket_for(len(prompt) + canvas_length))
    canvas = torch.randint(0, vocab, (1, canvas_length), generator=generator).to(device)
    logits = (torch.randn((1, canvas_length, vocab), generator=generator) * 4).to(device, dtype)
    on = torch.ones(1, dtype=torch.bool, device=device)
    masks = decoder.create_diffusion_decoder_attention_mask(
        model.config, canvas.unsqueeze(-1), cache,
        torch.ones((1, len(prompt) + canvas_length), dtype=torch.bool, device=device),
    )  # fmt: skip
    positions = torch.arange(len(prompt), len(prompt) + canvas_length, device=device)[None]
    with self_conditioning_signal(decoder, soft_embeddings(decoder, logits, on)):
        theirs = decoder(decoder_input_ids=canvas, **with_cache(cache), decoder_attention_mask=masks,
                         decoder_position_ids=positions).last_hidden_state[0]  # fmt: skip
    fused = FusedDecoder(model)
    ours = fused.forward(canvas, logits, on, cache, dict(masks), fused.rotary(positions, dtype))
    difference = (ours.float() - theirs.float()).abs()
    agree = (model.lm_head(ours).argmax(-1) == model.lm_head(theirs).argmax(-1)).float().mean()
    print(f"fused vs transformers' decoder: max |diff| {difference.max():.4g} (hidden max "
          f"{theirs.float().abs().max():.4g}), equal {(difference == 0).float().mean():.1%}, "
          f"lm_head argmax agreement {agree:.1%}", flush=True)  # fmt: skip


def profile_mode(mode: str, scale: str, device, fused: bool | None) -> None:
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    config = diffusion_config(SCALES[scale])
    canvas = config.canvas_length
    generator = torch.Generator().manual_seed(0)
    prompt = torch.randint(4, config.text_config.vocab_size - 4, (PROMPT_TOKENS[scale],), generator=generator)
    prompt = prompt.tolist()
    torch.manual_seed(0)
    model = build_random(_model_class(), config, device, dtype)
    quantize_model(model, mode)
    _free(device)
    if fused is not False:
        compare_decoders(model, prompt, device, dtype)
    for capture in (False, True) if device.type == "cuda" else (False,):
        denoiser = CompiledDenoiser(model, capture=capture, eos_ids=set(), pad_id=0, fused=fused)
        name = f"{mode} fused={denoiser.fused is not None} capture={capture}"
        few_steps, many_steps = PROFILED_STEPS[device.type]
        if device.type == "cuda":
            _timed_request(denoiser, prompt, 1, few_steps, canvas)  # warm-up (compiles, captures the graph)
        timed = [_timed_request(denoiser, prompt, 1, TIMED_STEPS[device.type], canvas) for _ in range(TIMED_REQUESTS[device.type])]
        steps = [ms for _, deltas in timed for ms in deltas]
        print(f"{name}: median step {statistics.median(steps):.2f} ms", flush=True)
        if not capture:
            (few, _), (many, profiler) = (_device_kernels(denoiser, prompt, n, canvas, device)
                                          for n in (few_steps, many_steps))  # fmt: skip
            per_step = {kernel: (many[kernel] - few[kernel]) / (many_steps - few_steps) for kernel in many}
            total = sum(per_step.values())
            print(f"--- {name}: device kernels per step (profiler, {many_steps} - {few_steps} steps) {total:.0f}",
                  flush=True)  # fmt: skip
            for kernel, count in sorted(per_step.items(), key=lambda item: -item[1])[:KERNELS_LISTED]:
                if count:
                    print(f"{count:7.1f}  {kernel[:110]}", flush=True)
            key = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
            print(f"--- {name}: prompt + {many_steps} eager steps, top operators by {key}", flush=True)
            print(profiler.key_averages().table(sort_by=key, row_limit=28, max_name_column_width=70), flush=True)
            # The same by input shapes: the dense linears' dequant-GEMMs (weights [1, N, K]) apart from the
            # experts' ([E, N, K]), attention per layer type, the norms per width.
            print(f"--- {name}: the same by input shapes", flush=True)
            print(profiler.key_averages(group_by_input_shape=True).table(
                sort_by=key, row_limit=20, max_name_column_width=50, max_shapes_column_width=90), flush=True)  # fmt: skip
        denoiser.clear()
    if device.type == "cuda":
        _sdpa_backends(config, device, dtype)
    del model
    _free(device)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("modes", help="comma-separated: none,fp8,int8,int4")
    parser.add_argument("--scale", choices=sorted(SCALES), default="full")
    parser.add_argument("--fused", default="auto", help="comma-separated from auto,on,off (on,off: both, A/B)")
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    for mode in args.modes.split(","):
        for fused in args.fused.split(","):
            profile_mode(mode, args.scale, device, FUSED[fused])


if __name__ == "__main__":
    main()
