"""Next-edit suggestions over stdio: `dgemma-lsp --stdio --model tiny-random` driven by a real LSP client.

The tiny model writes noise, so what its answer proposes is not judged here (the torch-free
pipeline is, on true next edits, in tests/nextedit); what is: the capability, the answer's shape
and positions, stale versions, the rejection memory (a fixed seed makes the same request give the
same edit, so a rejected one must not come back), acceptance, the block while a completion shows,
cancellation, and bad params answered with an error.
"""

from __future__ import annotations

import asyncio

import pytest
import pytest_lsp
from lsp_session import (
    FAST,
    capabilities,
    config,
    initialize,
    offset_of,
    open_document,
    position_of,
    send_raw,
    wait_until,
    within,
)
from lsprotocol import types as lsp
from pygls.exceptions import JsonRpcException
from pytest_lsp import LanguageClient

pytestmark = pytest.mark.asyncio(loop_scope="module")
ENCODING = "utf-16"
INLINE_EDIT = "textDocument/copilotInlineEdit"
SOURCE = '''def load(path, mode):
    """Read the file at path."""
    with open(path, mode) as handle:
        data = handle.read()
    if not data:
        raise ValueError(path)
    return data
'''
SETTINGS = {**FAST, "nextEditDebounceMs": 0, "nextEditStrength": 0.6, "drafts": True}


@pytest_lsp.fixture(scope="module", config=config())
async def client(lsp_client: LanguageClient):
    result = await initialize(lsp_client, capabilities("visual-studio-code"), SETTINGS)
    lsp_client.init_result = result
    yield
    await lsp_client.shutdown_session()


def rename_in_signature(client: LanguageClient, uri: str) -> tuple[str, int]:
    """Open SOURCE and rename the parameter in the signature (version 2); (text now, cursor after the edit)."""
    open_document(client, uri, SOURCE)
    start = SOURCE.index("path")
    change = lsp.TextDocumentContentChangePartial(
        range=lsp.Range(start=position_of(SOURCE, start, ENCODING), end=position_of(SOURCE, start + 4, ENCODING)),
        text="filename",
    )
    client.text_document_did_change(lsp.DidChangeTextDocumentParams(
        text_document=lsp.VersionedTextDocumentIdentifier(uri=uri, version=2), content_changes=[change]))
    text = SOURCE[:start] + "filename" + SOURCE[start + 4:]
    return text, start + len("filename")


def edit_params(uri: str, version: int, text: str, cursor: int) -> dict:
    position = position_of(text, cursor, ENCODING)
    return {"textDocument": {"uri": uri, "version": version},
            "position": {"line": position.line, "character": position.character}}


async def ask(client: LanguageClient, uri: str, version: int, text: str, cursor: int) -> dict:
    result = await within(send_raw(client, INLINE_EDIT, edit_params(uri, version, text, cursor)))
    return result if isinstance(result, dict) else {"edits": list(result.edits)} if hasattr(result, "edits") else result


