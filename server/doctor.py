"""`dgemma-lsp doctor [--json]`: can this machine run the configured model, and what is missing?

One line per check, each that is not fine with the command that fixes it:
- gpu: the CUDA devices torch sees and their free memory (none: the model runs on the CPU);
- memory plan: each `--quantization` mode's planned resident size against free memory on the
  device the engine would pick (engine/weights/memory_plan.py's rule, the one a load enforces);
  sizes from the checkpoint's headers when it is here, else from the architecture's config
  (the default model's ships in engine/model/configs/, engine/model/architecture.py);
- download: the published checkpoint (engine/model/checkpoints.py: bf16, FP8-dynamic, GGUF Q8_0 /
  Q4_K_M, NVFP4) that fits this GPU's free memory — or `--for-gpu`'s card — with its download
  size and resident size, and the `fetch-model` that gets it;
- checkpoint: in the Hugging Face cache (or a folder), else `dgemma-lsp fetch-model`; a
  pre-quantized one (GGUF, compressed-tensors, ModelOpt) is planned in the mode it loads in;
- engine daemon: the resident daemons running now and their state;
- grammars: which tree-sitter grammars load;
- editors, best effort and said so: Neovim (the plugin's `lua/dgemma/init.lua` on the
  runtimepath after the user's config loads, asked from a headless `nvim`; a plugin that
  lazy.nvim loads on an event reads as absent), VS Code (`code --list-extensions`, else the
  extension's folder under ~/.vscode/extensions), Emacs (`dgemma-lsp.el` found by
  `locate-library` after the user's init file, from a batch `emacs`).

Exit status 0 when the configured model (`--model`, `--quantization`, `--device`) can run
here, 1 when it cannot: no checkpoint, the configured mode does not fit, or the facts
could not be read. Editors, grammars and the daemon only inform.

Knows argparse, subprocesses and which engine facts to ask for; the facts themselves come
from engine/weights/readiness.py, imported only when the command runs (it imports torch,
which the language server never does).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

GIB = 1024**3
CUDA_CONTEXT_BYTES = GIB // 2
"""What a CUDA context takes of a card before any weight (`--for-gpu` plans with the rest free)."""
EDITOR_TIMEOUT_S = 20.0
"""A user's editor config may be slow to load; past this the check says so and moves on."""
VSCODE_EXTENSION_ID = "dgemma-lsp.dgemma-lsp"
"""publisher.name from editors/vscode/package.json."""


