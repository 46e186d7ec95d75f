"""Load failures of the real service and the in-process client: `error` with the reason, then retries.

The failure is real: a copy of the tiny model folder whose tokenizer has no chat
template (PromptBuilder raises ValueError while the runtime is set up). Fixing the
folder and retrying — after the backoff, or at once with reload — loads it.
"""

import json
import os
import shutil
import sys
import threading

import pytest
import torch
from manual_clock import ManualClock

from dgemma_lsp.engine import errors
from dgemma_lsp.engine.api import DenoiseRequest, GenerationSettings, InfillContext
from dgemma_lsp.engine.client import EngineUnavailableError, InProcessEngineClient
from dgemma_lsp.engine.model.tiny_model import ensure_tiny_random_model
from dgemma_lsp.engine.runtime.service import (
    CPU_ENGINE_NICE,
    CPU_THREADS_ENV,
    ENGINE_NICE_ENV,
    InfillService,
    serving_cpu_threads,
    serving_engine_nice,
)

REQUEST = DenoiseRequest(
    context=InfillContext(prefix="x = ", suffix="\n", language="python"),
    settings=GenerationSettings(steps=1, seed=1),
)


@pytest.fixture
def no_template_folder(tmp_path):
    """(folder, fix): a tiny model whose tokenizer has no chat template, and how to put it back."""
    source = ensure_tiny_random_model()
    folder = tmp_path / "no-template"
    shutil.copytree(source, folder)
    (folder / "chat_template.jinja").unlink()

    def fix() -> None:
        shutil.copy(source / "chat_template.jinja", folder / "chat_template.jinja")

    return folder, fix


def test_a_set_up_failure_is_an_error_with_its_reason_then_retried_after_the_backoff(no_template_folder):
    folder, fix = no_template_folder
    clock = ManualClock()
    service = InfillService(str(folder), first_retry_s=0.5, clock=clock)
    with pytest.raises(errors.ModelLoadError):
        service.load()
    status = service.status()
    assert status.state == "error" and "chat" in status.message
    fix()
    with pytest.raises(errors.ModelLoadError):  # within the backoff: the same error, no new attempt
        service.load()
    clock.advance(0.49)
    assert not service.retry_due()
    with pytest.raises(errors.ModelLoadError):  # still within it
        service.load()
    assert not service.loaded
    clock.advance(0.01)
    assert service.retry_due()
    service.load()
    assert service.loaded and service.status().state == "ready"


def test_reload_retries_at_once(no_template_folder):
    folder, fix = no_template_folder
    service = InfillService(str(folder))  # the default 5 s backoff
    with pytest.raises(errors.ModelLoadError):
        service.load()
    fix()
    service.reload()
    assert service.status().state == "ready"


async def test_in_process_client_reports_error_then_a_later_request_loads(no_template_folder):
    folder, fix = no_template_folder
    clock = ManualClock()
    client = InProcessEngineClient(InfillService(str(folder), first_retry_s=0.5, clock=clock))
    seen = []
    client.on_status(lambda status: seen.append(status.state))
    with pytest.raises(EngineUnavailableError):
        await client.denoise(REQUEST, lambda draft: None)
    assert client.status().state == "error" and seen[-1] == "error"
    fix()
    with pytest.raises(EngineUnavailableError):  # within the backoff a request does not try again
        await client.denoise(REQUEST, lambda draft: None)
    clock.advance(0.5)
    result = await client.denoise(REQUEST, lambda draft: None)
    assert result.candidates and client.status().state == "ready"
    await client.close()


async def test_in_process_reload_after_a_fix(no_template_folder):
    folder, fix = no_template_folder
    client = InProcessEngineClient(InfillService(str(folder)))
    await client.start()
    with pytest.raises(EngineUnavailableError):
        await client.denoise(REQUEST, lambda draft: None)
    fix()
    with pytest.raises(EngineUnavailableError):  # within the backoff a request does not try again
        await client.denoise(REQUEST, lambda draft: None)
    assert (await client.reload()).state == "ready"
    assert (await client.denoise(REQUEST, lambda draft: None)).candidates
    await client.close()


def test_the_models_context_limit_is_known_before_its_weights_load(tmp_path):
    """A request prepared while the model loads is cut to the limit the model will read it with."""
    folder = tmp_path / "short-context"
    shutil.copytree(ensure_tiny_random_model(), folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "dgemma_context_tokens": 400}))
    service = InfillService(str(folder))
    assert not service.loaded and service.status().context_tokens == 400
    service.load()
    assert service.status().context_tokens == 400
    assert InfillService(str(tmp_path / "no-such-model")).status().context_tokens is None


def test_a_serving_engine_leaves_a_core_or_takes_the_threads_it_is_told(monkeypatch):
    monkeypatch.delenv(CPU_THREADS_ENV, raising=False)
    assert serving_cpu_threads() == max(1, (os.cpu_count() or 2) - 1)
    monkeypatch.setenv(CPU_THREADS_ENV, "3")
    assert serving_cpu_threads() == 3
    for bad in ("0", "many"):
        monkeypatch.setenv(CPU_THREADS_ENV, bad)
        with pytest.raises(errors.EngineError, match=CPU_THREADS_ENV):
            serving_cpu_threads()


def test_the_service_sets_torch_threads_when_it_loads():
    before = torch.get_num_threads()
    try:
        service = InfillService("tiny-random", cpu_threads=1)
        service.load()
        assert torch.get_num_threads() == 1
        assert service.denoise(REQUEST).candidates
    finally:
        torch.set_num_threads(before)


def test_a_serving_engine_nices_its_cpu_thread_unless_told_otherwise(monkeypatch):
    monkeypatch.delenv(ENGINE_NICE_ENV, raising=False)
    assert serving_engine_nice() == CPU_ENGINE_NICE
    for chosen, nice in (("3", 3), ("0", 0), (" 19 ", 19)):
        monkeypatch.setenv(ENGINE_NICE_ENV, chosen)
        assert serving_engine_nice() == nice
    for bad in ("-1", "20", "low"):
        monkeypatch.setenv(ENGINE_NICE_ENV, bad)
        with pytest.raises(errors.EngineError, match=ENGINE_NICE_ENV):
            serving_engine_nice()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="nice is per thread on Linux only")
@pytest.mark.parametrize("engine_nice", [7, 0])
def test_the_thread_that_denoises_on_the_cpu_gets_the_engine_nice_value(engine_nice):
    """Only the thread that ran the request: the caller's other threads keep their priority."""
    service = InfillService("tiny-random", engine_nice=engine_nice)
    before = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    seen: dict[str, int] = {}

    def denoise() -> None:
        assert service.denoise(REQUEST).candidates
        seen["after"] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    worker = threading.Thread(target=denoise)
    worker.start()
    worker.join(timeout=120)
    assert seen["after"] == max(before, engine_nice)
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == before
