"""A next edit through the resident daemon on the tiny model: the diffs reach the daemon's prompt."""

from __future__ import annotations

from daemon_helpers import within

from dgemma_lsp.engine.api import GenerationSettings
from dgemma_lsp.engine.daemon.client import DaemonEngineClient, spawn_daemon
from dgemma_lsp.engine.daemon.paths import EnginePaths, engine_key
from dgemma_lsp.engine.model.prompting import PromptBuilder
from dgemma_lsp.engine.model.tiny_model import tiny_random_dir
from dgemma_lsp.engine.nextedit.edits import EditLog
from dgemma_lsp.engine.nextedit.request import finish_next_edit, prepare_next_edit
from dgemma_lsp.engine.syntax.document import SyntaxDocument

BEFORE = "def area(r):\n    return 3.14 * r * r\n\n\nprint(area(2))\n"


async def test_a_next_edit_through_the_daemon(module_runtime_dir):
    from transformers import AutoTokenizer

    log = EditLog()
    at = BEFORE.index("r)")
    log.record(BEFORE, at, at + 1, "radius")
    text = BEFORE[:at] + "radius" + BEFORE[at + 1:]
    prepared = prepare_next_edit(SyntaxDocument(text, "python"), at + 6, log, 0.5,
                                 GenerationSettings(steps=3, seed=2, early_stop=False), path="area.py")
    key = engine_key("tiny-random")
    assert spawn_daemon(key, EnginePaths.for_key(key), idle_unload=None) is not None
    engine = DaemonEngineClient(key, spawn=False, name="test")
    await engine.start()
    try:
        result = await within(engine.denoise(prepared.request))
    finally:
        await engine.close()
    request = prepared.request
    builder = PromptBuilder(AutoTokenizer.from_pretrained(tiny_random_dir()))
    with_edits = builder.build(request.context, rewrite=True, original=request.selection, edits=request.recent_edits)
    assert result.prompt_tokens == len(with_edits.all)  # the daemon's prompt had the diffs
    edit = finish_next_edit(prepared, text, result.candidates[0].text)
    assert edit is None or prepared.window.start <= edit.start <= edit.end <= prepared.window.end
