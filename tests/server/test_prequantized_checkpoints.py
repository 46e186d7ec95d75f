"""A pre-quantized checkpoint served over LSP on the CPU: the tiny model written as GGUF Q4_K_M and as
compressed-tensors FP8-dynamic (with the formats' own writers), named by `--model`, answers an inline
completion from a real `dgemma-lsp --stdio` and says in its log which format it found."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
from lsp_session import FAST, capabilities, initialize, open_document, position_of, recording_client, within
from lsprotocol import types as lsp
from pytest_lsp import ClientServerConfig

WRITE = """
import sys, torch
from pathlib import Path
from transformers import AutoConfig
from dgemma_lsp.engine.model.tiny_model import ensure_tiny_random_model
from dgemma_lsp.engine.weights.text_model import TextOnlyDiffusionGemma
from dgemma_lsp.bench import format_writers as w
base, out, kind = ensure_tiny_random_model(), Path(sys.argv[1]), sys.argv[2]
model = TextOnlyDiffusionGemma.from_pretrained(base, dtype=torch.float32)
if kind == "gguf":
    out.mkdir(parents=True)
    w.write_gguf(model, AutoConfig.from_pretrained(base), out / "tiny-Q4_K_M.gguf", "Q4_K_M")
else:
    w.write_compressed_tensors(model, out, "FP8_DYNAMIC", base)
"""


@pytest.mark.parametrize(("kind", "label"), [("gguf", "GGUF Q4_K_M"), ("fp8", "compressed-tensors FP8-dynamic")])
async def test_an_editor_gets_completions_from_a_prequantized_checkpoint(kind, label, tmp_path):
    folder = tmp_path / kind
    subprocess.run([sys.executable, "-c", WRITE, str(folder), kind], check=True, capture_output=True, timeout=300)
    if kind == "gguf":  # a local GGUF folder keeps the base model's config and tokenizer beside the file
        from dgemma_lsp.engine.model.tiny_model import ensure_tiny_random_model

        for file in ensure_tiny_random_model().iterdir():
            if file.suffix in (".json", ".jinja"):
                shutil.copy(file, folder / file.name)
    log = tmp_path / "server.log"
    config = ClientServerConfig(
        server_command=[sys.executable, "-m", "dgemma_lsp.server.cli", "--stdio", "--engine", "inprocess",
                        "--model", str(folder), "--log-file", str(log), "--log-level", "info"],
        client_factory=recording_client,
        server_env={**os.environ, "DGEMMA_LSP_CACHE": str(tmp_path / "cache")},
    )
    client = await config.start()
    try:
        await initialize(client, capabilities("neovim"), FAST)
        uri = f"file:///tmp/prequantized_{kind}.py"
        text = "def area(radius):\n    return \n"
        open_document(client, uri, text)
        result = await within(client.text_document_inline_completion_async(lsp.InlineCompletionParams(
            text_document=lsp.TextDocumentIdentifier(uri=uri),
            position=position_of(text, text.index("return ") + 7, "utf-16"),
            context=lsp.InlineCompletionContext(trigger_kind=lsp.InlineCompletionTriggerKind.Invoked),
        )))
        items = result.items if isinstance(result, lsp.InlineCompletionList) else result
        assert items, "no completion"
    finally:
        await client.shutdown_session()
        await client.stop()
    assert f"is {label}: loading it as" in log.read_text()
