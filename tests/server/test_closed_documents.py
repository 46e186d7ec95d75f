"""A closed document leaves nothing behind but bounded caches (counted, never timed).

A real `dgemma-lsp --stdio --model tiny-random` gets documents one after another, each opened,
edited, completed and closed, as over a day of editing. `dgemma.serverStats` reports what
the server retains: no open document, no scheduler job, completion-cache entries within
its capacity, no object of the closed documents (OpenDocument, LineIndex, SyntaxDocument)
alive after a full collection but at most the most recent one, and no future filed for their
notifications (pygls 2.1 kept one per didOpen/didChange/didClose for the whole session). `bench soak` measures the same as RSS.
"""

from __future__ import annotations

import pytest
import pytest_lsp
from lsp_session import FAST, capabilities, config, initialize, open_document, within
from lsprotocol import types as lsp
from pytest_lsp import LanguageClient

pytestmark = pytest.mark.asyncio(loop_scope="module")

TEXT = "import math\n\n\n" + "".join(
    f"def function_{i}(values):\n    total = 0\n    for value in values:\n        total += value * {i}\n    return total\n\n\n"
    for i in range(30)
)
CACHE_SIZE = 8


@pytest_lsp.fixture(scope="module", config=config())
async def client(lsp_client: LanguageClient):
    await initialize(lsp_client, capabilities("visual-studio-code"), {**FAST, "cacheSize": CACHE_SIZE})
    yield
    await lsp_client.shutdown_session()


async def edit_complete_close(client: LanguageClient, number: int) -> None:
    uri = f"file:///tmp/closed_{number}.py"
    open_document(client, uri, TEXT)
    line = TEXT.count("\n") - 2
    for edit in range(3):
        client.text_document_did_change(lsp.DidChangeTextDocumentParams(
            text_document=lsp.VersionedTextDocumentIdentifier(uri=uri, version=edit + 2),
            content_changes=[lsp.TextDocumentContentChangePartial(
                range=lsp.Range(start=lsp.Position(line=line, character=0), end=lsp.Position(line=line, character=0)),
                text="x")],
        ))
        await within(client.text_document_inline_completion_async(lsp.InlineCompletionParams(
            text_document=lsp.TextDocumentIdentifier(uri=uri), position=lsp.Position(line=line, character=edit + 1),
            context=lsp.InlineCompletionContext(trigger_kind=lsp.InlineCompletionTriggerKind.Invoked),
        )))
    client.text_document_did_close(lsp.DidCloseTextDocumentParams(text_document=lsp.TextDocumentIdentifier(uri=uri)))


async def retained(client: LanguageClient) -> dict:
    stats = await within(client.workspace_execute_command_async(
        lsp.ExecuteCommandParams(command="dgemma.serverStats", arguments=[{"retained": True}])))
    return dict(stats["retained"]) if isinstance(stats, dict) else dict(stats.retained._asdict())


async def test_closed_documents_leave_nothing_behind_but_bounded_caches(client: LanguageClient):
    for number in range(10):  # warm up: caches fill, lazy imports happen
        await edit_complete_close(client, number)
    before = await retained(client)
    more = 20
    for number in range(10, 10 + more):
        await edit_complete_close(client, number)
    after = await retained(client)
    assert after["documents"] == 0, (before, after)
    assert after["documents"] == 0 and after["schedulerJobs"] == 0
    # No text, line index or syntax tree of the closed documents is alive: at most the most recent
    # request's line index (one object, the same after 20 more documents: it does not accumulate).
    assert after["documentObjects"] == before["documentObjects"] <= 1, (before, after)
    # pygls filed a future per didOpen/didChange/didClose for the whole session: only this request's is left.
    assert after["requestFutures"] == before["requestFutures"] == 1
    assert after["cacheEntries"] <= CACHE_SIZE
    assert after["promptCacheBytes"] <= before["promptCacheBytes"]  # closed documents' prompt caches are freed
