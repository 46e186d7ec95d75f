#!/bin/bash
# Issue 51: train `--model tiny` on a lent GPU inside one call, from the repository root. Stages, each under its
# own time limit inside BUDGET_S (the call's limit less a margin), their output in $OUT/log.txt as it comes:
#   1. install the carried wheels (.whl/*.whl, from bench/device/train-tiny-wheels.sh) into /tmp/site; reach the
#      package through links in /tmp/pkg;
#   2. the run folder: the GPU recipe and the shipped CPU run's tokenizer (docs/training.md says why);
#   3. the packer (engine/training/packing.py) in the background until training ends: the machine's own
#      permissively licensed Python, cut into example shards by WORKERS processes, and the corpus manifest;
#   4. the probe (bench/device/train_probe.py, PROBE_S): a few steps eager, then compiled (then another
#      shape, for the next session's choice); the faster becomes the run's train.compile (the shards wait);
#   5. training (`dgemma-lsp train --examples`) with `--seconds` up to TRAIN_END: it saves, snapshots every
#      2 GPU-minutes and exports its model before the budget ends; INIT=FOLDER starts from earlier weights
#      (the shipped tiny model of an earlier GPU session) with a fresh optimizer;
#   6. validation on the fixed held-out sets, on the GPU (VALIDATION_S);
#   7. what comes back: $OUT/log.txt, $OUT/run.tgz (recipe, manifest, logs, figures, the model folder
#      without its weights), the weights as $OUT/model.safetensors.part-* (split at 15 MiB: $OUT takes files
#      of at most 16 MiB), and meanwhile the newest snapshot as $OUT/snapshot.pt.part-*. Here,
#      bench/device/train-tiny-unpack.sh FILES_AT RUN_DIR makes a run folder of them.
# PROBE_ARGS: the probe's options (default: the compiled model, then a 320-wide 6-layer shape eager; "" times the
# recipe's eager model alone).
# CPU rehearsal (tests/training/test_device_script.py): DEVICE=cpu SKIP_INSTALL=1 PY=.venv/bin/python PROBE_ARGS=""
# with a micro RECIPE and a budget of a couple of minutes.
set -u
PY=${PY:-python3}
OUT=${OUT:?set OUT to a folder for what comes back}
BUDGET_S=${BUDGET_S:-555}              # the whole script; give the call timeout_s 595
RESERVE_S=${RESERVE_S:-75}             # after training: its save and export, validation, the files
PROBE_S=${PROBE_S:-90}                 # 0: no probe, the recipe's train.compile
VALIDATION_S=${VALIDATION_S:-45}
VALIDATION_HOLES=${VALIDATION_HOLES:-300}
DEVICE=${DEVICE:-cuda}
RECIPE=${RECIPE:-engine/training/configs/tiny-code-gpu.json}
TOKENIZER=${TOKENIZER:-runs/tiny-code-cpu/tokenizer}
INIT=${INIT:-}
RUN=${RUN:-/tmp/tiny-gpu-run}
SHARDS=${SHARDS:-/dev/shm/tiny-gpu-shards}
WORKERS=${WORKERS:-$(( $(nproc) > 3 ? $(nproc) - 2 : 1 ))}
START=$(date +%s); DEADLINE=$((START + BUDGET_S)); TRAIN_END=$((DEADLINE - RESERVE_S))
left() { echo $(( $1 - $(date +%s) )); }
exec > >(tee -a "$OUT/log.txt") 2>&1
TEE=$!
echo "== train-tiny $(date -u +%FT%TZ): budget ${BUDGET_S}s, training until +$((TRAIN_END - START))s, device $DEVICE, $WORKERS workers"

