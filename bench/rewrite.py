"""`dgemma-lsp bench rewrite`: how much of a selection "Rewrite selection" keeps, per strength.

Each selection (the top-level definitions of a Python file, one to several
canvases long) goes through the server's own rewrite path: prepare_rewrite,
InfillService.denoise, finish_rewrite. The figure is the kept share: the share of
the selection's tokens found, in order, in the rewrite (difflib's matching blocks
over token ids), averaged over selections and seeds, for each strength and each
way of keeping the kept tokens visible (`--keep`, engine/runtime/rewriting.py).
On the random tiny model only the mechanics show (pinned tokens come back by
construction); judging which keeping writes better code needs a trained model.
Knows the engine's pipeline and types; not LSP.
"""

from __future__ import annotations

import difflib
import statistics
from pathlib import Path

import msgspec

from .report import say, write_report

STRENGTHS = (0.1, 0.3, 0.5, 0.7, 0.9, 1.0)
KEEPS = ("canvas", "prompt", "both")
EXAMPLE = Path(__file__).resolve().parent / "executor.py"
"""Always installed beside this module: the default file whose blocks are rewritten."""


class CurvePoint(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    keep: str
    strength: float
    kept_share: float
    """Mean over selections and seeds."""
    unchanged: float
    """Share of rewrites identical to their selection."""
    rewrites: int


class RewriteReport(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    model: str
    steps: int | None
    selections: int
    selection_tokens: list[int]
    """Token count of each selection (the canvas is 32 tokens on the tiny model, 256 on the real one)."""
    curve: list[CurvePoint]


DEFINITIONS = ("function_definition", "class_definition", "decorated_definition")


def selections_of(text: str) -> list[tuple[int, int]]:
    """Str spans of the file's top-level definitions (functions, classes), in order."""
    from dgemma_lsp.engine.syntax.document import SyntaxDocument

    doc = SyntaxDocument(text, "python")
    return [doc.node_span(node) for node in doc.tree.root_node.children if node.type in DEFINITIONS]


def kept_share(tokenizer, selection: str, answer: str) -> float:
    before = tokenizer(selection, add_special_tokens=False)["input_ids"]
    after = tokenizer(answer, add_special_tokens=False)["input_ids"]
    matcher = difflib.SequenceMatcher(None, before, after, autojunk=False)
    return sum(block.size for block in matcher.get_matching_blocks()) / max(1, len(before))


def run_benchmark(model: str, *, steps: int | None, seeds: int, keeps, strengths, file: Path, limit: int,
                  max_selection_tokens: int, device=None, dtype=None, log=None) -> RewriteReport:
    from dgemma_lsp.engine.api import GenerationSettings
    from dgemma_lsp.engine.runtime.service import InfillService
    from dgemma_lsp.engine.syntax.document import SyntaxDocument
    from dgemma_lsp.engine.syntax.infill import finish_rewrite, prepare_rewrite

    service = InfillService(model, device=device, dtype=dtype)
    service.load()
    tokenizer = service._runtime.tokenizer
    text = file.read_text("utf-8")
    doc = SyntaxDocument(text, "python")
    def tokens(span: tuple[int, int]) -> int:
        return len(tokenizer(text[span[0]:span[1]], add_special_tokens=False)["input_ids"])

    spans = [span for span in selections_of(text) if tokens(span) <= max_selection_tokens][:limit]
    if not spans:
        raise SystemExit(f"dgemma-lsp bench rewrite: no definition of at most {max_selection_tokens} tokens in {file}")
    curve = []
    for keep in keeps:
        for strength in strengths:
            shares, unchanged = [], 0
            for start, end in spans:
                selection = text[start:end]
                for seed in range(seeds):
                    request = prepare_rewrite(doc, start, end, strength,
                                              GenerationSettings(steps=steps, seed=seed), keep=keep)
                    result = service.denoise(request)
                    answer = finish_rewrite(result.candidates[0].text, selection)
                    shares.append(kept_share(tokenizer, selection, answer))
                    unchanged += answer == selection
            point = CurvePoint(keep=keep, strength=strength, kept_share=round(statistics.mean(shares), 3),
                               unchanged=round(unchanged / len(shares), 3), rewrites=len(shares))
            if log:
                log(f"rewrite: keep {keep} strength {strength}: kept {point.kept_share:.1%}")
            curve.append(point)
    lengths = [tokens(span) for span in spans]
    return RewriteReport(model=model, steps=steps, selections=len(spans), selection_tokens=lengths, curve=curve)


def format_table(report: RewriteReport) -> str:
    strengths = sorted({point.strength for point in report.curve})
    lines = [f"rewrite kept share ({report.model}, {report.selections} selections of "
             f"{min(report.selection_tokens)}-{max(report.selection_tokens)} tokens, steps {report.steps or 'default'})",
             "keep     " + "".join(f"{s:>8}" for s in strengths)]
    for keep in dict.fromkeys(point.keep for point in report.curve):
        row = {point.strength: point.kept_share for point in report.curve if point.keep == keep}
        lines.append(f"{keep:<9}" + "".join(f"{row[s]:>8.1%}" for s in strengths))
    return "\n".join(lines)


def add_arguments(parser) -> None:
    parser.add_argument("--steps", type=int, default=8, help="full-schedule steps per canvas (a rewrite runs its tail)")
    parser.add_argument("--seeds", type=int, default=2, help="rewrites per selection and point")
    parser.add_argument("--keep", choices=KEEPS, action="append", help="keeping mode(s); default all three")
    parser.add_argument("--strength", type=float, action="append", help=f"strength(s); default {STRENGTHS}")
    parser.add_argument("--file", type=Path, default=EXAMPLE,
                        help="a Python file whose top-level definitions are rewritten (default: bench/executor.py)")
    parser.add_argument("--limit", type=int, default=4, help="rewrite only its first N definitions")
    parser.add_argument("--max-selection-tokens", type=int, default=320,
                        help="skip definitions longer than this (tokens of the model's tokenizer)")


def run(args) -> int:
    report = run_benchmark(
        getattr(args, "model", None) or "tiny", steps=args.steps, seeds=args.seeds,
        keeps=args.keep or KEEPS, strengths=args.strength or STRENGTHS, file=args.file,
        limit=args.limit, max_selection_tokens=args.max_selection_tokens,
        device=getattr(args, "device", None), dtype=getattr(args, "dtype", None), log=say,
    )
    write_report(report, getattr(args, "json", False), format_table)
    return 0

