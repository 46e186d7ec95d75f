"""A quantized first start from a sharded checkpoint, seen from an editor (VS Code's capabilities):
`$/progress` reports percentages as shards are read, and closing a document frees its
prompt-cache snapshot (`promptCacheBytes` in `dgemma.status`). In-process engine, real
`dgemma-lsp --stdio` subprocess."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from lsp_session import (
    FAST,
    capabilities,
    initialize,
    open_document,
    plain,
    position_of,
    recording_client,
    within,
)
from lsprotocol import types as lsp
from pytest_lsp import ClientServerConfig

SHARDS_SCRIPT = """
import sys
from dgemma_lsp.engine.model.tiny_model import build_tiny_model, build_tiny_tokenizer
build_tiny_tokenizer().save_pretrained(sys.argv[1])
build_tiny_model().save_pretrained(sys.argv[1], max_shard_size="200KB")
"""


@pytest.fixture(scope="module")
def sharded_tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-sharded")
    subprocess.run([sys.executable, "-c", SHARDS_SCRIPT, str(folder)], check=True, capture_output=True, timeout=300)
    return folder


async def test_load_progress_percentages_and_forgetting_a_closed_document(sharded_tiny, tmp_path):
    shards = len(list(sharded_tiny.glob("model-*.safetensors")))
    assert shards >= 4
    config = ClientServerConfig(
        server_command=[sys.executable, "-m", "dgemma_lsp.server.cli", "--stdio", "--engine", "inprocess",
                        "--model", str(sharded_tiny), "--quantization", "int4"],
        client_factory=recording_client,
        server_env={**os.environ, "DGEMMA_LSP_CACHE": str(tmp_path)},
    )
    client = await config.start()
    try:
        await initialize(client, capabilities("visual-studio-code"), {**FAST, "status": True})

        async def ready() -> None:
            while not any(p["state"] == "ready" for m, p in client.custom if m == "dgemma/status"):
                await client.wait_for_notification("dgemma/status")

        await within(ready())
        (reports,) = client.progress_reports.values()
        percentages = [r.percentage for r in reports if isinstance(r, lsp.WorkDoneProgressReport)]
        assert isinstance(reports[0], lsp.WorkDoneProgressBegin) and isinstance(reports[-1], lsp.WorkDoneProgressEnd)
        assert percentages == sorted(percentages) and percentages[-1] == 100
        assert len(set(percentages)) >= shards - 1  # one step per shard (the first may come before the bar)

        uri = "file:///tmp/progress_forget.py"
        text = "def area(radius):\n    return \n"
        open_document(client, uri, text)
        await within(client.text_document_inline_completion_async(lsp.InlineCompletionParams(
            text_document=lsp.TextDocumentIdentifier(uri=uri),
            position=position_of(text, text.index("return ") + 7, "utf-16"),
            context=lsp.InlineCompletionContext(trigger_kind=lsp.InlineCompletionTriggerKind.Invoked),
        )))
        status = lsp.ExecuteCommandParams(command="dgemma.status", arguments=[])
        assert plain(await within(client.workspace_execute_command_async(status)))["promptCacheBytes"] > 0

        client.text_document_did_close(lsp.DidCloseTextDocumentParams(text_document=lsp.TextDocumentIdentifier(uri=uri)))
        assert plain(await within(client.workspace_execute_command_async(status)))["promptCacheBytes"] == 0
    finally:
        await client.shutdown_session()
        await client.stop()
