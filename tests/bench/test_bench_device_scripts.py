"""bench/device/'s GPU-session scripts run end to end on the tiny shapes (CPU, Triton's interpreter).

They are run by hand on a lent GPU machine, rarely; this keeps them from rotting between loans.
"""

import functools
import os
import re
import subprocess
import sys
from pathlib import Path

USES_TRITON_INTERPRETER = True  # tests/conftest.py keeps TRITON_INTERPRET for this module's tests
DEVICE_SCRIPTS = Path(__file__).resolve().parents[2] / "bench" / "device"


def _run(script: str, *args: str) -> str:
    done = subprocess.run([sys.executable, str(DEVICE_SCRIPTS / script), *args], capture_output=True, text=True,
                          timeout=600, env={**os.environ, "TRITON_INTERPRET": "1"})  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_the_launch_sweep_changes_only_the_launch_not_the_answer():
    # Two configs, whatever the machine's speed (--seconds is only the hang guard here).
    out = _run("moe_kernels.py", "sweep", "--modes", "int4", "--shape", "tiny", "--configs", "2", "--seconds", "500")
    assert "int4 default:" in out
    differences = [float(d) for d in re.findall(r"^  int4 \S+ ms \{.*\} diff (\S+)$", out, re.M)]  # one a config
    assert len(differences) == 2, out
    assert max(differences) < 1e-3, out  # another tiling sums in another order, nothing more


def test_the_kernel_check_passes_every_product_variant_against_its_references():
    out = _run("moe_kernels.py", "check", "--shape", "tiny", "--variants", "product")
    for variant in ("int4", "int8", "fp8"):  # w8a8 for int8 and fp8 on CPU
        assert re.search(rf"^{variant}: rel.err vs its fp32 reference \S+ .*: ok$", out, re.M), out
    assert out.rstrip().endswith("check: PASS"), out


def test_the_kernel_check_and_timing_take_the_gguf_q4_k_m_layout():
    """What a GGUF Q4_K_M loads as is one of the variants a loan checks and times (`--variants all`'s)."""
    out = _run("moe_kernels.py", "check", "--shape", "tiny", "--variants", "gguf-q4_k_m")
    assert re.search(r"^gguf-q4_k_m: rel.err vs its fp32 reference \S+ .*: ok$", out, re.M), out
    assert out.rstrip().endswith("check: PASS"), out
    out = _run("moe_kernels.py", "time", "--shape", "tiny", "--tokens", "64", "--variants", "gguf-q4_k_m")
    assert re.search(r"^64 gguf-q4_k_m: triton-interpreter, ", out, re.M), out


def test_the_step_profile_times_the_step_and_names_the_operators():
    out = _run("profile_step.py", "int4", "--scale", "tiny", "--fused", "on")  # each interpreted step is slow
    assert re.search(r"int4 fused=True capture=False: median step [\d.]+ ms", out), out
    assert "device kernels per step (profiler, 2 - 1 steps) 0" in out  # none on a CPU: the count is the GPU's
    assert "top operators by self_cpu_time_total" in out
    assert "dgemma::sample_logits" in out  # the fused sampler: the product's path, not a stand-in
    assert "dgemma::post_attention" in out  # the fused decoder's norms, with fused=True
    assert re.search(r"fused vs transformers' decoder: max \|diff\| \S+ .*argmax agreement 100.0%", out), out


