"""workspace/executeCommand commands that report or reload: `dgemma.status`, `dgemma.reloadModel`,
`dgemma.contextSnippets`, `dgemma.serverStats` (docs/protocol.md). The rewrite command is
rewrite_lsp.py's, the next-edit one inline_edit_lsp.py's.
"""

from __future__ import annotations

import gc
from typing import Any

from pygls.exceptions import JsonRpcInvalidParams

from dgemma_lsp.engine.syntax.document import SyntaxDocument

from .documents import OpenDocument
from .lsp_server import DGemmaServer, status_payload
from .positions import LineIndex

STATUS_COMMAND = "dgemma.status"
RELOAD_COMMAND = "dgemma.reloadModel"
CONTEXT_COMMAND = "dgemma.contextSnippets"
"""The cross-file snippets of a document's latest prompt: [{path, startLine, endLine, source, score,
tokens}] (docs/context.md)."""
STATS_COMMAND = "dgemma.serverStats"
"""For benchmarks: the longest event-loop stall, the longest busy pass of the loop and the prompt
tokens encoded per request since the previous call (the first call starts the loop monitor; with
`{"probe": true}` it also probes the loop every millisecond, see server/loop_monitor.py)."""


def register(server: DGemmaServer) -> None:
    server.command(STATUS_COMMAND)(status)
    server.command(RELOAD_COMMAND)(reload_model)
    server.command(CONTEXT_COMMAND)(context_snippets)
    server.command(STATS_COMMAND)(server_stats)


def status(ls: DGemmaServer, *args: Any):
    return status_payload(ls.engine.status(), ls.scheduler.in_flight)


async def reload_model(ls: DGemmaServer, *args: Any):
    return status_payload(await ls.reload_engine(), ls.scheduler.in_flight)


def context_snippets(ls: DGemmaServer, *args: Any):
    if len(args) != 1 or not isinstance(args[0], str):
        raise JsonRpcInvalidParams(f"{CONTEXT_COMMAND} takes (uri)")
    return [{"path": s.path, "startLine": s.start_line, "endLine": s.end_line, "source": s.source,
             "score": s.score, "tokens": s.tokens, "text": s.text}
            for s in ls.completer.last_cross_file.get(args[0], ())]


def server_stats(ls: DGemmaServer, *args: Any):
    options = args[0] if len(args) == 1 else {}
    probe = options.get("probe", False) if isinstance(options, dict) else None
    # What the server retains costs a full garbage collection and a walk of every Python object
    # (~0.3 s of the event loop with the tiny model loaded): only when asked, never while typing.
    with_retained = options.get("retained", False) if isinstance(options, dict) else None
    if len(args) > 1 or not isinstance(probe, bool) or not isinstance(with_retained, bool):
        raise JsonRpcInvalidParams(
            f'{STATS_COMMAND} takes no argument or {{"probe": true|false, "retained": true|false}}')
    started = ls.loop_monitor.running
    if not started:
        ls.loop_monitor.probe = probe
    ls.loop_monitor.start()
    encoded = list(ls.completer.encoded_tokens)
    ls.completer.encoded_tokens.clear()
    index = ls.crossfile.index
    return {"loopStallMs": ls.loop_monitor.take() if started else None,
            "loopBusyMs": ls.loop_monitor.take_busy() if started else None,
            "encodedTokens": encoded, "answersFromDrafts": ls.completer.answers_from_drafts,
            "retained": retained(ls) if with_retained else None,
            "crossFileIndex": None if index is None else {"files": len(index), "complete": index.complete}}


def retained(ls: DGemmaServer) -> dict[str, int]:
    """What the server holds now (for `bench soak` and the tests that a closed document leaves nothing
    behind but bounded caches): Python objects are counted after a full collection."""
    gc.collect()
    objects = gc.get_objects()
    per_document = (OpenDocument, SyntaxDocument, LineIndex)
    return {
        "documents": len(ls.documents),
        "documentObjects": sum(1 for o in objects if isinstance(o, per_document)),
        "requestFutures": ls.protocol.running_handlers(),  # this request's own included
        "cacheEntries": len(ls.cache),
        "schedulerJobs": ls.scheduler.in_flight,
        "promptCacheBytes": ls.engine.status().prompt_cache_bytes or 0,
        "pythonObjects": len(objects),
    }
