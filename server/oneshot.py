"""One-shot commands: `dgemma-lsp complete`, `rewrite` and `fetch-model`.

The same path as the language server (SyntaxDocument -> prepare -> denoise ->
finish) without an editor: positions are 1-based LINE:COL as editors show
them (COL counts characters). Plain output is the answer only; --json adds the
plan, candidates, step counts and timings. Bad input is one line on stderr and
exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path

import msgspec

from dgemma_lsp.engine.api import GenerationSettings
from dgemma_lsp.engine.errors import EngineError
from dgemma_lsp.engine.syntax.document import SyntaxDocument
from dgemma_lsp.engine.syntax.infill import (
    DEFAULT_CONTEXT_TOKENS,
    context_budget,
    finish_candidates,
    finish_rewrite,
    prepare_infill,
    prepare_rewrite,
)
from dgemma_lsp.engine.syntax.languages import language_for_path

from .line_endings import line_ending, with_line_ending

LARGE_FILE_CHARS = 1_000_000
"""Past this, only a window around the cursor is parsed: the prompt never needs more."""
WINDOW_CHARS = 200_000


class UsageError(Exception):
    """Bad command-line input, reported as one line."""


# -- arguments -----------------------------------------------------------------


def _add_generation_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seed", type=int, default=None, help="seed for reproducible output")
    parser.add_argument("--steps", type=int, default=None, help="max denoising steps per canvas")
    parser.add_argument("--candidates", type=int, default=1, help="candidates denoised in one batch")
    parser.add_argument("--max-tokens", type=int, default=None, help="answer length cap (default: one canvas)")
    parser.add_argument("--json", action="store_true", help="print a JSON report instead of the text")
    parser.add_argument("--drafts", action="store_true", help="print each draft to stderr as it denoises")


def add_complete_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("position", metavar="FILE:LINE:COL", help="cursor position, 1-based")
    parser.add_argument("--workspace", default=None,
                        help="folder whose files give cross-file context (default: the nearest folder above "
                             "FILE with .git or a project file, else FILE's folder)")
    parser.add_argument("--no-cross-file", dest="cross_file", action="store_false",
                        help="send the current file alone (no snippets from other files)")
    parser.add_argument("--cross-file-tokens", type=int, default=None,
                        help="budget of the cross-file snippets (default: a quarter of the context budget)")
    _add_generation_arguments(parser)


def add_rewrite_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("selection", metavar="FILE:LINE:COL-LINE:COL", help="selection, 1-based, end exclusive")
    parser.add_argument("--strength", type=float, default=0.6, help="renoising strength in (0, 1]")
    _add_generation_arguments(parser)


def add_fetch_model_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model_id", nargs="?", default=None,
                        help="Hugging Face id, `owner/name:VARIANT` for one GGUF file (e.g. "
                             "unsloth/diffusiongemma-26B-A4B-it-GGUF:Q4_K_M); default: the 26B-A4B-it in bf16")
    parser.add_argument("--for-this-gpu", action="store_true",
                        help="the checkpoint `dgemma-lsp doctor` names for this GPU's free memory")


# -- commands --------------------------------------------------------------------


def run_complete(args: argparse.Namespace) -> int:
    return _guarded(_complete, args)


def run_rewrite(args: argparse.Namespace) -> int:
    return _guarded(_rewrite, args)


def run_fetch_model(args: argparse.Namespace) -> int:
    from dgemma_lsp.engine.model.folders import DEFAULT_MODEL_ID, fetch_model

    model_id = args.model_id or DEFAULT_MODEL_ID
    if getattr(args, "for_this_gpu", False):
        if args.model_id:
            print("dgemma-lsp: fetch-model takes a model id or --for-this-gpu, not both", file=sys.stderr)
            return 2
        chosen = _checkpoint_for_this_gpu()
        if chosen is None:
            return 2
        model_id = chosen
    try:
        folder = fetch_model(model_id)
    except Exception as error:  # noqa: BLE001 - network/auth failures: one line for the user
        print(f"dgemma-lsp: could not download {model_id}: {str(error).splitlines()[0]}", file=sys.stderr)
        return 2
    print(folder)
    return 0


def _checkpoint_for_this_gpu() -> str | None:
    """The spec `doctor` names for GPU 0's free memory, said on stderr; None (and why) when there is none."""
    from dgemma_lsp.engine.weights import readiness

    gpus = readiness.cuda_devices()
    if not gpus:
        print("dgemma-lsp: no CUDA GPU visible to torch: name a checkpoint (`dgemma-lsp doctor --for-gpu` plans "
              "for a card)", file=sys.stderr)
        return None
    choice = readiness.recommendation(f"cuda:{gpus[0].index}")
    if choice is None:
        print(f"dgemma-lsp: no published checkpoint fits {gpus[0].name}'s free memory "
              f"({gpus[0].free_bytes / 1024**3:.1f} GiB)", file=sys.stderr)
        return None
    print(f"dgemma-lsp: for {gpus[0].name}: {choice.describe()}", file=sys.stderr)
    return choice.spec


