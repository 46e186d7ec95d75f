"""Sessions with Neovim 0.11's recorded capabilities (UTF-8 chosen from its offer), a client that
only speaks UTF-32 and cannot resolve code actions (the command + workspace/applyEdit path),
a model that fails to load, and the shutdown/exit handshake. None of these clients opts into
custom traffic, so none may see a `dgemma/*` notification."""

from __future__ import annotations

import pytest
import pytest_lsp
from lsp_session import (
    FAST,
    FIB,
    apply_item,
    capabilities,
    config,
    initialize,
    open_document,
    plain,
    position_of,
    send_raw,
    wait_until,
    within,
)
from lsprotocol import types as lsp
from pytest_lsp import LanguageClient

LINE = "mots = ['naïve', 'café', '🐍🐍', 'e\u0301']; n = "
"""Before the cursor: 2-byte, 4-byte (surrogate pair in UTF-16) and combining characters."""


def lsp_json(value) -> dict:
    return {"start": {"line": value.start.line, "character": value.start.character},
            "end": {"line": value.end.line, "character": value.end.character}}


def automatic(uri: str, position: lsp.Position) -> lsp.InlineCompletionParams:
    return lsp.InlineCompletionParams(
        text_document=lsp.TextDocumentIdentifier(uri=uri),
        position=position,
        context=lsp.InlineCompletionContext(trigger_kind=lsp.InlineCompletionTriggerKind.Automatic),
    )


async def completion_keeps_the_text_around_the_cursor(client: LanguageClient, encoding: str) -> None:
    uri = f"file:///tmp/non_bmp_{encoding}.py"
    text = LINE + "\nn += 1\n"
    cursor = len(LINE)
    open_document(client, uri, text)
    result = await within(client.text_document_inline_completion_async(automatic(uri, position_of(text, cursor, encoding))))
    (item,) = result.items
    applied = apply_item(text, cursor, item, encoding)
    assert applied.startswith(LINE) and applied.endswith("\nn += 1\n")
    assert len(applied) > len(text)


pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_lsp.fixture(scope="module", config=config())
async def neovim(lsp_client: LanguageClient):
    lsp_client.init_result = await initialize(lsp_client, capabilities("neovim@v0.11.0"), FAST)
    yield
    await lsp_client.shutdown_session()


@pytest_lsp.fixture(scope="module", config=config())
async def utf32(lsp_client: LanguageClient):
    caps = capabilities("visual-studio-code", encodings=["utf-32"], resolve=False)
    lsp_client.init_result = await initialize(lsp_client, caps, FAST)
    yield
    await lsp_client.shutdown_session()


@pytest_lsp.fixture(scope="module", config=config("--model", "/nonexistent/dgemma-model"))
async def broken(lsp_client: LanguageClient):
    await initialize(lsp_client, capabilities("visual-studio-code"), {**FAST, "status": True})
    yield
    await lsp_client.shutdown_session()


async def test_neovim_gets_utf8(neovim: LanguageClient):
    assert neovim.init_result.capabilities.position_encoding == lsp.PositionEncodingKind.Utf8
    assert neovim.init_result.capabilities.inline_completion_provider is not None


async def test_neovim_completion_after_non_bmp_text(neovim: LanguageClient):
    await completion_keeps_the_text_around_the_cursor(neovim, "utf-8")


async def test_neovim_sees_no_custom_traffic_without_opt_in(neovim: LanguageClient):
    assert neovim.custom == []


async def test_utf32_only_client_gets_utf32(utf32: LanguageClient):
    assert utf32.init_result.capabilities.position_encoding == lsp.PositionEncodingKind.Utf32


async def test_utf32_completion_after_non_bmp_text(utf32: LanguageClient):
    await completion_keeps_the_text_around_the_cursor(utf32, "utf-32")


async def test_rewrite_through_command_and_apply_edit(utf32: LanguageClient):
    client = utf32
    uri = "file:///tmp/rewrite_command.py"
    text = "# 🐍 " + FIB.read_text()
    start, end = text.index("    if n < 2:"), text.index("    return \n")
    selection = lsp.Range(start=position_of(text, start, "utf-32"), end=position_of(text, end, "utf-32"))
    open_document(client, uri, text)
    # Raw JSON: lsprotocol's client mis-decodes a CodeAction that carries only a command.
    (action,) = plain(await within(send_raw(client, lsp.TEXT_DOCUMENT_CODE_ACTION, {
        "textDocument": {"uri": uri}, "range": lsp_json(selection), "context": {"diagnostics": []},
    })))
    assert action["kind"] == "refactor.rewrite" and "edit" not in action
    command = action["command"]
    assert command["command"] == "dgemma.rewriteSelection"
    await within(client.workspace_execute_command_async(
        lsp.ExecuteCommandParams(command=command["command"], arguments=command["arguments"])
    ))
    (edit,) = client.applied_edits
    (text_edit,) = edit.changes[uri]
    assert text_edit.range == selection


async def test_resolving_the_command_form_returns_it_unchanged(utf32: LanguageClient):
    # Neovim 0.12 calls codeAction/resolve even on an action that carries only a command.
    uri = "file:///tmp/resolve_command.py"
    text = FIB.read_text()
    start, end = text.index("    if n < 2:"), text.index("    return \n")
    selection = lsp.Range(start=position_of(text, start, "utf-32"), end=position_of(text, end, "utf-32"))
    open_document(utf32, uri, text)
    (action,) = plain(await within(send_raw(utf32, lsp.TEXT_DOCUMENT_CODE_ACTION, {
        "textDocument": {"uri": uri}, "range": lsp_json(selection), "context": {"diagnostics": []},
    })))
    assert "command" in action and "data" not in action
    assert plain(await within(send_raw(utf32, lsp.CODE_ACTION_RESOLVE, action))) == action


async def test_utf32_client_sees_no_custom_traffic_without_opt_in(utf32: LanguageClient):
    assert utf32.custom == []


async def test_model_that_fails_to_load_reports_why_and_completes_nothing(broken: LanguageClient):
    client = broken

    def statuses():
        return [p for m, p in client.custom if m == "dgemma/status"]

    await wait_until(client, lambda: any(s["state"] == "error" for s in statuses()), "dgemma/status")
    error = next(s for s in statuses() if s["state"] == "error")
    assert error["message"] and error["model"] == "/nonexistent/dgemma-model"
    assert any(m.type == lsp.MessageType.Error for m in client.messages)

    uri = "file:///tmp/no_model.py"
    text = FIB.read_text()
    open_document(client, uri, text)
    position = position_of(text, text.index("return \n") + len("return "), "utf-16")
    result = await within(client.text_document_inline_completion_async(automatic(uri, position)))
    assert not result.items