@dataclass
class Check:
    name: str
    status: str
    """"ok", "warn" (works, but worse than it could) or "fail" (this is missing)."""
    detail: str
    fix: str | None = None
    """The command (or step) that fixes it; None when nothing needs fixing."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument("--no-editors", action="store_true", help="skip the editor checks (they start nvim/emacs)")
    from dgemma_lsp.engine.model.checkpoints import CARDS

    parser.add_argument("--for-gpu", choices=[card.name for card in CARDS], default=None,
                        help="name the checkpoint for this card instead of this machine's GPU (planning a purchase "
                             "or a remote box)")


def run(args: argparse.Namespace) -> int:
    checks: list[Check] = []
    runnable = _model_checks(args, checks)
    checks.append(_daemon_check())
    checks.append(_grammar_check())
    if not args.no_editors:
        checks.extend(_editor_checks())
    if args.json:
        report = {"model": args.model, "quantization": args.quantization, "canRun": runnable,
                  "checks": [asdict(check) for check in checks]}
        sys.stdout.write(json.dumps(report, indent=2) + "\n")
    else:
        for check in checks:
            sys.stdout.write(_line(check))
        verdict = "can run" if runnable else "cannot run"
        sys.stdout.write(f"\n{args.model} (--quantization {args.quantization}) {verdict} on this machine\n")
    return 0 if runnable else 1


def _line(check: Check) -> str:
    text = f"{check.status.upper():5} {check.name:15} {check.detail}\n"
    if check.fix:
        text += f"{'':21} fix: {check.fix}\n"
    return text


# -- the model -----------------------------------------------------------------------------


def _model_checks(args: argparse.Namespace, checks: list[Check]) -> bool:
    """GPU, checkpoint and memory plan; True when the configured model can run here."""
    try:
        from dgemma_lsp.engine.errors import EngineError
        from dgemma_lsp.engine.model.architecture import architecture_config
        from dgemma_lsp.engine.model.folders import DEFAULT_MODEL_ID
        from dgemma_lsp.engine.weights import readiness
    except ImportError as error:  # torch or transformers missing: nothing else can be judged
        checks.append(Check("engine", "fail", f"the engine cannot be imported: {error}",
                            "pip install torch==2.13.0 && pip install dgemma-lsp"))
        return False
    gpus = readiness.cuda_devices()
    if args.for_gpu:
        gpus = []  # planning for another card: this machine's GPUs do not matter
    if gpus:
        for gpu in gpus:
            checks.append(Check(f"gpu {gpu.index}", "ok",
                                f"{gpu.name}: {_gib(gpu.free_bytes)} GiB free of {_gib(gpu.total_bytes)} GiB"))
    elif args.for_gpu:
        checks.append(Check("gpu", "ok", f"planning for {args.for_gpu} (not this machine's GPUs)"))
    else:
        checks.append(Check("gpu", "warn", "no CUDA GPU visible to torch: the model would run on the CPU, "
                                           "seconds to minutes per answer",
                            "run on a machine with an NVIDIA GPU and a CUDA build of torch, or serve the model "
                            "from one: --engine vllm --engine-url URL (docs/deploy-vllm.md)"))
    download = _download_check(readiness, args, gpus)
    if download is not None:
        checks.append(download)
    folder = readiness.checkpoint_folder(args.model)
    if folder is not None:
        checks.append(Check("checkpoint", "ok", f"{args.model} at {folder}"))
    else:
        fetchable = args.model.count("/") == 1 and not Path(args.model).expanduser().exists()
        checks.append(Check(
            "checkpoint", "fail", f"{args.model} is not in the Hugging Face cache ({_hf_cache()})",
            f"dgemma-lsp fetch-model {args.model}" if fetchable else "pass --model with a model folder",
        ))
    architecture = architecture_config(args.model) if folder is None and args.model == DEFAULT_MODEL_ID else None
    try:
        plan = readiness.size_plan(folder, architecture, args.device, args.dtype, args.model)
        if plan is None and folder is None:  # a published pre-quantized checkpoint, not fetched yet
            plan = readiness.published_plan(args.model, args.device, args.dtype)
    except EngineError as error:
        checks.append(Check("memory plan", "fail", str(error), f"dgemma-lsp fetch-model {args.model}"))
        return False
    if plan is None:
        checks.append(Check("memory plan", "warn", "no sizes: neither the checkpoint nor its architecture is here",
                            f"dgemma-lsp fetch-model {args.model}"))
        return False
    configured = plan.native_mode if plan.native_mode and args.quantization == "none" else args.quantization
    checks.extend(_plan_checks(plan, configured))
    return folder is not None and plan.fits.get(configured, False)


def _download_check(readiness, args: argparse.Namespace, gpus) -> Check | None:
    """The published checkpoint that fits this GPU's free memory (or `--for-gpu`'s card), with its download."""
    from dgemma_lsp.engine.model.checkpoints import CARDS

    if args.for_gpu:
        card = next(card for card in CARDS if card.name == args.for_gpu)
        free, capability, where = card.memory_bytes - CUDA_CONTEXT_BYTES, card.capability, card.name
        choice = readiness.recommendation("cuda", free_bytes=free, capability=capability)
    elif gpus:
        device = args.device if args.device and args.device.startswith("cuda") else f"cuda:{gpus[0].index}"
        where, free = gpus[0].name, gpus[0].free_bytes
        choice = readiness.recommendation(device)
    else:
        return None
    sizes = readiness.catalog_sizes(_architecture(), "bfloat16")
    if choice is None:
        return Check("download", "warn", f"no published checkpoint fits {where} ({_gib(free)} GiB free)",
                     "free GPU memory, or serve from a larger GPU: --engine vllm --engine-url URL")
    detail = (f"for {where} ({_gib(free)} GiB free): {choice.describe()}, {_gib(sizes[choice.spec])} GiB resident "
              f"as {choice.mode}")
    if choice.spec == args.model and readiness.checkpoint_folder(args.model) is not None:
        return Check("download", "ok", detail + " (the configured model, here)")
    return Check("download", "warn", detail, f"dgemma-lsp fetch-model {choice.spec} (or --for-this-gpu), "
                                             f"then --model {choice.spec}")


def _architecture():
    from dgemma_lsp.engine.model.architecture import DIFFUSION_CONFIG

    return DIFFUSION_CONFIG


def _plan_checks(plan, configured: str) -> list[Check]:
    where = "host memory" if plan.device == "cpu" else plan.device
    modes = ", ".join(
        f"{mode} {_gib(size)} GiB{'' if plan.fits[mode] else ' (does not fit)'}"
        for mode, size in plan.resident_bytes.items()
    )
    lines = [Check("memory plan", "ok",
                   f"{plan.dtype} on {plan.device}, {_gib(plan.device_free_bytes)} GiB free in {where}; "
                   f"planned weights: {modes} (+{_gib(plan.margin_bytes)} GiB working memory; from {plan.source})")]
    fitting = [mode for mode in plan.resident_bytes if plan.fits[mode]]
    if plan.fits.get(configured):
        lines.append(Check("quantization", "ok", f"--quantization {configured} fits"))
    elif fitting:
        best = max(fitting, key=plan.resident_bytes.get)  # the most precise mode that fits
        lines.append(Check("quantization", "fail", f"--quantization {configured} does not fit in {where}",
                           f"--quantization {best} (editors: add it to the server's arguments)"))
    else:
        lines.append(Check("quantization", "fail", f"no mode fits in {where} now",
                           "free memory (close other programs) or use a larger GPU"))
    return lines


def _hf_cache() -> str:
    from huggingface_hub import constants

    return str(constants.HF_HUB_CACHE)


# -- the rest of the set-up ------------------------------------------------------------------


def _daemon_check() -> Check:
    from dgemma_lsp.engine.daemon.paths import running_engines

    try:
        engines = running_engines()
    except (OSError, PermissionError) as error:
        return Check("engine daemon", "warn", f"the runtime dir cannot be read: {error}",
                     "set DGEMMA_LSP_RUNTIME_DIR to a private folder")
    if not engines:
        return Check("engine daemon", "ok", "none running: an editor starts one on its first request",
                     None)
    described = "; ".join(
        f"pid {engine.pid} {engine.key.model if engine.key else '(starting)'}"
        + (f" {engine.key.quantization}" if engine.key else "")
        for engine in engines
    )
    return Check("engine daemon", "ok", f"{len(engines)} running: {described} (`dgemma-lsp engine status` for more)")


def _grammar_check() -> Check:
    from dgemma_lsp.engine.syntax.languages import LANGUAGES, grammar_for

    missing = []
    for language in LANGUAGES:
        try:
            grammar_for(language)
        except Exception:  # noqa: BLE001 - a missing or broken grammar package: report it, never crash
            missing.append(language)
    present = [language for language in LANGUAGES if language not in missing]
    if missing:
        packages = " ".join(f"tree-sitter-{'typescript' if m == 'tsx' else m}" for m in missing)
        return Check("grammars", "warn", f"present: {', '.join(present)}; missing: {', '.join(missing)} "
                                         "(plain-text infill there)", f"pip install {packages}")
    return Check("grammars", "ok", f"all {len(present)} present: {', '.join(present)}")


def _editor_checks() -> list[Check]:
    return [_neovim_check(), _vscode_check(), _emacs_check()]


def _neovim_check() -> Check:
    nvim = shutil.which("nvim")
    if nvim is None:
        return Check("neovim", "ok", "not installed (nothing to check)")
    found = _run([nvim, "--headless", "-c",
                  "lua io.stdout:write(#vim.api.nvim_get_runtime_file('lua/dgemma/init.lua', false))", "-c", "qa!"])
    if found is None:
        return Check("neovim", "warn", f"{nvim} did not answer within {EDITOR_TIMEOUT_S:.0f} s")
    if found.strip().endswith(("1", "2", "3")):
        return Check("neovim", "ok", "the dgemma plugin is on the runtimepath (`:checkhealth dgemma` checks the rest)")
    return Check("neovim", "warn", "the dgemma plugin is not on the runtimepath after your config loads "
                                   "(lazy-loaded plugins read as absent)",
                 "add editors/nvim to your plugin manager (docs/editors.md)")


def _vscode_check() -> Check:
    code = shutil.which("code")
    if code is not None:
        listed = _run([code, "--list-extensions"])
        if listed is not None:
            if VSCODE_EXTENSION_ID in listed.lower().split():
                return Check("vscode", "ok", f"extension {VSCODE_EXTENSION_ID} installed")
            return Check("vscode", "warn", f"extension {VSCODE_EXTENSION_ID} not installed",
                         "make vsix && code --install-extension editors/vscode/dgemma-lsp.vsix")
    folder = Path(os.path.expanduser("~/.vscode/extensions"))
    if not folder.is_dir():
        return Check("vscode", "ok", "not installed (nothing to check)")
    if any(folder.glob(f"{VSCODE_EXTENSION_ID}-*")):
        return Check("vscode", "ok", f"extension {VSCODE_EXTENSION_ID} in {folder}")
    return Check("vscode", "warn", f"extension {VSCODE_EXTENSION_ID} not in {folder}",
                 "make vsix && code --install-extension editors/vscode/dgemma-lsp.vsix")


def _emacs_check() -> Check:
    emacs = shutil.which("emacs")
    if emacs is None:
        return Check("emacs", "ok", "not installed (nothing to check)")
    init = next((p for p in (Path("~/.emacs.d/init.el"), Path("~/.emacs"), Path("~/.config/emacs/init.el"))
                 if p.expanduser().is_file()), None)
    load = ["-l", str(init.expanduser())] if init else []
    found = _run([emacs, "--batch", *load, "--eval", "(princ (if (locate-library \"dgemma-lsp\") \"yes\" \"no\"))"])
    if found is None:
        return Check("emacs", "warn", f"{emacs} did not answer within {EDITOR_TIMEOUT_S:.0f} s")
    if found.strip().endswith("yes"):
        return Check("emacs", "ok", "dgemma-lsp.el is on the load-path")
    return Check("emacs", "warn", "dgemma-lsp.el is not on the load-path" + ("" if init else " (no init file found)"),
                 "(add-to-list 'load-path \"/path/to/dgemma-lsp/editors/emacs\") (require 'dgemma-lsp)")


def _run(command: list[str]) -> str | None:
    """stdout of a short editor query, or None when it hangs; stdin closed so nothing waits on a terminal."""
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=EDITOR_TIMEOUT_S,
                              stdin=subprocess.DEVNULL)
    except (subprocess.TimeoutExpired, OSError):
        return None
    return done.stdout


def _gib(value: int) -> str:
    return f"{value / GIB:.1f}"