def _complete(args: argparse.Namespace) -> int:
    path, rest = _split_path(args.position, "FILE:LINE:COL")
    text = _read_utf8(path)
    offset = _offset(text, rest, args.position)
    text, offset = _window_large_text(text, offset)
    doc = SyntaxDocument(text, language_for_path(str(path)))
    cross_file = _cross_file(args, path, doc.language)
    service = _service(args)
    load_ms = _load(service)
    model_tokens = service.status().context_tokens
    if cross_file is not None and model_tokens is not None:  # snippets share the model's window (as in the server)
        cross_file = functools.partial(cross_file, cap=model_tokens // 4)
    prepared = prepare_infill(doc, offset, _settings(args), budget_tokens=context_budget(model_tokens),
                              cross_file=cross_file)
    result = service.denoise(prepared.request, on_draft=_draft_printer(args))
    ending = line_ending(text)  # the file's own line ending, never a lone "\r"
    candidates = [msgspec.structs.replace(c, text=with_line_ending(c.text, ending))
                  for c in finish_candidates(prepared, doc, result)]
    if not args.json:
        if candidates:
            sys.stdout.write(candidates[0].text + ("" if candidates[0].text.endswith("\n") else ending))
        return 0
    report = {
        "plan": {
            "kind": prepared.plan.kind,
            "region": {"start": prepared.plan.region.start, "end": prepared.plan.region.end},
            "stop": prepared.plan.stop,
            "contextTokens": prepared.context.tokens,
        },
        "crossFile": [
            {"path": s.path, "lines": [s.start_line + 1, s.end_line], "source": s.source, "score": s.score,
             "tokens": s.tokens}
            for s in prepared.context.cross_file
        ],
        "candidates": msgspec.to_builtins(candidates),
        **_result_fields(result, load_ms, service),
    }
    print(json.dumps(report, indent=2, ensure_ascii=False))
    return 0


def _rewrite(args: argparse.Namespace) -> int:
    path, rest = _split_path(args.selection, "FILE:LINE:COL-LINE:COL")
    start_spec, _, end_spec = rest.partition("-")
    if not end_spec:
        raise UsageError(f"'{args.selection}' is not FILE:LINE:COL-LINE:COL")
    text = _read_utf8(path)
    start, end = _offset(text, start_spec, args.selection), _offset(text, end_spec, args.selection)
    if start >= end:
        raise UsageError(f"selection '{args.selection}' is empty or reversed")
    if not 0.0 < args.strength <= 1.0:
        raise UsageError(f"--strength must be in (0, 1], got {args.strength}")
    doc = SyntaxDocument(text, language_for_path(str(path)))
    service = _service(args)
    load_ms = _load(service)
    request = prepare_rewrite(doc, start, end, args.strength, _settings(args),
                              budget_tokens=context_budget(service.status().context_tokens))
    result = service.denoise(request, on_draft=_draft_printer(args))
    ending = line_ending(text)  # the file's own line ending, never a lone "\r"
    replacements = [with_line_ending(finish_rewrite(raw.text, text[start:end]), ending) for raw in result.candidates]
    if not args.json:
        sys.stdout.write(replacements[0])
        return 0
    report = {
        "selection": {"start": start, "end": end, "text": text[start:end]},
        "candidates": [
            {"text": new_text, "confidence": raw.confidence}
            for new_text, raw in zip(replacements, result.candidates, strict=True)
        ],
        **_result_fields(result, load_ms, service),
    }
    print(json.dumps(report, indent=2, ensure_ascii=False))
    return 0


# -- helpers ---------------------------------------------------------------------


ONE_SHOT_MAX_FILES = 1000
ONE_SHOT_MAX_BYTES = 16 * 1024 * 1024
"""`complete` indexes the workspace before it answers: at most this much (the server: 5,000 files)."""
PROJECT_MARKERS = (".git", "pyproject.toml", "setup.py", "package.json", "go.mod", "Cargo.toml", "pom.xml",
                   "build.gradle", "CMakeLists.txt", "Makefile")


def _cross_file(args: argparse.Namespace, path: Path, language: str):
    """The prepare_infill provider over a workspace index built now (bounded), or None when switched off."""
    if not getattr(args, "cross_file", True):
        return None
    budget = args.cross_file_tokens if args.cross_file_tokens is not None else DEFAULT_CONTEXT_TOKENS // 4
    if budget < 0:
        raise UsageError(f"--cross-file-tokens must be >= 0, got {budget}")
    if budget == 0:
        return None
    from dgemma_lsp.engine.crossfile.files import Bounds
    from dgemma_lsp.engine.crossfile.gather import CrossFileSources
    from dgemma_lsp.engine.crossfile.index import WorkspaceIndex

    file = path.resolve()
    if args.workspace is not None:
        root = Path(args.workspace).resolve()
        if not root.is_dir():
            raise UsageError(f"--workspace {args.workspace}: not a folder")
    else:
        root = next((folder for folder in file.parents if any((folder / m).exists() for m in PROJECT_MARKERS)),
                    file.parent)
    # Built here, before the answer: a smaller bound than the server's background index.
    index = WorkspaceIndex(str(root), Bounds(max_files=ONE_SHOT_MAX_FILES, max_bytes=ONE_SHOT_MAX_BYTES))
    index.build()
    index.update(str(file), None)  # the file itself, even when its folder's rules leave it out
    sources = CrossFileSources(index)
    return lambda context, cap=budget: sources.snippets(str(file), language, context, min(budget, cap))


def _guarded(command, args: argparse.Namespace) -> int:
    try:
        return command(args)
    except (UsageError, EngineError) as error:
        print(f"dgemma-lsp: {error}", file=sys.stderr)
        return 2


def _load(service) -> float:
    """Load the model with a progress bar on stderr (shards read); stdout keeps only the answer."""
    from dgemma_lsp.engine.progress import shard_progress_bar

    with shard_progress_bar() as progress:
        service.on_load_progress = progress
        return service.load()


def _service(args: argparse.Namespace):
    from dgemma_lsp.engine.runtime.service import InfillService

    # A one-shot command has the machine to itself: torch's default threads unless told otherwise.
    return InfillService(args.model, device=args.device, dtype=args.dtype, quantization=args.quantization,
                         cpu_threads=getattr(args, "cpu_threads", None))


def _settings(args: argparse.Namespace) -> GenerationSettings:
    for name in ("steps", "candidates", "max_tokens"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    return GenerationSettings(
        steps=args.steps, candidates=args.candidates, max_tokens=args.max_tokens, seed=args.seed
    )


def _draft_printer(args: argparse.Namespace):
    if not args.drafts:
        return None

    def print_draft(draft) -> None:
        print(f"[draft {draft.step}] {draft.text!r}", file=sys.stderr)

    return print_draft


def _result_fields(result, load_ms: float, service) -> dict:
    timings = result.timings_ms
    return {
        "steps": result.steps,
        "tokensPerForward": result.tokens_per_forward,
        "drafts": result.drafts,
        "canvases": result.canvases,
        "promptTokens": result.prompt_tokens,
        "timingsMs": {
            "load": load_ms,
            "prompt": timings.prompt,
            "denoise": timings.denoise,
            "total": load_ms + timings.total,
        },
        "model": service.model_spec,
        "device": service.status().device,
    }


def _split_path(spec: str, form: str) -> tuple[Path, str]:
    """FILE and the position part of FILE:LINE:COL[-LINE:COL]; split from the right since names may hold ':'."""
    colons = form.count(":") - 1  # colons inside the position part
    parts = spec.rsplit(":", colons + 1)
    if len(parts) != colons + 2 or not parts[0]:
        raise UsageError(f"'{spec}' is not {form}")
    return Path(parts[0]), ":".join(parts[1:])


def _read_utf8(path: Path) -> str:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise UsageError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise UsageError(f"{path}: is a directory") from None
    except OSError as error:
        raise UsageError(f"{path}: {error.strerror}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise UsageError(f"{path}: not UTF-8 text (byte {error.start})") from None


def _offset(text: str, line_col: str, spec: str) -> int:
    """str offset of a 1-based LINE:COL; COL may be one past the line's last character."""
    try:
        line, column = (int(part) for part in line_col.split(":"))
    except ValueError:
        raise UsageError(f"'{spec}': LINE and COL must be numbers") from None
    lines = text.split("\n")
    if not 1 <= line <= len(lines):
        raise UsageError(f"'{spec}': line {line} is outside the file (1..{len(lines)})")
    if not 1 <= column <= len(lines[line - 1]) + 1:
        raise UsageError(
            f"'{spec}': column {column} is outside line {line} (1..{len(lines[line - 1]) + 1})"
        )
    return sum(len(previous) + 1 for previous in lines[: line - 1]) + column - 1


def _window_large_text(text: str, offset: int) -> tuple[str, int]:
    """Cut a huge file to whole lines around the cursor; the context budget is far smaller anyway."""
    if len(text) <= LARGE_FILE_CHARS:
        return text, offset
    start = text.rfind("\n", 0, max(0, offset - WINDOW_CHARS)) + 1
    end = text.find("\n", min(len(text), offset + WINDOW_CHARS))
    end = len(text) if end == -1 else end
    return text[start:end], offset - start
