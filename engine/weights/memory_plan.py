"""Will the model fit? Planned resident bytes per `--quantization`, against free memory, before any weight is read.

Owns the fit rule and its one-paragraph answer; the planned sizes come from the
checkpoint's headers (streaming.planned_bytes), free memory from the device
(`torch.cuda.mem_get_info`) and the host (`MemAvailable`). Knows nothing of
files or models beyond those numbers.

The rule: the resident weights plus a working margin (activations, the prompt
cache's floor, the CUDA context) must fit in free device memory; a first
quantized start also reads the checkpoint through host memory, one shard at a
time, so the largest shard plus the same margin must fit in available host
memory (on a CPU device, the resident weights live there too).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..errors import ModelLoadError

GIB = 1024**3
DEVICE_MARGIN_BYTES = 4 * GIB
"""Left free on a GPU beyond the weights: the denoising step's working memory and the CUDA context.
Measured on an H200 (`bench step`; bench/RESULTS.md, "GPU"): a 512-token prompt's canvases peaked
1.96-2.14 GB above the weights at 1 candidate and 4.39 GB at 4 (int4); the default is 3 candidates,
and the CUDA context (~0.5 GiB) is outside what the allocator counts. It was 1 GiB before that."""
CPU_MARGIN_BYTES = GIB
"""Left free in host memory beyond the weights when the model runs on the CPU (the tiny model's working
memory is small; the full model is not run there)."""
HOST_MARGIN_BYTES = GIB // 2
"""Left free on the host beyond what the load itself holds."""
MODES_BY_SIZE = ("none", "fp8", "int8", "int4")


@dataclass(frozen=True)
class FitPlan:
    """What one load needs and what there is."""

    mode: str
    device: str
    resident_bytes: dict[str, int]
    """Planned resident weight bytes for each --quantization mode."""
    device_free_bytes: int
    """Free memory on the target device now (for cpu: available host memory)."""
    host_free_bytes: int
    """Available host memory now."""
    host_pass_bytes: int
    """Host memory the load itself holds at its peak beyond what stays resident (about one shard)."""

    @property
    def margin_bytes(self) -> int:
        """Working memory kept free beyond the weights on this plan's device."""
        return CPU_MARGIN_BYTES if self.device == "cpu" else DEVICE_MARGIN_BYTES

    def fits(self, mode: str) -> bool:
        need_device = self.resident_bytes[mode] + self.margin_bytes
        need_host = self.host_pass_bytes + HOST_MARGIN_BYTES
        if self.device == "cpu":  # one pool: the resident weights and the shard in flight
            return need_device + self.host_pass_bytes <= self.device_free_bytes
        return need_device <= self.device_free_bytes and need_host <= self.host_free_bytes


def check_fit(plan: FitPlan) -> None:
    """Raise ModelLoadError naming the mode that would fit when `plan.mode` does not."""
    if plan.fits(plan.mode):
        return
    where = "host memory" if plan.device == "cpu" else f"{plan.device}"
    need = plan.resident_bytes[plan.mode]
    message = (
        f"the model does not fit: --quantization {plan.mode} needs {_gib(need)} GiB of weights on {where} "
        f"(+{_gib(plan.margin_bytes)} GiB working memory) but {_gib(plan.device_free_bytes)} GiB is free"
    )
    if plan.device != "cpu" and plan.host_pass_bytes + HOST_MARGIN_BYTES > plan.host_free_bytes:
        message += (f", and reading it needs {_gib(plan.host_pass_bytes + HOST_MARGIN_BYTES)} GiB of host memory "
                    f"({_gib(plan.host_free_bytes)} GiB available)")
    smaller = [m for m in MODES_BY_SIZE if plan.resident_bytes.get(m, 0) < need and plan.fits(m)]
    if smaller:
        best = smaller[0]  # the most precise mode that fits
        message += f"; --quantization {best} ({_gib(plan.resident_bytes[best])} GiB) would fit"
    else:
        smallest = min(plan.resident_bytes, key=plan.resident_bytes.get)
        message += (f"; not even --quantization {smallest} ({_gib(plan.resident_bytes[smallest])} GiB) fits: "
                    "free memory (close other programs) or use a larger GPU")
    raise ModelLoadError(message)


def free_device_bytes(device: str) -> int:
    """Free memory where the weights will live (CUDA: the device's; CPU: available host memory)."""
    if device.startswith("cuda"):
        import torch

        free, _ = torch.cuda.mem_get_info(torch.device(device))
        return int(free)
    return available_host_bytes()


def available_host_bytes() -> int:
    """MemAvailable from /proc/meminfo (Linux); elsewhere the free physical pages."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def _gib(value: int) -> str:
    return f"{value / GIB:.1f}"


PROMPT_CACHE_SHARE = 0.25
"""Share of the memory left free after loading that prompt-cache snapshots may take by default."""
PROMPT_CACHE_FLOOR_BYTES = 64 * 1024**2
PROMPT_CACHE_CEILING_BYTES = 8 * GIB


def default_prompt_cache_bytes(device: str) -> int:
    """The prompt cache's budget when the user sets none: a quarter of what is free after the load,
    the rest left to activations and the request's own cache copy; within [64 MiB, 8 GiB]."""
    share = int(free_device_bytes(device) * PROMPT_CACHE_SHARE)
    return max(PROMPT_CACHE_FLOOR_BYTES, min(PROMPT_CACHE_CEILING_BYTES, share))
