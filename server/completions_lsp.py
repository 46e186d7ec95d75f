"""Inline completion on the wire: textDocument/inlineCompletion, the `dgemma/draft` notifications
of a request, and what the client says of an answer (`dgemma/didShowCompletion`,
`dgemma/didPartiallyAcceptCompletion`: counted for `dgemma-lsp stats`, docs/protocol.md).

The policy (cache, latest wins, candidates) is completions.py; this module translates.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from lsprotocol import types as lsp

from dgemma_lsp.engine.syntax.languages import normalize_language

from .completions import PRIORITY_TYPING, PRIORITY_WAITING, Selected
from .documents import OpenDocument
from .line_endings import line_ending, with_line_ending
from .lsp_server import DGemmaServer
from .scheduler import Superseded

log = logging.getLogger(__name__)

DRAFT_NOTIFICATION = "dgemma/draft"
DID_SHOW = "dgemma/didShowCompletion"
DID_PARTIALLY_ACCEPT = "dgemma/didPartiallyAcceptCompletion"


def register(server: DGemmaServer) -> None:
    server.feature(lsp.TEXT_DOCUMENT_INLINE_COMPLETION, lsp.InlineCompletionOptions())(inline_completion)
    server.feature(DID_SHOW)(did_show)
    server.feature(DID_PARTIALLY_ACCEPT)(did_partially_accept)


async def inline_completion(ls: DGemmaServer, params: lsp.InlineCompletionParams):
    after_answer = ls.answer_first()
    document = ls.document(params.text_document.uri)
    cursor = ls.offset(document, params.position)
    if not ls.settings.enable:
        return lsp.InlineCompletionList(items=[])
    automatic = params.context.trigger_kind == lsp.InlineCompletionTriggerKind.Automatic
    selected = None
    if (info := params.context.selected_completion_info) is not None:
        start, end = ls.span(document, info.range)
        selected = Selected(start, end, info.text)
    on_draft = draft_sink(ls, document, params.position) if ls.settings.drafts else None
    ls.crossfile.viewed(document.uri, params.position.line)
    if ls.editor_definitions.enabled and ls.settings.cross_file_budget > 0:
        # Not awaited: the answer serves this prompt only if it comes first, else the next ones.
        ls.editor_definitions.cursor(document.uri, normalize_language(document.language_id), document.lines,
                                     params.position.line, ls.encoding)
    lines = document.lines  # the answer's positions refer to the text as of this request
    started = time.perf_counter()
    result = await ls.completer.complete(
        document,
        cursor,
        wanted=1 if automatic else ls.settings.max_candidates,
        settings=ls.request_settings,
        selected=selected,
        on_draft=on_draft,
        priority=PRIORITY_TYPING if automatic else PRIORITY_WAITING,
    )
    if not isinstance(result, Superseded) and result:
        latency_ms = (time.perf_counter() - started) * 1000
        after_answer.append(lambda: ls.stats.answered(latency_ms, items=len(result)))
        shown_version = document.version
        after_answer.append(lambda: ls.next_edits.completion_showing(document.uri, shown_version))
    return ls.inline_items(lines, cursor, result)


def draft_sink(ls: DGemmaServer, document: OpenDocument, position: lsp.Position):
    """Sends `dgemma/draft` for one request; the request id ties drafts to their request."""
    uri, version, request_id = document.uri, document.version, ls.protocol.msg_id
    where = {"line": position.line, "character": position.character}
    ending = line_ending(document.text)

    def send(step: int, text: str) -> None:
        text = with_line_ending(text, ending)
        ls.protocol.notify(
            DRAFT_NOTIFICATION,
            {"uri": uri, "version": version, "position": where, "requestId": request_id, "step": step, "text": text},
        )

    return send


def did_show(ls: DGemmaServer, params: Any) -> None:
    # Counted for `dgemma-lsp stats` (lengths only, kept on this machine).
    log.debug("completion shown: %s", _short(params))
    ls.stats.shown(len(_insert_text(params)))


def did_partially_accept(ls: DGemmaServer, params: Any) -> None:
    log.debug("completion partially accepted: %s", _short(params))
    accepted = getattr(params, "acceptedLength", None)
    text = _insert_text(params)
    ls.stats.accepted(accepted if isinstance(accepted, int) and accepted >= 0 else len(text), len(text))


def _insert_text(params: Any) -> str:
    """The shown/accepted item's insertText (a string or a snippet's value); "" when absent."""
    item = getattr(params, "item", None)
    text = getattr(item, "insertText", None)
    text = getattr(text, "value", text)
    return text if isinstance(text, str) else ""


def _short(params: Any) -> str:
    text = repr(params)
    return text if len(text) < 300 else text[:300] + "..."
