"""The cross-file snippets while the user types (server/workspace.py), on a clock the test moves.

A prompt's snippets change only with its line; a new line typed while the user types takes the
newest choice made in the background, never one made on the keystroke's path; that choice is made
once the client has been quiet for TYPING_S. "Typing" and "quiet" are both read from the syntax
worker's clock (a `ManualClock` here), and "the background choice is made" is the worker's
`settled` event: no verdict rests on how fast this machine is.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from manual_clock import ManualClock

from dgemma_lsp.engine.api import InfillContext
from dgemma_lsp.server.documents import DocumentStore, SyntaxWorker
from dgemma_lsp.server.settings import ServerSettings
from dgemma_lsp.server.workspace import TYPING_S, WorkspaceContext

MODELS = '''class Invoice:
    """A bill sent to a customer."""

    def __init__(self, customer, lines):
        self.customer = customer
        self.lines = lines

    def total_with_tax(self, rate):
        return sum(line.amount for line in self.lines) * (1 + rate)
'''
LEDGER = '''from .models import Invoice


def settle(invoice: Invoice):
    owed = 0
    return owed
'''
BUDGET = ServerSettings().cross_file_budget
KEYSTROKE_S = 0.2
"""Between two keys of a user typing: well within TYPING_S."""


async def settled(worker: SyntaxWorker) -> None:
    """The worker did what it could: no job queued, none running but one waiting for quiet."""
    assert await asyncio.to_thread(worker.settled.wait, 60), "the syntax worker never settled"


@pytest.fixture
async def session(tmp_path: Path):
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "__init__.py").write_text("")
    (tmp_path / "app" / "models.py").write_text(MODELS)
    (tmp_path / "app" / "ledger.py").write_text(LEDGER)
    clock = ManualClock()
    documents = DocumentStore(SyntaxWorker(clock=clock))
    context = WorkspaceContext(documents)
    context.open_workspace(tmp_path.as_uri())
    uri = (tmp_path / "app" / "ledger.py").as_uri()
    documents.open(uri, "python", 1, LEDGER)
    await settled(documents.worker)  # the client never spoke: quiet, so the index is built
    assert context.index is not None and context.index.complete
    try:
        yield clock, documents.worker, context, uri
    finally:
        documents.worker.close()


def models_score(snippets) -> float:
    return next(s.score for s in snippets if s.path == "app/models.py")


async def test_a_new_line_typed_keeps_the_snippets_until_a_pause(session):
    clock, worker, context, uri = session

    async def ask(text: str, line: int, character: int):
        """A completion's prompt at (line, character) of `text`, as the server asks for it."""
        lines = text.split("\n")
        offset = sum(len(before) + 1 for before in lines[:line]) + character
        infill = InfillContext(prefix=text[:offset], suffix=text[offset:], language="python")
        worker.client_spoke()  # every message does (server/lsp_server.py)
        return await worker.run(lambda: context.snippets(uri, "python", infill, BUDGET))

    before = await ask(LEDGER, 4, len("    owed = 0"))  # asked for the first time: chosen at once
    assert "class Invoice:" in next(s.text for s in before if s.path == "app/models.py")

    # Enter, then a line that calls a method of the imported class: the code outside the cursor's line
    # changed, and with it what the choice picks; the new line's request still shows the snippets it
    # had, and so does every keystroke of that line.
    typed = LEDGER.replace("    owed = 0\n", "    owed = 0\n    owed = invoice.total_with_tax(0.2)\n    \n")
    clock.advance(KEYSTROKE_S)
    assert await ask(typed, 6, 4) == before
    typed = typed.replace("tax(0.2)\n    \n", "tax(0.2)\n    owed\n")
    clock.advance(KEYSTROKE_S)
    assert await ask(typed, 6, 8) == before

    # A pause: the choice for this line is made in the background (woken by a job, as a request would),
    # and the line itself still shows what it showed.
    clock.advance(TYPING_S + KEYSTROKE_S)
    await worker.run(lambda: None)
    await settled(worker)
    assert await ask(typed, 6, 8) == before

    # Typing again, Enter: the new line takes that choice, whose score for the class counts the call
    # of its method on the line before.
    typed = typed.replace("    owed\n", "    owed += 1\n    \n")
    clock.advance(KEYSTROKE_S)
    after = await ask(typed, 7, 4)
    assert models_score(after) > models_score(before)
