#!/bin/bash
# What bench/device/train-tiny.sh sent back, as a run folder here (issue 51): `train-tiny-unpack.sh FILES_AT RUN_DIR`.
# run.tgz is unpacked into RUN_DIR; the weights' parts are joined into RUN_DIR/model/model.safetensors and checked
# against the sha256 the device wrote, and that model becomes the run's newest snapshot (snapshots/gpu-NNNNNN.pt,
# ship.snapshot_from_model), so that validation, bench.tiny_code and ship read it like any snapshot. A call cut
# before its export sent snapshot.pt.part-* instead: they are joined into the snapshot they were.
set -eu
from=${1:?the folder the device files came back in}; run=${2:?the run folder to fill}
PY=${PY:-.venv/bin/python}
mkdir -p "$run/snapshots"
tar -xzf "$from/run.tgz" -C "$run"
if ls "$from"/model.safetensors.part-* >/dev/null 2>&1; then
  cat "$from"/model.safetensors.part-* > "$run/model/model.safetensors"
  (cd "$run" && sha256sum -c model.safetensors.sha256)
  $PY -c "import sys; from pathlib import Path; from dgemma_lsp.engine.training.ship import snapshot_from_model; print(snapshot_from_model(Path(sys.argv[1])))" "$run"
fi
if ls "$from"/snapshot.pt.part-* >/dev/null 2>&1; then
  name=$(basename "$(cat "$run/.sent")")
  cat "$from"/snapshot.pt.part-* > "$run/snapshots/$name"; echo "$run/snapshots/$name"
fi
