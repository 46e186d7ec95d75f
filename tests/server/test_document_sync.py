"""Document sync out of order, as real editors produce it: closing a file while its
completion runs, a change or close for a document the server never saw. None of it may
surface as an "Error in server" message, and the server keeps serving."""

from __future__ import annotations

import asyncio

import pytest
import pytest_lsp
from lsp_session import FAST, capabilities, config, initialize, open_document, wait_until, within
from lsprotocol import types as lsp
from pygls.exceptions import JsonRpcException
from pytest_lsp import LanguageClient

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_lsp.fixture(scope="module", config=config())
async def client(lsp_client: LanguageClient):
    await initialize(lsp_client, capabilities("visual-studio-code"), {**FAST, "steps": 40, "drafts": True})
    yield
    await lsp_client.shutdown_session()


def invoked(uri: str, line: int, character: int) -> lsp.InlineCompletionParams:
    return lsp.InlineCompletionParams(
        text_document=lsp.TextDocumentIdentifier(uri=uri),
        position=lsp.Position(line=line, character=character),
        context=lsp.InlineCompletionContext(trigger_kind=lsp.InlineCompletionTriggerKind.Invoked),
    )


def server_errors(client: LanguageClient) -> list[str]:
    return [m.message for m in client.messages if m.type == lsp.MessageType.Error]


async def test_closing_a_file_while_its_completion_runs(client: LanguageClient):
    uri = "file:///tmp/closing.py"
    open_document(client, uri, "def f(x):\n    return \n")
    pending = asyncio.ensure_future(client.text_document_inline_completion_async(invoked(uri, 1, 11)))
    await wait_until(client, lambda: any(m == "dgemma/draft" for m, _ in client.custom), "dgemma/draft")
    client.text_document_did_close(lsp.DidCloseTextDocumentParams(text_document=lsp.TextDocumentIdentifier(uri=uri)))
    result = await within(pending)
    assert result is None or not result.items
    assert server_errors(client) == []


async def ghost_is_unknown(client: LanguageClient, uri: str) -> None:
    with pytest.raises(JsonRpcException) as error:
        await within(client.text_document_inline_completion_async(invoked(uri, 0, 1)))
    assert error.value.code == -32602


async def test_change_and_close_for_unknown_documents_are_harmless(client: LanguageClient):
    uri = "file:///tmp/still-serving.py"
    open_document(client, uri, "total = \n")  # open before the stray messages, which must leave it be
    ghost = lsp.VersionedTextDocumentIdentifier(uri="file:///tmp/never-opened.py", version=2)
    client.text_document_did_change(
        lsp.DidChangeTextDocumentParams(
            text_document=ghost,
            content_changes=[lsp.TextDocumentContentChangePartial(
                range=lsp.Range(start=lsp.Position(line=0, character=0), end=lsp.Position(line=0, character=0)),
                text="x",
            )],
        )
    )
    # Harmless means: the stray change opened nothing (the ghost is still unknown, and a request
    # for it gets the usual InvalidParams; had the change made it "x", (0, 1) would be valid) ...
    await ghost_is_unknown(client, ghost.uri)
    for _ in range(2):  # ... closing what is not open changes nothing either ...
        client.text_document_did_close(
            lsp.DidCloseTextDocumentParams(text_document=lsp.TextDocumentIdentifier(uri=ghost.uri))
        )
    await ghost_is_unknown(client, ghost.uri)
    # ... the document that is open still answers with a completion ...
    result = await within(client.text_document_inline_completion_async(invoked(uri, 0, 8)))
    assert result is not None and result.items
    # ... and the user saw no error.
    assert server_errors(client) == []
