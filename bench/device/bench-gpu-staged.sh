#!/bin/bash
# `make bench-gpu`, stage by stage, each stage under its own time limit so that a slow one costs only itself,
# inside a total of BUDGET_S seconds (a lent GPU machine's minutes are few); ONLY_STAGES="a b" runs just those,
# SKIP_STAGES="a b" all but those. Each stage's stdout (its JSON line)
# and stderr (progress, one line per figure) land in $OUT/stages.txt as they come (each line prefixed with the
# stage's name), so a cut run keeps them.
#
# Run from the repository root. Where the project is not installed (a bare machine with its own CUDA torch),
# put cp312 wheels of what is missing in .whl/ (msgspec, tree-sitter, transformers 5.24, regex: bench/device/
# README.md) and they go to /tmp/site; set SKIP_INSTALL=1 where `pip install -e .` was done.
set -u
PY=${PY:-python3}
OUT=${OUT:?set OUT to a folder for the stage outputs}
START=$(date +%s); DEADLINE=$((START + ${BUDGET_S:-570}))
if [ -z "${SKIP_INSTALL:-}" ] && ls .whl/*.whl >/dev/null 2>&1; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
fi
mkdir -p /tmp/pkg/dgemma_lsp; for d in server engine bench; do ln -sfn "$PWD/$d" /tmp/pkg/dgemma_lsp/$d; done
export PYTHONPATH=/tmp/site:/tmp/pkg PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv; nproc; uptime
  $PY -c "import torch, transformers, triton; print('torch', torch.__version__, 'transformers', transformers.__version__, 'triton', triton.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() else 'no cuda')"
} > "$OUT/env.txt" 2>&1; cat "$OUT/env.txt"
stage() {  # stage NAME LIMIT_S bench-arguments...   or   stage NAME LIMIT_S --script path/to/script.py arguments...
  local name=$1 limit=$2; shift 2
  case " ${SKIP_STAGES:-} " in *" $name "*) echo "== $name skipped (SKIP_STAGES)"; return;; esac
  if [ -n "${ONLY_STAGES:-}" ]; then case " $ONLY_STAGES " in *" $name "*) ;; *) return;; esac; fi
  local left=$((DEADLINE - $(date +%s)))
  [ "$left" -lt 20 ] && { echo "== $name skipped: ${left}s left"; return; }
  [ "$limit" -gt "$left" ] && limit=$left
  echo "== $name (limit ${limit}s) $(date +%T)"
  # Every stage's lines, as they come, prefixed with its name, in one file: the device tool sends back at
  # most 8 files, and a run cut by the call's limit keeps what it printed.
  {
    if [ "$1" = "--script" ]; then
      shift; timeout -k 5 "$limit" $PY "$@" 2>&1
    else
      timeout -k 5 "$limit" $PY -m dgemma_lsp.server.cli bench "$@" --json 2>&1
    fi
    echo "rc=$? $(date +%T)"
  } | sed -u "s/^/$name| /" >> "$OUT/stages.txt"
  grep "^$name| " "$OUT/stages.txt" | grep -v "^$name| {" | grep -v -i warn | tail -12 | cut -c1-400
}
# The expert kernels and the fused step first (issue 50: bench/device/README.md says what each answers):
# correctness on the card before any timing, then the layer, the step A/B and the step's kernels.
stage moe-check 100 --script bench/device/moe_kernels.py check
stage moe-time 75 --script bench/device/moe_kernels.py time --tokens 256
stage step-ab-int4 160 step --modes int4 --fused on,off --repeats 2
stage profile-step 130 --script bench/device/profile_step.py int4 --fused on
# int4 weights with int8 activations (bench-only): the step the users' cards could run at the int8 tensor rate
stage step-w4a8 100 step --modes int4-w4a8 --repeats 2
# attention over key/value heads repeated for every query head: the A/B of step-ab-int4's folded default
stage step-attention 100 step --modes int4 --attention repeated --repeats 2
# kill -9 of a CUDA daemon: its warm standby (forked before CUDA was touched) serves the next completion.
stage respawn-cuda 60 respawn --model tiny-random --runs 2
stage moe-time-1024 80 --script bench/device/moe_kernels.py time --tokens 1024 --variants int4,int4-n64,int4-w4a8,int4-w4a8-codes,gguf-q4_k_m,int8,fp8,fp8-codes,bf16
stage step-ab-fp8 150 step --modes fp8 --fused on,off --repeats 2
# w8a8 / w4a8 with each GEMM's activations rounded once in a launch of their own (opt-in): against the two above
stage step-codes 120 step --modes fp8,int4-w4a8 --activation-codes --repeats 2
stage quant 180 quant --modes none,fp8,int8,int4,int4-w4a8
stage moe-profile 30 --script bench/device/moe_kernels.py profile
# Earlier stages, for the anchors they re-measure (the first generation's figures are in RESULTS).
stage step-int8-none 120 step --modes int8,none
stage gpu-eager 200 gpu --no-compile
stage autoregressive 270 gpu --only autoregressive --no-eager
stage gpu-compiled 300 gpu --only diffusion --candidates ""
stage autoregressive-eager 200 gpu --only autoregressive --no-compile
