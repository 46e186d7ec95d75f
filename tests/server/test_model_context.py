"""A model that names the most context it reads well (`dgemma_context_tokens`): a real `dgemma-lsp --stdio` on a
model folder that names 400 tokens, asked with a user's `contextTokens` of 4,096 and `crossFileTokens` of 2,000.

The cross-file snippets of the prompt (read back with `dgemma.contextSnippets`) then take at most a quarter of
the model's 400 tokens, where the user's settings alone let the imported class take 639.
"""

from __future__ import annotations

import asyncio
import atexit
import json
import shutil
import tempfile
from pathlib import Path

import pytest_lsp
from lsp_session import FAST, TIMEOUT, capabilities, config, initialize, open_document, within
from lsprotocol import types as lsp
from pytest_lsp import LanguageClient

from dgemma_lsp.engine.model.tiny_model import ensure_tiny_random_model

MODEL_TOKENS = 400
WORKSPACE = Path(tempfile.mkdtemp(prefix="dgemma-model-context-"))
atexit.register(shutil.rmtree, WORKSPACE, True)
MODEL = WORKSPACE / "model"
shutil.copytree(ensure_tiny_random_model(), MODEL)
_config = json.loads((MODEL / "tokenizer_config.json").read_text())
(MODEL / "tokenizer_config.json").write_text(json.dumps({**_config, "dgemma_context_tokens": MODEL_TOKENS}))
METHODS = "".join(f"\n    def entry_{i}(self, account, amount, memo=None):\n        return self.post(account, amount)\n"
                  for i in range(30))
(WORKSPACE / "app").mkdir()
(WORKSPACE / "app" / "__init__.py").write_text("")
(WORKSPACE / "app" / "books.py").write_text(f"class Ledger:\n    \"\"\"Double-entry books.\"\"\"\n{METHODS}")
REPORT = "from .books import Ledger\n\n\ndef close(ledger: Ledger):\n    ledger.\n"
URI = (WORKSPACE / "app" / "report.py").as_uri()
(WORKSPACE / "app" / "report.py").write_text(REPORT)


@pytest_lsp.fixture(config=config("--model", str(MODEL)))
async def client(lsp_client: LanguageClient):
    await initialize(lsp_client, capabilities("neovim@v0.11.0"),
                     {**FAST, "cacheSize": 0, "contextTokens": 4096, "crossFileTokens": 2000}, WORKSPACE)
    yield
    await lsp_client.shutdown_session()


async def test_the_snippets_take_at_most_a_quarter_of_the_models_context(client):
    open_document(client, URI, REPORT)

    async def snippets_from_books() -> list[dict]:
        while True:  # the workspace is indexed in the background, while the client is quiet
            await within(client.text_document_inline_completion_async(lsp.InlineCompletionParams(
                text_document=lsp.TextDocumentIdentifier(uri=URI), position=lsp.Position(line=4, character=11),
                context=lsp.InlineCompletionContext(trigger_kind=lsp.InlineCompletionTriggerKind.Invoked))))
            snippets = await within(client.workspace_execute_command_async(
                lsp.ExecuteCommandParams(command="dgemma.contextSnippets", arguments=[URI])))
            if any(s["path"] == "app/books.py" for s in snippets):
                return snippets
            await asyncio.sleep(0.5)

    snippets = await within(snippets_from_books(), TIMEOUT)
    assert 0 < sum(s["tokens"] for s in snippets) <= MODEL_TOKENS // 4
    assert "class Ledger" in "".join(s["text"] for s in snippets)
