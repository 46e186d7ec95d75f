"""Next-edit suggestions for the language server: when to ask the engine, and what never to show.

The request (`textDocument/copilotInlineEdit`, Copilot's shape, see docs/next-edit.md) is answered
with at most one edit. Noise control, as the anchors do it (REFERENCE.md "Next-edit suggestions"):
- the request's document version must be the document's, at the request and at the answer
  (a stale edit would land on the wrong text): otherwise no edit;
- never while a completion is showing, as far as the server can know: an inline completion
  of the document is being computed, or one was answered (or reported shown) for the document
  version the request names and the client has not said it was dismissed since
  (`dgemma/didHideCompletion`);
- a per-document memory of rejected edits (LRU, REJECTED_PER_DOCUMENT), by `edit_key`, so an
  edit the user dismissed is not shown again even after unrelated lines moved it;
- an edit that reverts the user's last edit is dropped (engine/nextedit/proposal.py);
- the coalescing window (debounce) adapts: x1.5 after a rejection, x0.8 after an acceptance,
  within [DEBOUNCE_MIN_MS, DEBOUNCE_MAX_MS];
- latest wins per document (a newer request, a change of the document, `$/cancelRequest` or a
  close cancels the running one within a denoising step), as for completions.
A rejection is what the client says (`dgemma/didRejectInlineEdit`); an edit that was shown and
then ignored is not counted as one (clients that never send it still get every other filter).

Knows the engine's next-edit pipeline and client; knows nothing of LSP types or positions.
"""

from __future__ import annotations

import logging
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from dgemma_lsp.engine import errors
from dgemma_lsp.engine.api import Draft
from dgemma_lsp.engine.client import EngineClient, EngineUnavailableError
from dgemma_lsp.engine.nextedit.edits import EditLog, RecentEdit
from dgemma_lsp.engine.nextedit.proposal import ProposedEdit, edit_key, reverts_last_edit
from dgemma_lsp.engine.nextedit.request import PreparedNextEdit, finish_next_edit, prepare_next_edit

from .documents import OpenDocument
from .scheduler import LatestWins, Superseded
from .settings import ServerSettings

log = logging.getLogger(__name__)

REJECTED_PER_DOCUMENT = 20
"""Rejected edits remembered per document (least recently rejected forgotten first)."""
OFFERS_KEPT = 64
"""Edits offered (by id) whose show/accept/reject the server still recognises."""
DEBOUNCE_MIN_MS = 50
DEBOUNCE_MAX_MS = 3000
REJECT_FACTOR = 1.5
ACCEPT_FACTOR = 0.8
PRIORITY_NEXT_EDIT = 0
"""Nobody waits on a next edit: a shared engine runs typing completions first."""

DraftEditSink = Callable[[int, "ProposedEdit | None"], None]
"""Receives (step, the edit the draft would propose, or None) for every denoising step."""


@dataclass(frozen=True)
class Offer:
    """An edit the server answered with, as the client will name it back (by `id`)."""

    id: str
    uri: str
    version: int
    key: tuple[str, str]
    edit: ProposedEdit


@dataclass
class AdaptiveDebounce:
    """The coalescing window before a next edit is computed, in ms: longer after rejections."""

    base_ms: int = 300
    factor: float = 1.0

    @property
    def ms(self) -> float:
        if self.base_ms <= 0:
            return 0.0  # no window at all (tests, benchmarks)
        return min(DEBOUNCE_MAX_MS, max(DEBOUNCE_MIN_MS, self.base_ms * self.factor))

    def _scale(self, by: float) -> None:
        # Bounded in ms, so a long run of rejections does not take many accepts to undo.
        self.factor = min(DEBOUNCE_MAX_MS, max(DEBOUNCE_MIN_MS, self.ms * by)) / max(self.base_ms, 1)

    def accepted(self) -> None:
        self._scale(ACCEPT_FACTOR)

    def rejected(self) -> None:
        self._scale(REJECT_FACTOR)


@dataclass
class _DocumentMemory:
    rejected: OrderedDict[tuple[str, str], None] = field(default_factory=OrderedDict)
    completion_version: int | None = None
    """The document version for which an inline completion was answered or shown."""


