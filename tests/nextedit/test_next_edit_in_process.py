"""A next edit through the in-process engine on the tiny model: the prompt carries the diffs."""

from __future__ import annotations

import asyncio

from next_edit_case import renamed

from dgemma_lsp.engine.client import InProcessEngineClient
from dgemma_lsp.engine.model.prompting import PromptBuilder
from dgemma_lsp.engine.nextedit.request import finish_next_edit
from dgemma_lsp.engine.runtime.service import InfillService


async def test_the_window_is_rewritten_with_the_diffs_in_the_prompt():
    text, prepared = renamed()
    request = prepared.request
    assert "-def load(path, mode):\n+def load(filename, mode):\n" in request.recent_edits
    assert request.selection == text  # a four-line function: the window is all of it
    service = InfillService("tiny-random")
    engine = InProcessEngineClient(service)
    try:
        result = await asyncio.wait_for(engine.denoise(request), 240)
        builder = PromptBuilder(service._runtime.tokenizer)
        with_edits = builder.build(request.context, rewrite=True, original=request.selection,
                                   edits=request.recent_edits)
        without = builder.build(request.context, rewrite=True, original=request.selection)
        assert result.prompt_tokens == len(with_edits.all) != len(without.all)
        assert "The user's recent edits" in builder.layout.text(
            request.context, rewrite=True, original=request.selection, edits=request.recent_edits).all
        edit = finish_next_edit(prepared, text, result.candidates[0].text)
        if edit is not None:  # noise from the random model, but always an edit inside the window
            assert prepared.window.start <= edit.start <= edit.end <= prepared.window.end
            assert text[edit.start:edit.end] != edit.text
    finally:
        await engine.close()
