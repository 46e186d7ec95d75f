"""`dgemma.reloadModel` over LSP: a model that failed to set up is `error` with its reason, and loads on command.

A real failure: the server is started on a copy of the tiny model folder whose tokenizer
has no chat template; the test puts the template back and runs the command.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import pytest_lsp
from lsp_session import FAST, capabilities, config, initialize, open_document, wait_until, within
from lsprotocol import types as lsp
from pytest_lsp import LanguageClient

from dgemma_lsp.engine.model.tiny_model import ensure_tiny_random_model

SOURCE = ensure_tiny_random_model()
FOLDER = Path(tempfile.mkdtemp(prefix="dgemma-no-template-")) / "model"
shutil.copytree(SOURCE, FOLDER)
(FOLDER / "chat_template.jinja").unlink()
atexit.register(shutil.rmtree, FOLDER.parent, True)
URI = "file:///tmp/reload.py"
TEXT = "def area(r):\n    return \n"


@pytest_lsp.fixture(config=config("--model", os.fspath(FOLDER)))
async def client(lsp_client: LanguageClient):
    await initialize(lsp_client, capabilities("neovim@v0.11.0"), {**FAST, "status": True})
    yield
    await lsp_client.shutdown_session()


def states(client: LanguageClient) -> list[dict]:
    return [params for method, params in client.custom if method == "dgemma/status"]


async def test_a_failed_load_is_an_error_and_reload_model_loads_it(client: LanguageClient):
    await wait_until(client, lambda: any(s["state"] == "error" for s in states(client)), "dgemma/status")
    error = next(s for s in states(client) if s["state"] == "error")
    assert "chat" in error["message"]
    shutil.copy(SOURCE / "chat_template.jinja", FOLDER / "chat_template.jinja")
    status = await within(client.workspace_execute_command_async(
        lsp.ExecuteCommandParams(command="dgemma.reloadModel", arguments=[])
    ))
    assert status["state"] == "ready"
    open_document(client, URI, TEXT)
    result = await within(client.text_document_inline_completion_async(lsp.InlineCompletionParams(
        text_document=lsp.TextDocumentIdentifier(uri=URI), position=lsp.Position(line=1, character=11),
        context=lsp.InlineCompletionContext(trigger_kind=lsp.InlineCompletionTriggerKind.Invoked),
    )))
    assert result is not None and result.items
