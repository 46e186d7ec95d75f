"""One inline completion or one rewrite, from an open document to text edits in str offsets.

Inline completion: snapshot the document at the request, answer from the cache
or (through the scheduler) plan + denoise + finish with the engine's pipeline,
then map each candidate to a `Suggestion` (text + the span it replaces). Planning,
context and finishing run on the documents' syntax worker, never on the event loop
(drafts too: the newest draft is also finished as the answer it would make, which is
ready when the result is that draft's text, as it most often is);
finishing validates against a snapshot of the syntax taken when the request was
planned (trees copied in O(1)), so a document that moved on meanwhile costs nothing;
the enclosing definition it validates against is parsed while the engine denoises.
When the editor's completion popup has an item selected, the infill is computed
for the text *as if that item were accepted*, and each suggestion starts with
the item's text and replaces the item's range: that is what editors require
of an inline completion that extends a selected completion.

Rewrite: renoise the selection, denoise it in its context, return the new text.
Knows the engine's pipeline and types; knows nothing of LSP or positions.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import msgspec

from dgemma_lsp.engine import errors
from dgemma_lsp.engine.api import Candidate, CrossFileSnippet, Draft, InfillContext
from dgemma_lsp.engine.client import EngineClient, EngineUnavailableError
from dgemma_lsp.engine.syntax.document import KEYSTROKE_PARSE_BUDGET_S, SyntaxDocument
from dgemma_lsp.engine.syntax.infill import (
    PreparedInfill,
    candidate_checker,
    finish_candidates,
    finish_draft,
    finish_lone_candidate,
    finish_rewrite,
    prepare_infill,
    prepare_rewrite,
)
from dgemma_lsp.engine.syntax.validation import CandidateChecker

from .documents import OpenDocument, SyntaxWorker
from .scheduler import CompletionCache, LatestWins, Superseded, slice_hashes
from .settings import ServerSettings

log = logging.getLogger(__name__)

CrossFileSource = Callable[[str, str, InfillContext, int], tuple[CrossFileSnippet, ...]]
"""(uri, language, context, budget) -> snippets from other files, run on the syntax worker."""

DraftSink = Callable[[int, str], None]
"""Receives (step, text to insert) for every denoising step."""

# DenoiseRequest.priority: a shared engine (the daemon) runs the highest first, then the newest.
PRIORITY_BACKGROUND = 0
"""Nobody waits on it: one-shot CLI, benchmarks."""
PRIORITY_TYPING = 1
"""An automatic inline completion while the user types."""
PRIORITY_WAITING = 2
"""The user asked and waits: an invoked inline completion, a rewrite."""


@dataclass(frozen=True)
class Selected:
    """The completion item the editor's popup has selected: it replaces [start, end) with text."""

    start: int
    end: int
    text: str


@dataclass(frozen=True)
class Suggestion:
    """Insert `text` in place of [start, end) of the request's text (start == end: a pure insert)."""

    text: str
    start: int
    end: int


@dataclass(frozen=True)
class _Target:
    """The text and cursor the infill is computed for, and how an answer maps back."""

    text: str
    offset: int
    lead: str
    """Prepended to every answer (the selected completion's text)."""
    start: int
    end: int
    """The span of the real text each answer replaces before its own replace_chars."""


