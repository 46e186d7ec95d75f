"""Where a denoising step's time goes: torch.profiler over the product's step (`CompiledDenoiser`).

Per mode: builds the full-size random model (as `bench step` does), quantizes it, and times the median
step of two 8-step requests eagerly (graph capture off, so every kernel is its own profiler row) and, on
CUDA, captured (what `bench step` reports). Then profiles one eager request, prompt + 4 steps, and prints
the top operators by self device time. On CPU (`--scale tiny`, the sampler in Triton's interpreter) it
only checks the plumbing. Run from the repository root (bench/device/README.md).
"""

from __future__ import annotations

import argparse
import statistics

import torch
from torch.profiler import ProfilerActivity, profile

from dgemma_lsp.bench.gpu import SCALES, build_random, diffusion_config
from dgemma_lsp.bench.quant_gpu import _free, _model_class
from dgemma_lsp.bench.step_gpu import PROMPT_TOKENS, _timed_request
from dgemma_lsp.engine.kernels.compiled_step import CompiledDenoiser
from dgemma_lsp.engine.weights.quantization import quantize_model

PROFILED_STEPS = 4


def profile_mode(mode: str, scale: str, device) -> None:
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
    for capture in (False, True) if device.type == "cuda" else (False,):
        denoiser = CompiledDenoiser(model, capture=capture, eos_ids=set(), pad_id=0)
        _timed_request(denoiser, prompt, 1, PROFILED_STEPS, canvas)  # warm-up (captures the graph)
        steps = [ms for _ in range(2) for ms in _timed_request(denoiser, prompt, 1, 8, canvas)[1]]
        print(f"{mode} capture={capture}: median step {statistics.median(steps):.2f} ms", flush=True)
        if not capture:
            activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
            with profile(activities=activities) as profiler:
                _timed_request(denoiser, prompt, 1, PROFILED_STEPS, canvas)
                if device.type == "cuda":
                    torch.cuda.synchronize()
            key = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
            print(f"--- {mode}: prompt + {PROFILED_STEPS} eager steps, top operators by {key}", flush=True)
            print(
                profiler.key_averages().table(sort_by=key, row_limit=28, max_name_column_width=70), flush=True
            )
        denoiser.clear()
    del model
    _free(device)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("modes", help="comma-separated: none,fp8,int8,int4")
    parser.add_argument("--scale", choices=sorted(SCALES), default="full")
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    for mode in args.modes.split(","):
        profile_mode(mode, args.scale, device)


if __name__ == "__main__":
    main()
