"""A request's newest draft, finished on the worker, is its answer when the result is that text.

Real SyntaxDocument, real `prepare_infill`, a real worker thread. The order of the event loop's
callbacks is what is tested: no verdict rests on the machine's speed.
"""

from __future__ import annotations

import asyncio

from dgemma_lsp.engine.api import DenoiseResult, Draft, GenerationSettings, RawCandidate, Timings
from dgemma_lsp.engine.syntax.document import SyntaxDocument
from dgemma_lsp.engine.syntax.infill import candidate_checker, finish_candidates, prepare_infill
from dgemma_lsp.server.completions import _DraftFinisher
from dgemma_lsp.server.documents import SyntaxWorker

TEXT = "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + \n"
ANSWER = "fib(n - 2)"


def _result(text: str) -> DenoiseResult:
    return DenoiseResult(
        candidates=[RawCandidate(text=text, confidence=0.75, tokens=5)], steps=2, tokens_per_forward=2.5,
        drafts=2, canvases=1, prompt_tokens=40, cached_prompt_tokens=0, timings_ms=Timings(),
    )


async def test_a_finished_draft_is_the_answer_before_its_done_callbacks_have_run():
    """Seen in CI: the worker's job for the newest draft was done, but its done callback (which
    sends the draft) had not run yet when the request read the answer, which then came from
    finishing the result again. The answer is read from the job itself; the draft whose callback
    comes after the answer is not sent (no draft follows the answer)."""
    doc = SyntaxDocument(TEXT, "python")
    prepared = prepare_infill(doc, TEXT.index("+ \n") + 2, GenerationSettings(steps=2))
    checker = candidate_checker(prepared, doc)
    worker = SyntaxWorker()
    sent: list[str] = []
    drafts = _DraftFinisher(prepared, doc, [checker], "", lambda _step, shown: sent.append(shown), worker)
    try:
        drafts.arrived(Draft(step=2, text=ANSWER))
        job = drafts.newest_job
        while not job.done():  # the job is set done on one pass; its callbacks run on a later one
            await asyncio.sleep(0)
        assert sent == []  # the state the request met in CI: done, not yet sent
        answer = await drafts.answer_for(_result(ANSWER))
        drafts.close()  # what the request does as it answers
        assert answer == finish_candidates(prepared, doc, _result(ANSWER), checker)
        for _ in range(3):
            await asyncio.sleep(0)
        assert sent == []
    finally:
        worker.close()


async def test_a_result_other_than_the_newest_draft_is_finished_as_usual():
    doc = SyntaxDocument(TEXT, "python")
    prepared = prepare_infill(doc, TEXT.index("+ \n") + 2, GenerationSettings(steps=2))
    worker = SyntaxWorker()
    sent: list[str] = []
    drafts = _DraftFinisher(prepared, doc, [None], "", lambda _step, shown: sent.append(shown), worker)
    try:
        drafts.arrived(Draft(step=1, text="fib(n"))
        drafts.arrived(Draft(step=2, text=ANSWER))
        assert await drafts.answer_for(_result("fib(n - 3)")) is None
        assert await drafts.answer_for(_result(ANSWER)) is not None
        await asyncio.sleep(0)
        assert sent == ["fib(n", ANSWER]  # each draft shown, in order
    finally:
        worker.close()