class Completer:
    """Turns requests into suggestions: cache, latest-wins scheduling, engine, post-processing."""

    def __init__(self, engine: EngineClient, scheduler: LatestWins, cache: CompletionCache) -> None:
        self.engine = engine
        self.scheduler = scheduler
        self.cache = cache
        self.encoded_tokens: deque[int] = deque(maxlen=10_000)
        """Prompt tokens the engine encoded per request, after its prompt cache (for benchmarks)."""
        self.answers_from_drafts = 0
        """Answers that were ready when the result came, finished from the last draft (for benchmarks)."""
        self.cross_file: CrossFileSource | None = None
        """Snippets from other files for a prompt (server/workspace.py); None: the file alone."""
        self.last_cross_file: dict[str, tuple[CrossFileSnippet, ...]] = {}
        """The snippets of each document's latest prompt (`dgemma.contextSnippets`)."""

    async def complete(
        self,
        document: OpenDocument,
        offset: int,
        *,
        wanted: int,
        settings: ServerSettings,
        selected: Selected | None = None,
        on_draft: DraftSink | None = None,
        priority: int = PRIORITY_TYPING,
    ) -> list[Suggestion] | Superseded:
        """Suggestions for the cursor at `offset` in the document as it is now.

        Everything the answer depends on is read before the first await: the
        document may change while this request waits or denoises.
        """
        uri, text, revision = document.uri, document.text, document.revision
        language = document.language_id
        if selected is None:
            target = _Target(text, offset, "", offset, offset)
        else:
            virtual = text[: selected.start] + selected.text + text[selected.end:]
            target = _Target(
                virtual, selected.start + len(selected.text), selected.text, selected.start, selected.end
            )
        # A virtual text has no change history: the cache compares it by hashes alone.
        history = document.unchanged_since if selected is None else None

        def lookup() -> list[Suggestion] | None:
            hit = self.cache.lookup(uri, target.text, target.offset, wanted, unchanged_since=history)
            return None if hit is None else [_suggestion(target, c.text, c.replace_chars) for c in hit]

        def prepare(syntax: SyntaxDocument | None):
            if syntax is None:  # the document moved on while we waited: parse the text we were asked about
                base = SyntaxDocument(target.text, language, parse_budget_s=KEYSTROKE_PARSE_BUDGET_S)
            elif selected is not None:  # as if the popup's item were accepted, in a private copy
                base = syntax.snapshot()
                base.apply_change(selected.start, selected.end, selected.text)
            else:
                base = syntax
            budget = settings.cross_file_budget
            source = self.cross_file
            prepared = prepare_infill(
                base,
                target.offset,
                settings.generation(wanted),
                budget_tokens=settings.context_tokens,
                cache_key=uri,
                priority=priority,
                cross_file=(lambda context: source(uri, base.language, context, budget))
                if source is not None and budget > 0 else None,
            )
            self.last_cross_file[uri] = prepared.context.cross_file
            return prepared, base.snapshot() if base is syntax else base

        async def work() -> list[Suggestion]:
            with document.worker.answering(self.engine.status().state):
                return await answer_now()

        async def answer_now() -> list[Suggestion]:
            if document.revision == revision:
                prepared, frozen = await document.in_worker(prepare)
            else:
                prepared, frozen = await document.worker.run(lambda: prepare(None))
            # The first parse of the enclosing definition, on the worker while the engine denoises.
            # The draft jobs behind it on the worker read the checker from `built`. Handed over
            # after this step, which writes the request to the engine: a worker woken now would
            # hold the GIL for the parse (~1 ms) whenever the loop's thread lets it go first,
            # and the request would wait that long (`bench latency`, 12 alternating pairs on the 2-core
            # VM: overhead p99 3.74 ms with the hand-over after the write, 4.00 without).
            built: list[CandidateChecker | None] = []

            def build_checker() -> tuple[CandidateChecker | None, tuple[int, int]]:
                built.append(candidate_checker(prepared, frozen))
                return built[0], slice_hashes(target.text, target.offset)  # the cache entry's, off the loop

            checker = document.worker.run_after_this_step(build_checker)
            drafts = _DraftFinisher(prepared, frozen, built, target.lead, on_draft, document.worker)
            try:
                return await answer(prepared, frozen, checker, drafts)
            finally:
                drafts.close()  # answered, failed or cancelled: no draft of this request may follow

        async def answer(prepared, frozen, checker, drafts: _DraftFinisher) -> list[Suggestion]:
            try:
                result = await self.engine.denoise(prepared.request, drafts.arrived if on_draft else None)
            except EngineUnavailableError as error:
                log.info("no completion: %s", error)
                return []
            except errors.BadRequestError:
                raise
            except errors.EngineError as error:
                log.warning("completion failed: %s", error)
                return []
            self.encoded_tokens.append(result.prompt_tokens - result.cached_prompt_tokens)
            ready_checker, hashes = await checker
            candidates = await drafts.answer_for(result)
            if candidates is None:
                candidates = await document.worker.run(
                    lambda: finish_candidates(prepared, frozen, result, ready_checker))
            else:
                self.answers_from_drafts += 1
            self.cache.store(uri, target.text, target.offset, wanted, candidates,
                             revision=revision if selected is None else None, hashes=hashes)
            return [_suggestion(target, c.text, c.replace_chars) for c in candidates[:wanted]]

        return await self.scheduler.run(uri, lookup, work, settings.debounce_ms / 1000)

    async def rewrite(
        self, document: OpenDocument, start: int, end: int, settings: ServerSettings
    ) -> str | None:
        """The replacement for [start, end), or None when the engine is unavailable."""
        prepared = await document.in_worker(
            lambda syntax: prepare_rewrite(
                syntax,
                start,
                end,
                settings.rewrite_strength,
                settings.generation(1),
                budget_tokens=settings.context_tokens,
                priority=PRIORITY_WAITING,
            )
        )
        try:
            with document.worker.answering(self.engine.status().state):
                result = await self.engine.denoise(prepared)
        except EngineUnavailableError as error:
            log.info("no rewrite: %s", error)
            return None
        if not result.candidates:
            return None
        return finish_rewrite(result.candidates[0].text, prepared.selection or "")


