#!/bin/bash
# `make bench-gpu`, stage by stage, each stage under its own time limit so that a slow one costs only itself,
# inside a total of BUDGET_S seconds (a lent GPU machine's minutes are few). Each stage's stdout (its JSON line)
# and stderr (progress, one line per figure) land in $OUT/<stage>.txt as they come, so a cut run keeps them.
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
stage() {
  local name=$1 limit=$2; shift 2
  case " ${SKIP_STAGES:-} " in *" $name "*) echo "== $name skipped (SKIP_STAGES)"; return;; esac
  local left=$((DEADLINE - $(date +%s)))
  [ "$left" -lt 20 ] && { echo "== $name skipped: ${left}s left"; return; }
  [ "$limit" -gt "$left" ] && limit=$left
  echo "== $name (limit ${limit}s) $(date +%T)"
  timeout -k 5 "$limit" $PY -m dgemma_lsp.server.cli bench "$@" --json > "$OUT/$name.txt" 2>&1
  echo "rc=$? $(date +%T)"; grep -v '^{' "$OUT/$name.txt" | grep -v -i warn | tail -12 | cut -c1-400
}
stage moe 90 moe --shape full --repeats 10
stage step-int4 140 step --modes int4
stage step-fp8 90 step --modes fp8
stage gpu-eager 200 gpu --no-compile
stage step-int8-none 120 step --modes int8,none
stage quant 150 quant
# The compiled paths at batch 1 (first measured in session 47, after SKIP_STAGES the ones above), then the eager
# baseline: 256 eager tokens x 7 runs take ~2 minutes of their own.
stage autoregressive 270 gpu --only autoregressive --no-eager
stage gpu-compiled 300 gpu --only diffusion --candidates ""
stage autoregressive-eager 200 gpu --only autoregressive --no-compile
