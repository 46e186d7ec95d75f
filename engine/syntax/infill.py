"""The pure half of one completion: before and after the denoiser.

prepare_infill: document + cursor -> hole plan + context + DenoiseRequest.
finish_candidates: raw denoised text -> post-processed, validated, ranked Candidates
(finish_lone_candidate: the same for one draft's text, made before the result arrives).
The same for a rewrite. Runs wherever the document lives (the language server's
process), so it knows tree-sitter but no torch and no LSP. Offsets are str indices.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from ..api import (
    Candidate,
    CrossFileSnippet,
    DenoiseRequest,
    DenoiseResult,
    GenerationSettings,
    HolePlan,
    InfillContext,
    Region,
)
from .context import build_context
from .document import SyntaxDocument
from .planning import plan_hole
from .postprocess import finish_text, strip_markdown_fences
from .validation import CandidateChecker, rank_candidates

DEFAULT_CONTEXT_TOKENS = 2048
"""Prefix + suffix + preamble budget. The real model has a 256K window, but every
prompt token costs encoder time on a cache miss; 2K keeps a miss under ~20 ms."""


def context_budget(model_tokens: int | None, wanted: int = DEFAULT_CONTEXT_TOKENS) -> int:
    """`wanted` context tokens, cut to what the model reads well (EngineStatus.context_tokens; None: no limit)."""
    return wanted if model_tokens is None else min(wanted, model_tokens)


CrossFileProvider = Callable[[InfillContext], tuple[CrossFileSnippet, ...]]
"""Snippets from other files for a prompt whose window is the given context (engine/crossfile/)."""


class PreparedInfill(msgspec.Struct, frozen=True, kw_only=True):
    """Everything decided before denoising, kept to finish the answer after it."""

    offset: int
    """Cursor offset in the document text."""
    plan: HolePlan
    """The hole at the cursor."""
    context: InfillContext
    """The prompt's text window."""
    request: DenoiseRequest
    """What the denoiser is asked."""


def prepare_infill(
    doc: SyntaxDocument,
    offset: int,
    settings: GenerationSettings,
    *,
    budget_tokens: int = DEFAULT_CONTEXT_TOKENS,
    cache_key: str | None = None,
    priority: int = 0,
    cross_file: CrossFileProvider | None = None,
) -> PreparedInfill:
    """Plan the hole at `offset` and build the denoiser request for it.

    `cross_file`: when given, its snippets from other files join the context (a budget of their own)."""
    assert 0 <= offset <= len(doc.text), f"offset {offset} outside document of {len(doc.text)} chars"
    plan = plan_hole(doc, offset)
    context = build_context(doc, offset, plan, budget_tokens)
    if cross_file is not None:
        context = msgspec.structs.replace(context, cross_file=cross_file(context))
    request = DenoiseRequest(context=context, settings=settings, cache_key=cache_key, priority=priority)
    return PreparedInfill(offset=offset, plan=plan, context=context, request=request)


def finish_draft(prepared: PreparedInfill, raw_text: str) -> str:
    """Post-process one draft for display: the same trimming as the final answer, no ranking."""
    return finish_text(raw_text, prepared.context, prepared.plan).text


def finish_candidates(
    prepared: PreparedInfill, doc: SyntaxDocument, result: DenoiseResult, checker: CandidateChecker | None = None
) -> list[Candidate]:
    """Post-process every raw candidate, drop empty or duplicate ones, then rank by syntax and confidence.

    `checker`: `candidate_checker(prepared, doc)`, built while the engine ran (optional)."""
    return _finish_raw(prepared, doc, [(raw.text, raw.confidence) for raw in result.candidates], checker)


def finish_lone_candidate(
    prepared: PreparedInfill, doc: SyntaxDocument, raw_text: str, checker: CandidateChecker | None = None
) -> list[Candidate]:
    """What `finish_candidates` returns for a result whose only candidate is `raw_text`, with
    confidence 0.0: the caller puts the real one in, which changes nothing else when there is one
    candidate. Made from a draft while the engine is still denoising, so that the answer is ready
    when the result turns out to be that draft's text."""
    return _finish_raw(prepared, doc, [(raw_text, 0.0)], checker)


def _finish_raw(
    prepared: PreparedInfill, doc: SyntaxDocument, raws: list[tuple[str, float]], checker: CandidateChecker | None
) -> list[Candidate]:
    finished: list[Candidate] = []
    seen: set[tuple[str, int]] = set()
    for raw_text, confidence in raws:
        done = finish_text(raw_text, prepared.context, prepared.plan)
        if not done.text.strip() or (done.text, done.replace_chars) in seen:
            continue
        seen.add((done.text, done.replace_chars))
        finished.append(Candidate(text=done.text, confidence=confidence, replace_chars=done.replace_chars))
    return rank_candidates(doc, prepared.offset, finished, checker)


def candidate_checker(prepared: PreparedInfill, doc: SyntaxDocument) -> CandidateChecker | None:
    """What `finish_candidates` needs from the document alone: build it while the engine denoises."""
    return None if doc.tree is None else CandidateChecker.at_line_end(doc, prepared.offset)


def prepare_rewrite(
    doc: SyntaxDocument,
    start: int,
    end: int,
    strength: float,
    settings: GenerationSettings,
    *,
    budget_tokens: int = DEFAULT_CONTEXT_TOKENS,
    cache_key: str | None = None,
    keep: str = "canvas",
    priority: int = 0,
) -> DenoiseRequest:
    """Build the request that renoises the selection [start, end) and denoises it in its context.

    `keep`: how the selection's kept tokens stay visible (DenoiseRequest.rewrite_keep).
    """
    assert 0 <= start < end <= len(doc.text), f"selection {start}-{end} outside document"
    assert 0.0 < strength <= 1.0, f"strength {strength} outside (0, 1]"
    # The window is planned as if the selection were a hole at its start with the
    # selection removed: the model sees the code around it, and the selection as the
    # starting canvases (and, with keep "prompt"/"both", also in the prompt). A private
    # copy with the selection cut, reparsed incrementally and whole (`catch_up`: a bounded
    # reparse would leave the rest of the file's structure as before the cut): a fresh parse
    # of a 10,000-line file took ~36 ms on the worker, where keystrokes wait behind it.
    around = doc.snapshot()
    around.apply_change(start, end, "")
    around.catch_up()
    plan = HolePlan(kind="text", region=Region(start, start), stop="selection")
    context = build_context(around, start, plan, budget_tokens)
    return DenoiseRequest(
        context=context,
        settings=settings,
        cache_key=cache_key,
        selection=doc.text[start:end],
        strength=strength,
        rewrite_keep=keep,
        priority=priority,
    )


def finish_rewrite(raw_text: str, selection: str) -> str:
    """The replacement for the selection: fences stripped, the selection's trailing newline kept."""
    text = strip_markdown_fences(raw_text)
    if selection.endswith("\n") and not text.endswith("\n"):
        text += "\n"
    return text
