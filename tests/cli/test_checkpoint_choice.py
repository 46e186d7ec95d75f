"""Which published checkpoint fits a card (`doctor`'s download line, `fetch-model --for-this-gpu`), and what
`fetch-model owner/name:VARIANT` downloads: planned with the loader's own rules on the real architecture,
for the virtual GPUs of the dry run (bench/dryrun.py GPUS: capability + memory), no GPU and no network."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dgemma_lsp.bench.dryrun import GPUS
from dgemma_lsp.engine.model import folders
from dgemma_lsp.engine.model.architecture import DIFFUSION_CONFIG
from dgemma_lsp.engine.model.folders import split_variant
from dgemma_lsp.engine.weights import readiness

EXPECTED = {
    "RTX 4090": "unsloth/diffusiongemma-26B-A4B-it-GGUF:Q4_K_M",
    "RTX 5090": "RedHatAI/diffusiongemma-26B-A4B-it-FP8-dynamic",
    "H100": "google/diffusiongemma-26B-A4B-it",
}


@pytest.mark.parametrize("gpu", GPUS, ids=lambda gpu: gpu.name)
def test_each_virtual_gpu_gets_the_most_precise_checkpoint_that_fits_it(gpu):
    free = gpu.memory_bytes - 2**29  # a CUDA context's worth taken
    choice = readiness.recommendation("cuda", free_bytes=free, capability=gpu.capability)
    assert choice is not None and choice.spec == EXPECTED[gpu.name]
    sizes = readiness.catalog_sizes(DIFFUSION_CONFIG, "bfloat16")
    assert sizes[choice.spec] + 4 * 2**30 <= free  # memory_plan's working margin kept


def test_nvfp4_is_offered_only_to_fp4_cards_and_mlx_never():
    from dgemma_lsp.engine.model.checkpoints import CHECKPOINTS, recommend

    fits = {checkpoint.spec: checkpoint.format in ("compressed-tensors-nvfp4", "mlx") for checkpoint in CHECKPOINTS}
    assert recommend(fits, (8, 9)) is None
    assert recommend(fits, (12, 0)).spec == "RedHatAI/diffusiongemma-26B-A4B-it-NVFP4"


def test_doctor_for_a_4090_names_the_q4_k_m_gguf_with_its_download(tmp_path):
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run([sys.executable, "-m", "dgemma_lsp.server.cli", "doctor", "--for-gpu", "RTX 4090",
                           "--no-editors", "--json"], capture_output=True, text=True, env=env, timeout=600)
    checks = {check["name"]: check for check in json.loads(done.stdout)["checks"]}
    download = checks["download"]
    assert download["status"] == "warn"
    assert "for RTX 4090 (23.5 GiB free): unsloth/diffusiongemma-26B-A4B-it-GGUF:Q4_K_M (GGUF Q4_K_M, 16.8 GB " \
           "download)" in download["detail"]
    assert download["fix"].startswith("dgemma-lsp fetch-model unsloth/diffusiongemma-26B-A4B-it-GGUF:Q4_K_M")


def test_spec_variants_are_split_and_paths_left_alone():
    assert split_variant("unsloth/x-GGUF:Q4_K_M") == ("unsloth/x-GGUF", "Q4_K_M")
    assert split_variant("google/diffusiongemma-26B-A4B-it") == ("google/diffusiongemma-26B-A4B-it", None)
    assert split_variant("/models/x:Q4")[1] is None and split_variant("./a:b")[1] is None
    assert split_variant("C:/models/x")[1] is None


def test_fetch_model_of_a_variant_downloads_that_file_and_the_base_models_small_files(monkeypatch):
    calls = []
    monkeypatch.setattr("huggingface_hub.snapshot_download",
                        lambda repo, **kwargs: calls.append((repo, kwargs)) or "/tmp/snapshot")
    assert folders.fetch_model("unsloth/diffusiongemma-26B-A4B-it-GGUF:Q4_K_M") == Path("/tmp/snapshot")
    (base, base_kwargs), (repo, kwargs) = calls
    assert (base, base_kwargs) == ("google/diffusiongemma-26B-A4B-it", {"allow_patterns": folders.COMPANION_FILES})
    assert repo == "unsloth/diffusiongemma-26B-A4B-it-GGUF"
    assert "*Q4_K_M*.gguf" in kwargs["allow_patterns"] and kwargs["ignore_patterns"] == ["*mmproj*"]


def test_fetch_model_for_this_gpu_without_one_says_so(capsys):
    from dgemma_lsp.server.oneshot import run_fetch_model

    if readiness.cuda_devices():
        pytest.skip("this machine has a GPU")
    assert run_fetch_model(argparse.Namespace(model_id=None, for_this_gpu=True)) == 2
    assert "no CUDA GPU visible" in capsys.readouterr().err


def test_the_dry_run_plans_the_prequantized_layouts_on_each_virtual_gpu():
    """`bench dryrun --modes gguf-q4_k_m,int4-g32,int8-g32,fp8-g16` runs what GGUF Q4_K_M (by the GGUF loader's
    own plan), GGUF's other 4-bit types, GGUF Q8_0 and NVFP4 become on the virtual GPUs (the fake-CUDA run itself
    needs `make dryrun`'s CUDA build of torch); which card it offers each to is planned here, on the CPU, by the
    loader's rule."""
    from dgemma_lsp.bench import dryrun

    planned = dryrun.planned_bytes(dryrun._config())
    offered = {gpu.name: dryrun.modes_offered(gpu, planned) for gpu in GPUS}
    assert "int4-g32" in offered["RTX 4090"] and "int8-g32" not in offered["RTX 4090"]
    assert {"int8-g32", "fp8-g16"} <= set(offered["RTX 5090"])
    assert planned["int4"] < planned["int4-g32"] < planned["int8-g32"]  # a bf16 scale per 32 inputs, not 128
    # Q4_K's two levels and mins, int8 down: more than int4-g32, and still a 24 GB card's
    assert "gguf-q4_k_m" in offered["RTX 4090"] and planned["int4-g32"] < planned["gguf-q4_k_m"] < planned["int8-g32"]


def test_doctor_plans_a_published_gguf_before_it_is_fetched(tmp_path):
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run([sys.executable, "-m", "dgemma_lsp.server.cli", "doctor", "--model",
                           "unsloth/diffusiongemma-26B-A4B-it-GGUF:Q4_K_M", "--no-editors", "--json"],
                          capture_output=True, text=True, env=env, timeout=600)
    checks = {check["name"]: check for check in json.loads(done.stdout)["checks"]}
    assert checks["checkpoint"]["fix"] == "dgemma-lsp fetch-model unsloth/diffusiongemma-26B-A4B-it-GGUF:Q4_K_M"
    assert "planned weights: int4 " in checks["memory plan"]["detail"]
    assert "GGUF Q4_K_M's plan for the architecture" in checks["memory plan"]["detail"]