class _DraftFinisher:
    """One request's drafts, finished on the syntax worker (never on the event loop).

    Each draft is trimmed for display there; the newest one is also finished as the answer it
    would make (`finish_lone_candidate`, validated with the request's checker). The engine's
    result is most often the last draft's text: then the answer is ready when the result
    arrives, and the request skips a round trip to the worker (two thread wake-ups, ~0.4 ms of
    a keystroke). Otherwise, or with several candidates, the result is finished as usual.
    No draft follows the answer: the request closes this finisher before it answers.
    """

    def __init__(self, prepared: PreparedInfill, frozen: SyntaxDocument, checker: list[CandidateChecker | None],
                 lead: str, on_draft: DraftSink | None, worker: SyntaxWorker) -> None:
        self.prepared, self.frozen, self.checker, self.lead = prepared, frozen, checker, lead
        self.on_draft, self.worker = on_draft, worker
        self.newest: str | None = None
        self.newest_job: asyncio.Future | None = None
        """The newest draft's finishing on the worker: (text shown, its answer)."""
        self.closed = False

    def close(self) -> None:
        """The request is answered or cancelled: drafts still on the worker are dropped."""
        self.closed = True

    def arrived(self, step: Draft) -> None:
        """On the event loop: hand the draft to the worker."""
        if self.closed:
            return
        self.newest = raw = step.text
        self.newest_job = job = self.worker.run(lambda: self._finish(raw))
        job.add_done_callback(lambda done: self._finished(step, done))

    def _finish(self, raw: str) -> tuple[str, list[Candidate] | None]:
        """On the worker: the text shown, and the answer unless a newer draft came meanwhile."""
        if self.closed:
            return "", None
        shown = finish_draft(self.prepared, raw)
        if raw != self.newest:
            return shown, None
        checker = self.checker[0] if self.checker else None
        return shown, finish_lone_candidate(self.prepared, self.frozen, raw, checker)

    def _finished(self, step: Draft, done) -> None:
        """On the event loop."""
        if done.cancelled() or self.closed:
            return
        if done.exception() is not None:
            log.error("finishing a draft failed", exc_info=done.exception())
            return
        shown, _ = done.result()
        if self.on_draft is not None:
            self.on_draft(step.step, self.lead + shown)

    async def answer_for(self, result) -> list[Candidate] | None:
        """The finished answer when `result` is the newest draft's text alone; None: finish it.

        When that draft is still on the worker, its finishing is awaited: the worker runs jobs in
        order, so a new finishing job would only queue behind it (and whether the draft had
        finished first would depend on the machine's speed). The answer is read from the job
        itself: a job that is done may not have had its done callbacks (`_finished`) run yet,
        as they run on the loop's next pass, and this task can come first."""
        job = self.newest_job
        if job is None or len(result.candidates) != 1 or result.candidates[0].text != self.newest:
            return None
        if not job.done():
            await asyncio.wait([job])
        if job.cancelled() or job.exception() is not None:
            return None
        _, answer = job.result()
        if answer is None:
            return None
        confidence = result.candidates[0].confidence
        return [msgspec.structs.replace(c, confidence=confidence) for c in answer]


def _suggestion(target: _Target, text: str, replace_chars: int) -> Suggestion:
    return Suggestion(target.lead + text, target.start, target.end + replace_chars)