class NextEditor:
    """Turns next-edit requests into at most one proposed edit, with the filters above."""

    def __init__(self, engine: EngineClient, completions: LatestWins) -> None:
        self.engine = engine
        self.completions = completions
        """The completions' scheduler: a completion computed for the document blocks a next edit."""
        self.scheduler = LatestWins()
        self.debounce = AdaptiveDebounce()
        self._memory: dict[str, _DocumentMemory] = {}
        self._offers: OrderedDict[str, Offer] = OrderedDict()
        self.counts = {"requested": 0, "proposed": 0, "noEdit": 0, "reverts": 0, "rejectedAgain": 0,
                       "shown": 0, "accepted": 0, "rejected": 0}
        """Outcomes so far (for tests and `dgemma.serverStats`-style inspection)."""

    # -- the document's side -------------------------------------------------------------

    def _doc(self, uri: str) -> _DocumentMemory:
        memory = self._memory.get(uri)
        if memory is None:
            memory = self._memory[uri] = _DocumentMemory()
        return memory

    def document_changed(self, uri: str) -> None:
        """The document moved on: a next edit under way is for a text that is gone."""
        self.scheduler.supersede(uri)

    def document_closed(self, uri: str) -> None:
        self.scheduler.supersede(uri)
        self._memory.pop(uri, None)
        for key in [key for key, offer in self._offers.items() if offer.uri == uri]:
            del self._offers[key]

    def completion_showing(self, uri: str, version: int) -> None:
        """An inline completion was answered (non-empty) or shown for this version of the document."""
        self._doc(uri).completion_version = version

    def completion_hidden(self, uri: str, version: int) -> None:
        """The client says the completion shown for this version is gone (dismissed): it blocks no more."""
        memory = self._memory.get(uri)
        if memory is not None and memory.completion_version == version:
            memory.completion_version = None

    def completion_blocks(self, uri: str, version: int) -> bool:
        return self.completions.live(uri) or self._doc(uri).completion_version == version

    # -- proposing -----------------------------------------------------------------------

    async def propose(
        self, document: OpenDocument, cursor: int, settings: ServerSettings, on_draft: DraftEditSink | None = None,
    ) -> Offer | None | Superseded:
        """The edit to offer for the cursor at `cursor` in the document as it is now, or None.

        Everything the answer depends on is read before the first await."""
        self.counts["requested"] += 1
        uri, text, version = document.uri, document.text, document.version
        edits = EditLog(document.edits.capacity)
        edits.edits = [RecentEdit(e.start, e.end, e.before) for e in document.edits.edits]
        last = edits.last
        self.debounce.base_ms = settings.next_edit_debounce_ms
        strength = settings.next_edit_strength
        generation = settings.generation(1)

        async def work() -> Offer | None:
            prepared: PreparedNextEdit | None = await document.in_worker(
                lambda syntax: prepare_next_edit(
                    syntax, cursor, edits, strength, generation, path=uri.rsplit("/", 1)[-1],
                    max_lines=settings.next_edit_lines, budget_tokens=settings.context_tokens,
                    priority=PRIORITY_NEXT_EDIT,
                )
            )
            if prepared is None:
                return None
            forward = None
            if on_draft is not None:
                def forward(draft: Draft) -> None:
                    on_draft(draft.step, finish_next_edit(prepared, text, draft.text))
            try:
                with document.worker.answering(self.engine.status().state):
                    result = await self.engine.denoise(prepared.request, forward)
            except EngineUnavailableError as error:
                log.info("no next edit: %s", error)
                return None
            except errors.BadRequestError:
                raise
            except errors.EngineError as error:
                log.warning("next edit failed: %s", error)
                return None
            if not result.candidates:
                return None
            answer = result.candidates[0].text
            edit = await document.worker.run(lambda: finish_next_edit(prepared, text, answer))
            return self._filter(uri, version, text, edit, last)

        return await self.scheduler.run(uri, lambda: None, work, self.debounce.ms / 1000)

    def _filter(self, uri: str, version: int, text: str, edit: ProposedEdit | None,
                last: RecentEdit | None) -> Offer | None:
        if edit is None:
            self.counts["noEdit"] += 1
            return None
        if reverts_last_edit(text, edit, last):
            self.counts["reverts"] += 1
            log.debug("next edit dropped: it reverts the last edit")
            return None
        key = edit_key(text, edit)
        if key in self._doc(uri).rejected:
            self.counts["rejectedAgain"] += 1
            log.debug("next edit dropped: rejected before")
            return None
        offer = Offer(uuid.uuid4().hex[:16], uri, version, key, edit)
        self._offers[offer.id] = offer
        while len(self._offers) > OFFERS_KEPT:
            self._offers.popitem(last=False)
        self.counts["proposed"] += 1
        return offer

    # -- what the client did with an offer -------------------------------------------------

    def shown(self, offer_id: str) -> bool:
        if offer_id not in self._offers:
            return False
        self.counts["shown"] += 1
        return True

    def accepted(self, offer_id: str) -> bool:
        offer = self._offers.pop(offer_id, None)
        if offer is None:
            return False
        self.counts["accepted"] += 1
        self.debounce.accepted()
        return True

    def rejected(self, offer_id: str) -> bool:
        offer = self._offers.pop(offer_id, None)
        if offer is None:
            return False
        self.counts["rejected"] += 1
        self.debounce.rejected()
        rejected = self._doc(offer.uri).rejected
        rejected[offer.key] = None
        rejected.move_to_end(offer.key)
        while len(rejected) > REJECTED_PER_DOCUMENT:
            rejected.popitem(last=False)
        return True
