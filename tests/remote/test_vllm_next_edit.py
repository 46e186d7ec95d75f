"""A next edit over vLLM's API: no starting canvas can be sent, so the window and the diffs go in the prompt."""

from __future__ import annotations

import asyncio

from completions_server import CompletionsServer

from dgemma_lsp.engine.api import GenerationSettings
from dgemma_lsp.engine.model.prompting import PromptBuilder
from dgemma_lsp.engine.nextedit.edits import EditLog
from dgemma_lsp.engine.nextedit.request import finish_next_edit, prepare_next_edit
from dgemma_lsp.engine.remote.vllm_client import VllmEngineClient
from dgemma_lsp.engine.syntax.document import SyntaxDocument

BEFORE = "def area(r):\n    return 3.14 * r * r\n\n\nprint(area(2))\n"


async def test_a_next_edit_over_vllm_sends_the_window_and_the_diffs(server: CompletionsServer):
    log = EditLog()
    at = BEFORE.index("r)")
    log.record(BEFORE, at, at + 1, "radius")
    text = BEFORE[:at] + "radius" + BEFORE[at + 1:]
    prepared = prepare_next_edit(SyntaxDocument(text, "python"), at + 6, log, 0.5,
                                 GenerationSettings(max_tokens=64, seed=2), path="area.py")
    client = VllmEngineClient(server.url, "tiny-random")
    await client.start()
    try:
        result = await asyncio.wait_for(client.denoise(prepared.request), 120)
    finally:
        await client.close()
    request = prepared.request
    body = server.counters.bodies[-1]
    builder = PromptBuilder(server.runtime.tokenizer)
    assert body["prompt"] == builder.layout.text(request.context, rewrite=True, original=request.selection,
                                                 edits=request.recent_edits).all
    assert "+def area(radius):" in body["prompt"] and request.selection in body["prompt"]
    edit = finish_next_edit(prepared, text, result.candidates[0].text)
    assert edit is None or prepared.window.start <= edit.start <= edit.end <= prepared.window.end