def as_dict(value):
    if hasattr(value, "_asdict"):
        return {k: as_dict(v) for k, v in value._asdict().items()}
    if isinstance(value, dict):
        return {k: as_dict(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [as_dict(v) for v in value]
    return value


async def test_the_capability_is_advertised(client: LanguageClient):
    experimental = as_dict(client.init_result.capabilities.experimental)
    assert experimental["copilotInlineEdit"]["acceptCommand"] == "dgemma.acceptInlineEdit"
    assert "dgemma.acceptInlineEdit" in client.init_result.capabilities.execute_command_provider.commands


async def test_an_edit_has_copilots_shape_and_a_rejected_one_never_comes_back(client: LanguageClient):
    uri = "file:///tmp/next_edit_reject.py"
    text, cursor = rename_in_signature(client, uri)
    first = as_dict(await ask(client, uri, 2, text, cursor))
    (edit,) = first["edits"]  # the tiny model's answer (noise) differs from the window: one edit
    assert edit["textDocument"] == {"uri": uri, "version": 2}
    assert isinstance(edit["text"], str)
    command = edit["command"]
    assert command["command"] == "dgemma.acceptInlineEdit" and isinstance(command["arguments"][0], str)
    start = offset_of(text, lsp.Position(**edit["range"]["start"]), ENCODING)
    end = offset_of(text, lsp.Position(**edit["range"]["end"]), ENCODING)
    assert 0 <= start <= end <= len(text)
    assert text[start:end] != edit["text"]  # an edit changes something
    # The same request again (the seed is fixed) proposes the same edit, under a new id ...
    again = as_dict(await ask(client, uri, 2, text, cursor))
    assert [(e["range"], e["text"]) for e in again["edits"]] == [(edit["range"], edit["text"])]
    # ... shown, then dismissed: never offered again.
    client.protocol.notify("textDocument/didShowInlineEdit", {"item": {"command": again["edits"][0]["command"]}})
    client.protocol.notify("dgemma/didRejectInlineEdit", {"item": {"command": again["edits"][0]["command"]}})
    assert as_dict(await ask(client, uri, 2, text, cursor)) == {"edits": []}


async def test_an_edit_and_its_drafts_carry_the_documents_line_ending(client: LanguageClient):
    """In a CRLF document every line break the edit and its drafts insert is CRLF, and no lone CR is
    sent (LSP counts it as a line break, editors keep it inside the line; server/line_endings.py):
    the model writes "\\n" (Neovim drew a random model's "\\r" apart from the text it inserts)."""
    uri = "file:///tmp/next_edit_crlf.py"
    crlf = SOURCE.replace("\n", "\r\n")
    open_document(client, uri, crlf)
    start = crlf.index("path")
    client.text_document_did_change(lsp.DidChangeTextDocumentParams(
        text_document=lsp.VersionedTextDocumentIdentifier(uri=uri, version=2),
        content_changes=[lsp.TextDocumentContentChangePartial(range=lsp.Range(
            start=position_of(crlf, start, ENCODING), end=position_of(crlf, start + 4, ENCODING)), text="filename")]))
    text = crlf[:start] + "filename" + crlf[start + 4:]
    client.custom.clear()
    (edit,) = as_dict(await ask(client, uri, 2, text, start + len("filename")))["edits"]
    sent = [edit["text"]] + [params["edit"]["text"] for method, params in client.custom
                             if method == "dgemma/inlineEditDraft" and params.get("edit")]
    assert any("\n" in piece for piece in sent), f"no line break was sent: nothing checked ({sent!r})"
    for piece in sent:
        assert "\r" not in piece.replace("\r\n", ""), f"a lone CR in {piece!r}"
        assert "\n" not in piece.replace("\r\n", ""), f"a bare LF in a CRLF document: {piece!r}"


async def test_accepting_runs_the_edits_command(client: LanguageClient):
    uri = "file:///tmp/next_edit_accept.py"
    text, cursor = rename_in_signature(client, uri)
    (edit,) = as_dict(await ask(client, uri, 2, text, cursor))["edits"]
    command = edit["command"]
    accepted = await within(client.workspace_execute_command_async(
        lsp.ExecuteCommandParams(command=command["command"], arguments=command["arguments"])))
    assert as_dict(accepted) == {"accepted": True}
    again = await within(client.workspace_execute_command_async(
        lsp.ExecuteCommandParams(command=command["command"], arguments=command["arguments"])))
    assert as_dict(again) == {"accepted": False}  # an id is accepted once


async def test_a_stale_version_gets_no_edit(client: LanguageClient):
    uri = "file:///tmp/next_edit_stale.py"
    text, cursor = rename_in_signature(client, uri)
    assert as_dict(await ask(client, uri, 1, text, cursor)) == {"edits": []}


async def test_no_edit_while_a_completion_shows_until_it_is_hidden(client: LanguageClient):
    uri = "file:///tmp/next_edit_completion.py"
    text, cursor = rename_in_signature(client, uri)
    items = await within(client.text_document_inline_completion_async(lsp.InlineCompletionParams(
        text_document=lsp.TextDocumentIdentifier(uri=uri), position=position_of(text, cursor, ENCODING),
        context=lsp.InlineCompletionContext(trigger_kind=lsp.InlineCompletionTriggerKind.Invoked))))
    assert items.items, "the tiny model always writes something"
    assert as_dict(await ask(client, uri, 2, text, cursor)) == {"edits": []}
    # The user dismissed the ghost text (the client says so): the next edit comes.
    client.protocol.notify("dgemma/didHideCompletion", {"textDocument": {"uri": uri, "version": 2}})
    assert len(as_dict(await ask(client, uri, 2, text, cursor))["edits"]) == 1


async def test_a_change_or_a_cancel_stops_a_next_edit(client: LanguageClient):
    uri = "file:///tmp/next_edit_cancel.py"
    text, cursor = rename_in_signature(client, uri)
    client.workspace_did_change_configuration(lsp.DidChangeConfigurationParams(settings={"dgemma": {"steps": 400}}))
    try:
        client.events.clear()
        request = asyncio.ensure_future(client.protocol.send_request_async(
            INLINE_EDIT, edit_params(uri, 2, text, cursor), msg_id="cancel-edit"))
        await wait_until(client, lambda: any(m == "dgemma/inlineEditDraft" for m, _ in client.events),
                         "dgemma/inlineEditDraft")
        client.protocol.notify(lsp.CANCEL_REQUEST, lsp.CancelParams(id="cancel-edit"))
        with pytest.raises(JsonRpcException) as error:
            await within(request)
        assert error.value.code == -32800  # RequestCancelled
        steps = [p["step"] for m, p in client.events if m == "dgemma/inlineEditDraft"]
        assert max(steps) < 100
        # A keystroke while a next edit denoises: its answer is for a text that is gone.
        client.events.clear()
        request = asyncio.ensure_future(within(send_raw(client, INLINE_EDIT, edit_params(uri, 2, text, cursor))))
        await wait_until(client, lambda: any(m == "dgemma/inlineEditDraft" for m, _ in client.events),
                         "dgemma/inlineEditDraft")
        end = position_of(text, len(text), ENCODING)
        client.text_document_did_change(lsp.DidChangeTextDocumentParams(
            text_document=lsp.VersionedTextDocumentIdentifier(uri=uri, version=3),
            content_changes=[lsp.TextDocumentContentChangePartial(range=lsp.Range(start=end, end=end), text="#")]))
        assert as_dict(await request) == {"edits": []}
        steps = [p["step"] for m, p in client.events if m == "dgemma/inlineEditDraft"]
        assert max(steps) < 100
    finally:
        client.workspace_did_change_configuration(lsp.DidChangeConfigurationParams(settings={"dgemma": {"steps": 2}}))


async def test_bad_params_are_errors_and_the_server_keeps_serving(client: LanguageClient):
    with pytest.raises(JsonRpcException) as error:
        await within(send_raw(client, INLINE_EDIT, {"textDocument": {"uri": "file:///nope.py"},
                                                    "position": {"line": 0, "character": 0}}))
    assert error.value.code == -32602 and "not open" in error.value.message
    with pytest.raises(JsonRpcException) as error:
        await within(send_raw(client, INLINE_EDIT, {"position": {"line": 0}}))
    assert error.value.code == -32602
    uri = "file:///tmp/next_edit_alive.py"
    text, cursor = rename_in_signature(client, uri)
    assert "edits" in as_dict(await ask(client, uri, 2, text, cursor))
