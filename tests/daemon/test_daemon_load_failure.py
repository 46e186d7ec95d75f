"""A daemon's model before it is ready: one that fails to set up is `error` with the reason (never `loading`
forever), then reload; one that names its context limit has it in the status from the start.

The failure is real: a copy of the tiny model folder whose tokenizer has no chat template.
"""

from __future__ import annotations

import json
import shutil

import pytest
from daemon_helpers import quick, wait_for_status, within

from dgemma_lsp.engine.client import EngineUnavailableError
from dgemma_lsp.engine.daemon.client import DaemonEngineClient
from dgemma_lsp.engine.daemon.paths import engine_key
from dgemma_lsp.engine.model.tiny_model import ensure_tiny_random_model


async def test_a_set_up_failure_is_reported_as_error_and_reload_recovers(runtime_dir, tmp_path):
    source = ensure_tiny_random_model()
    folder = tmp_path / "no-template"
    shutil.copytree(source, folder)
    (folder / "chat_template.jinja").unlink()
    engine = DaemonEngineClient(engine_key(str(folder)), spawn=True, idle_unload=None, name="test")
    try:
        await engine.start()
        status = await wait_for_status(engine, lambda status: status.state not in ("idle", "loading"))
        assert status.state == "error" and "chat" in status.message
        with pytest.raises(EngineUnavailableError):
            await within(engine.denoise(quick(), lambda draft: None))
        shutil.copy(source / "chat_template.jinja", folder / "chat_template.jinja")
        assert (await within(engine.reload())).state == "ready"
        assert (await within(engine.denoise(quick(), lambda draft: None))).candidates
    finally:
        await engine.close()


async def test_the_models_context_limit_is_in_the_status_before_the_daemon_answers(runtime_dir, tmp_path):
    folder = tmp_path / "short-context"
    shutil.copytree(ensure_tiny_random_model(), folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "dgemma_context_tokens": 400}))
    engine = DaemonEngineClient(engine_key(str(folder)), spawn=True, idle_unload=None, name="test")
    try:
        assert engine.status().context_tokens == 400  # no daemon yet
        await engine.start()
        status = await wait_for_status(engine, lambda status: status.state == "ready")
        assert status.context_tokens == 400
    finally:
        await engine.close()
