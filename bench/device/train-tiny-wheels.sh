#!/bin/bash
# The wheels bench/device/train-tiny.sh installs on a GPU machine that reaches no registry, fetched here (issue 51).
# .whl/ (ignored by git; name it in the device call's `carry`): what the package needs beyond the machine's own
# Python 3.12 (KINDS.md's list: torch 2.11, tokenizers 0.23.2, huggingface_hub 1.33, safetensors 0.8 are there;
# transformers there is 5.17, the code needs >= 5.23; regex for transformers 5.24's floor). .whl/focus/: the
# focus corpus's pinned packages and its held-out one (engine/training/focus.py), which focus.ensure_installed's pip
# finds through PIP_FIND_LINKS; kept apart, since whatever /tmp/site holds is an installed distribution, and
# corpus.py would take it into the main corpus (pygorithm is for validation only). ~16 MB in all.
set -eu
cd "$(dirname "$0")/../.."
grep -qx '/.whl/' .gitignore || echo '/.whl/' >> .git/info/exclude
PIP=${PIP:-.venv/bin/python -m pip}
PLATFORM="--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
  --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64"
mkdir -p .whl/focus
$PIP download -q --no-deps $PLATFORM -d .whl transformers==5.24.0 msgspec==0.22.0 tree-sitter==0.26.1 \
  tree-sitter-python==0.25.0 platformdirs==4.14.8 regex==2026.11.19
$PIP download -q --no-deps -d .whl/focus $(.venv/bin/python -c \
  "from dgemma_lsp.engine.training.focus import FOCUS_PACKAGES, FOCUS_HELD_OUT; print(*FOCUS_PACKAGES, *FOCUS_HELD_OUT)")
ls .whl .whl/focus; du -sh .whl
