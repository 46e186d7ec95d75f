"""Cross-file context over LSP: a real `dgemma-lsp --stdio --model tiny-random` on a real multi-file workspace.

The server indexes the workspace in the background; an inline completion in `report.py` then
carries the definition of the class it imports from `models.py` in its prompt (read back with
`dgemma.contextSnippets`, the snippets of the document's latest prompt), `crossFile: false`
sends the file alone, and a file changed on disk reaches the prompt after
`workspace/didChangeWatchedFiles`. (How the snippets hold while the user types, and when the next
choice is made: tests/server/test_workspace_choice.py, on a clock the test moves.)
"""

from __future__ import annotations

import asyncio
import atexit
import shutil
import tempfile
from pathlib import Path

import pytest_lsp
from lsp_session import FAST, TIMEOUT, capabilities, config, initialize, open_document, plain, within
from lsprotocol import types as lsp
from pytest_lsp import LanguageClient

WORKSPACE = Path(tempfile.mkdtemp(prefix="dgemma-crossfile-"))
atexit.register(shutil.rmtree, WORKSPACE, True)
MODELS = '''class Invoice:
    """A bill sent to a customer."""

    def __init__(self, customer, lines):
        self.customer = customer
        self.lines = lines

    def total_with_tax(self, rate):
        return sum(line.amount for line in self.lines) * (1 + rate)
'''
REPORT = '''from .models import Invoice


def summary(invoice: Invoice) -> str:
    amount = invoice.
    return f"{invoice.customer}: {amount}"
'''
(WORKSPACE / "app").mkdir()
(WORKSPACE / "app" / "__init__.py").write_text("")
(WORKSPACE / "app" / "models.py").write_text(MODELS)
(WORKSPACE / "app" / "report.py").write_text(REPORT)
(WORKSPACE / ".gitignore").write_text("build/\n")
(WORKSPACE / "build").mkdir()
(WORKSPACE / "build" / "models.py").write_text(MODELS.replace("Invoice", "BuiltInvoice"))
URI = (WORKSPACE / "app" / "report.py").as_uri()
CURSOR = lsp.Position(line=4, character=len("    amount = invoice."))


@pytest_lsp.fixture(config=config())
async def client(lsp_client: LanguageClient):
    caps = capabilities("neovim@v0.11.0", watch_files=True)  # watchers on request: VS Code's
    await initialize(lsp_client, caps, {**FAST, "cacheSize": 0}, WORKSPACE)  # cacheSize 0: every request builds its prompt
    yield
    await lsp_client.shutdown_session()


async def complete_and_read_snippets(client: LanguageClient) -> list[dict]:
    await within(client.text_document_inline_completion_async(lsp.InlineCompletionParams(
        text_document=lsp.TextDocumentIdentifier(uri=URI), position=CURSOR,
        context=lsp.InlineCompletionContext(trigger_kind=lsp.InlineCompletionTriggerKind.Invoked))))
    return await within(client.workspace_execute_command_async(
        lsp.ExecuteCommandParams(command="dgemma.contextSnippets", arguments=[URI])))


async def until_snippets(client: LanguageClient, predicate) -> list[dict]:
    """Complete until the prompt's snippets satisfy `predicate`: the index is built in the background,
    only while the client is quiet, so the first requests may come before it is."""

    async def poll():
        while True:
            snippets = await complete_and_read_snippets(client)
            if predicate(snippets):
                return snippets
            await asyncio.sleep(0.5)  # quiet, so the background indexing runs

    return await within(poll(), TIMEOUT)


async def test_the_imported_definition_reaches_the_prompt_and_crossfile_false_turns_it_off(client):
    open_document(client, URI, REPORT)
    snippets = await until_snippets(client, lambda found: any(s["path"] == "app/models.py" for s in found))
    (models,) = [s for s in snippets if s["path"] == "app/models.py"]
    assert models["source"] == "definition" and models["tokens"] > 0
    assert "class Invoice:" in models["text"] and "def total_with_tax(self, rate):" in models["text"]
    assert "sum(line.amount" not in models["text"]
    assert not any(s["path"].startswith("build/") for s in snippets)  # .gitignore'd

    client.workspace_did_change_configuration(lsp.DidChangeConfigurationParams(settings={"crossFile": False}))
    assert await complete_and_read_snippets(client) == []

    (registration,) = client.registrations  # recorded by lsp_session's client, as an editor does
    assert registration.method == "workspace/didChangeWatchedFiles"
    assert "py" in plain(registration.register_options)["watchers"][0]["globPattern"]
    client.workspace_did_change_configuration(lsp.DidChangeConfigurationParams(settings={"crossFile": True}))
    (WORKSPACE / "app" / "models.py").write_text(
        MODELS + "\n\ndef invoice_amount(invoice: Invoice) -> float:\n    return 0.0\n")
    client.workspace_did_change_watched_files(lsp.DidChangeWatchedFilesParams(changes=[
        lsp.FileEvent(uri=(WORKSPACE / "app" / "models.py").as_uri(), type=lsp.FileChangeType.Changed)]))
    snippets = await until_snippets(client, lambda found: any("def invoice_amount" in s["text"] for s in found))
    assert any(s["path"] == "app/models.py" for s in snippets)
