# One command per task; CI (.ci/run) calls these same targets.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: help demo test e2e bench bench-gpu dryrun lint vsix tools clean

help:  ## list the commands
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

# torch is pinned first: an unpinned torch pulls a multi-GB CUDA build.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)  ## infill at a cursor in examples/ through `dgemma-lsp --stdio` on the tiny model
	$(PY) examples/demo.py

test: $(STAMP) tools  ## the whole test suite (engine, server over stdio, real Neovim 0.11 + 0.12, Emacs lsp-mode)
	$(PY) -m pytest -q

tools: $(STAMP)  ## editors the tests drive (Neovim 0.11 + 0.12, Emacs + lsp-mode 10) into .tools/, and tmux (Ctrl-C tests)
	bash editors/nvim/scripts/install-nvim.sh
	bash editors/emacs/scripts/install-emacs.sh
	command -v tmux >/dev/null || { apt-get update -qq && apt-get install -y -qq tmux; }

e2e: $(STAMP)  ## real VS Code (code-server in headless Chromium) against the server
	bash editors/vscode/scripts/e2e.sh

vsix:  ## build the VS Code extension package
	bash editors/vscode/scripts/build-vsix.sh

bench: $(STAMP)  ## CPU benchmarks: editor latency, keystroke work, HumanEval smoke
	$(PY) -m dgemma_lsp.bench.cli all

bench-gpu: $(STAMP)  ## GPU benchmarks: full-size DiffusionGemma vs autoregressive Gemma 4, each quantization mode, the fused MoE layer, the compiled step (needs CUDA)
	$(VENV)/bin/dgemma-lsp bench gpu
	$(VENV)/bin/dgemma-lsp bench quant
	$(VENV)/bin/dgemma-lsp bench moe --shape full
	$(VENV)/bin/dgemma-lsp bench step

# The CUDA build of the same torch (2.7 GB of wheels: torch, triton and the nvidia-* libraries its import
# loads; no GPU needed), from the machine's own package index: PIP_INDEX_URL, else its pip config's
# index-url, else pip's default. --isolated drops the find-links and extra indexes of the environment and
# the user's pip config, which may serve the CPU build under the same version number (this machine's do).
# $(1): the python whose pip installs.
pip_install_from_index = index="$${PIP_INDEX_URL:-$$($(1) -m pip config get global.index-url 2>/dev/null)}"; \
	cert="$${PIP_CERT:-$$($(1) -m pip config get global.cert 2>/dev/null)}"; \
	$(1) -m pip install --isolated $${index:+--index-url "$$index"} $${cert:+--cert "$$cert"}
CUDA_VENV := .venv-cuda
CUDA_TORCH := $(CUDA_VENV)/.torch
CUDA_STAMP := $(CUDA_VENV)/.installed
# Its own step: .ci/run downloads it while the CPU suite runs.
$(CUDA_TORCH): Makefile
	test -x $(CUDA_VENV)/bin/python || $(PYTHON) -m venv $(CUDA_VENV)
	$(call pip_install_from_index,$(CUDA_VENV)/bin/python) -q torch==2.13.0
	$(CUDA_VENV)/bin/python -c "import torch; assert torch.version.cuda, torch.__version__"
	touch $(CUDA_TORCH)
$(CUDA_STAMP): $(CUDA_TORCH) pyproject.toml
	$(CUDA_VENV)/bin/python -m pip install -q -e '.[dev]'
	touch $(CUDA_STAMP)

dryrun: $(CUDA_STAMP)  ## the CUDA path at full size on virtual GPUs (4090/5090/H100, fake tensors, no GPU) -> artifacts/dryrun.json
	$(CUDA_VENV)/bin/python -m pytest -q -p no:cacheprovider tests/dryrun
	mkdir -p artifacts
	$(CUDA_VENV)/bin/dgemma-lsp bench dryrun --json > artifacts/dryrun.json

lint: $(STAMP)  ## ruff
	$(VENV)/bin/ruff check server engine bench tests examples

clean:
	rm -rf $(VENV) $(CUDA_VENV) .tools build *.egg-info