# 1. wheels and the package
if [ -z "${SKIP_INSTALL:-}" ] && ls .whl/*.whl >/dev/null 2>&1; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
fi
mkdir -p /tmp/pkg/dgemma_lsp; for d in server engine bench; do ln -sfn "$PWD/$d" /tmp/pkg/dgemma_lsp/$d; done
export PYTHONPATH=/tmp/site:/tmp/pkg${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# focus.ensure_installed's pip finds the focus corpus's carried wheels (no network on the device machine;
# train-tiny-wheels.sh); a rehearsal without them (CI) takes them from the machine's own index.
if [ -d .whl/focus ]; then export PIP_NO_INDEX=1 PIP_FIND_LINKS="$PWD/.whl/focus"; fi
export DGEMMA_LSP_CACHE=${DGEMMA_LSP_CACHE:-/tmp/dgemma-cache}
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null; echo "cores $(nproc)"
  $PY -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() else 'no cuda')"
} 2>&1

# 2. the run folder
rm -rf "$SHARDS"; mkdir -p "$RUN" "$SHARDS"
[ -f "$RUN/recipe.json" ] || cp "$RECIPE" "$RUN/recipe.json"
[ -d "$RUN/tokenizer" ] || cp -r "$TOKENIZER" "$RUN/tokenizer"

# 3. the packer, until training ends
echo "== packer $(date +%T) (until +$((TRAIN_END - START))s)"
timeout -k 5 $(left $TRAIN_END) $PY -m dgemma_lsp.engine.training.packing "$RUN" --out "$SHARDS" --workers "$WORKERS" \
  --seconds $(left $TRAIN_END) > "$RUN/packer.log" 2>&1 &
PACKER=$!

# 4. the probe: eager, then compiled
if [ "$PROBE_S" -gt 0 ]; then
  echo "== probe $(date +%T) (limit ${PROBE_S}s)"
  timeout -k 5 "$PROBE_S" $PY bench/device/train_probe.py "$RUN/recipe.json" "$RUN/tokenizer" --device "$DEVICE" \
    --steps ${PROBE_STEPS:-6} ${PROBE_ARGS---compile --shape 320x6:320,640,6,5,1,256} > "$RUN/probe.jsonl" 2> "$RUN/probe.log"
  echo "rc=$? $(date +%T)"; cat "$RUN/probe.jsonl"; grep -i -E "error|Traceback" "$RUN/probe.log" | tail -5
  $PY - "$RUN" <<'EOF'
import json, sys
from pathlib import Path
run = Path(sys.argv[1])
lines = {l["variant"]: l for l in map(json.loads, (run / "probe.jsonl").read_text().splitlines()) if "secondsPerStep" in l}
eager, compiled = lines.get("recipe"), lines.get("recipe-compiled")
faster = bool(eager and compiled and compiled["secondsPerStep"] < 0.85 * eager["secondsPerStep"])
recipe = json.loads((run / "recipe.json").read_text())
recipe["train"]["compile"], recipe["train"]["compiledHead"] = ("layers", True) if faster else ("none", False)
(run / "recipe.json").write_text(json.dumps(recipe, indent=1) + "\n")
print("probe: train.compile", recipe["train"]["compile"], "eager", eager and eager["secondsPerStep"],
      "compiled", compiled and compiled["secondsPerStep"])
EOF
fi

# 5. training
TRAIN_S=$(left $TRAIN_END)
echo "== train $(date +%T) (--seconds $TRAIN_S)"
# Snapshots as they come: the newest, split for $OUT, so that a cut call still brings weights back.
( while kill -0 $PACKER 2>/dev/null || [ ! -d "$RUN/model" ]; do
    sleep 15; newest=$(ls "$RUN"/snapshots/*.pt 2>/dev/null | tail -1)
    if [ -n "$newest" ] && [ "$newest" != "$(cat "$RUN/.sent" 2>/dev/null)" ]; then
      rm -f "$OUT"/snapshot.pt.part-*; split -b 15M "$newest" "$OUT/snapshot.pt.part-"; echo "$newest" > "$RUN/.sent"
    fi
    [ "$(date +%s)" -gt "$DEADLINE" ] && break
  done ) &
SENDER=$!
timeout -k 10 $((TRAIN_S + RESERVE_S / 2)) $PY -m dgemma_lsp.server.cli train "$RUN" --device "$DEVICE" \
  --examples "$SHARDS" --seconds "$TRAIN_S" --quiet --log-level INFO ${INIT:+--init "$INIT"}
echo "rc=$? $(date +%T)"
kill $PACKER 2>/dev/null; wait $PACKER 2>/dev/null
tail -3 "$RUN/packer.log"; tail -2 "$RUN/log.jsonl" 2>/dev/null

# 6. validation on the fixed held-out sets
for set in held-out focus; do
  limit=$(( $(left $DEADLINE) - 15 )); [ "$limit" -gt "$VALIDATION_S" ] && limit=$VALIDATION_S
  [ "$limit" -lt 10 ] && { echo "== validation $set skipped: ${limit}s left"; continue; }
  echo "== validation $set $(date +%T) (limit ${limit}s)"
  timeout -k 5 "$limit" $PY -m dgemma_lsp.engine.training.validation "$RUN" --latest --set "$set" \
    --holes "$VALIDATION_HOLES" --device "$DEVICE" --threads 4
  echo "rc=$? $(date +%T)"
done

# 7. what comes back
kill $SENDER 2>/dev/null
if [ -f "$RUN/model/model.safetensors" ]; then
  rm -f "$OUT"/snapshot.pt.part-*
  split -b 15M "$RUN/model/model.safetensors" "$OUT/model.safetensors.part-"
  (cd "$RUN" && sha256sum model/model.safetensors > model.safetensors.sha256)
fi
tar -C "$RUN" -czf "$OUT/run.tgz" --exclude=model/model.safetensors --exclude=snapshots --exclude=checkpoint.pt \
  --exclude='*.tmp' .
ls -la "$OUT"; echo "== done $(date +%T), $(( $(date +%s) - START ))s"
exec >&- 2>&-; wait $TEE 2>/dev/null || sleep 1  # the log's last lines are in $OUT before the call returns