@functools.cache
def _compile_kernels(variant: str):
    """compile_kernels.py for one variant at 256 tokens on every target card: (the run, its lines), PASS checked."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, str(DEVICE_SCRIPTS / "compile_kernels.py"), "--variants", variant,
                           "--tokens", "256"], capture_output=True, text=True, timeout=600, env=env)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[-1] == "compile: PASS"
    return done, lines


def test_the_expert_kernels_build_for_every_target_card_without_spills():
    """Ahead-of-time compile (Triton's own ptxas, no GPU): the inline PTX assembles, the product's int4
    launches keep their registers and use the card's tensor-core MMA (wgmma on sm_90), and no warp unpacks
    weights another warp unpacks too: at most 0.2 warp instructions a weight in the K loop (8-warp programs on
    a 64-row weight tile issued 0.38-0.46, two warp columns each unpacking the whole tile)."""
    done, lines = _compile_kernels("int4")
    launches = ("gate_up", "down", "qkv", "qkv-full", "mlp", "o", "o-full", "mlp-down")
    for arch, mma in (("sm_89", "HMMA"), ("sm_90", "HGMMA"), ("sm_120", "HMMA")):
        for launch in launches:
            assert any(line.startswith(f"{arch} int4 ") and f" {launch} " in line and f"'{mma}'" in line
                       and "spill   0" in line for line in lines), done.stdout  # fmt: skip
    per_weight = [float(figure) for figure in re.findall(r"\) ([\d.]+)/weight x", done.stdout)]
    assert len(per_weight) == 3 * len(launches) and max(per_weight) <= 0.2, done.stdout


def test_hopper_dense_launches_unpack_each_weight_once_per_128_or_256_tokens_where_the_grid_still_fills():
    """On sm_90 one wgmma takes 128-256 token columns in one instruction and int4 weights are scaled as they are
    unpacked, so the dense projections take 128- or 256-row blocks (q/k/v at 256 tokens: 2 unpacks a weight, a
    full-attention layer's q/k 1) where at least 132 programs remain; o_proj and the MLP (176 and 132 programs at
    64 rows) keep 64. The RTX cards' mma.sync grows with the rows: 64 there."""
    _, lines = _compile_kernels("int4")

    def block_m(arch: str, launch: str) -> int:
        line = next(line for line in lines if line.startswith(f"{arch} int4 ") and f" {launch} " in line)
        return int(re.search(r"BLOCK_M (\d+)", line).group(1))

    assert [block_m("sm_90", launch) for launch in ("qkv", "qkv-full", "mlp", "o", "mlp-down")] == [128, 256, 64, 64, 64]
    for arch in ("sm_89", "sm_120"):
        assert {block_m(arch, launch) for launch in ("qkv", "qkv-full", "mlp", "o", "mlp-down")} == {64}


def test_int4_weights_under_int8_activations_build_with_the_int8_mma_without_spills():
    """w4a8 (int4 codes unpacked to an int8 tile for the int8 MMA): every launch of the layer and the dense
    projections builds on every target card with IMMA (IGMMA, wgmma, on sm_90) and keeps its registers."""
    done, lines = _compile_kernels("int4-w4a8")
    for arch, mma in (("sm_89", "IMMA"), ("sm_90", "IGMMA"), ("sm_120", "IMMA")):
        for launch in ("gate_up", "down", "qkv", "qkv-full", "mlp"):
            assert any(line.startswith(f"{arch} int4-w4a8") and f" {launch} " in line and f"'{mma}'" in line
                       and "spill   0" in line for line in lines), done.stdout  # fmt: skip


def test_the_staged_runner_keeps_every_stage_in_one_file(tmp_path):
    """bench-gpu-staged.sh, one stage chosen by ONLY_STAGES: its lines come back in $OUT/stages.txt under its
    name, with its exit status (the device tool returns at most 8 files: one per stage would lose some)."""
    env = {**os.environ, "OUT": str(tmp_path), "PY": sys.executable, "SKIP_INSTALL": "1",
           "ONLY_STAGES": "respawn-cuda", "BUDGET_S": "500"}
    env.pop("TRITON_INTERPRET", None)
    done = subprocess.run(["bash", str(DEVICE_SCRIPTS / "bench-gpu-staged.sh")], capture_output=True, text=True,
                          timeout=600, env=env, cwd=DEVICE_SCRIPTS.parents[1])  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["env.txt", "stages.txt"]
    lines = (tmp_path / "stages.txt").read_text().splitlines()
    assert lines and all(line.startswith("respawn-cuda| ") for line in lines)
    assert lines[-1].startswith("respawn-cuda| rc=0 ")
    assert any('"medianAnsweredS"' in line for line in lines)  # the bench's JSON report
    assert "== moe-check" not in done.stdout  # the other stages did not run
