"""VllmEngineClient against a real HTTP server of the API subset that answers with the tiny model.

What a user would notice: the prompt is our PromptBuilder's, the answers are the
model's (n candidates, reassembled from the stream), a cancelled request closes
its stream (and the server stops denoising), and every fault (HTTP errors,
malformed streams, a slow or absent server) fails the request with a reason,
turns the status to `error`, keeps off the server during a bounded backoff, and
recovers by itself once the server answers again.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
from collections.abc import AsyncIterator

import pytest
from completions_server import CompletionsServer

from dgemma_lsp.engine.api import DenoiseRequest, GenerationSettings, InfillContext
from dgemma_lsp.engine.client import EngineUnavailableError
from dgemma_lsp.engine.model.prompting import MODEL_CONTEXT_KEY, PromptBuilder
from dgemma_lsp.engine.model.tiny_model import tiny_random_dir
from dgemma_lsp.engine.remote.template import TOKENIZER_FILES
from dgemma_lsp.engine.remote.vllm_client import (
    Backoff,
    RemoteEngineError,
    RemoteUnavailableError,
    Timeouts,
    VllmEngineClient,
)

CONTEXT = InfillContext(
    prefix="import math\n\ndef area(radius):\n    return ", suffix="\n\nprint(area(2.0))\n", language="python"
)
WAIT = 60.0
"""Seconds any wait may take on a busy 2-core machine: slow is fine, stuck is a failure."""


def request(candidates: int = 1, max_tokens: int = 32, seed: int | None = 7, **extra) -> DenoiseRequest:
    settings = GenerationSettings(candidates=candidates, max_tokens=max_tokens, seed=seed, **extra)
    return DenoiseRequest(context=CONTEXT, settings=settings)


class Watched:
    """A client plus a way to wait for its status to reach a state."""

    def __init__(self, client: VllmEngineClient) -> None:
        self.client = client
        self.states: list[str] = []
        self._changed = asyncio.Event()
        client.on_status(self._on_status)

    def _on_status(self, status) -> None:
        self.states.append(status.state)
        self._changed.set()

    async def reaches(self, *states: str, seconds: float = WAIT) -> None:
        async with asyncio.timeout(seconds):
            while self.client.status().state not in states:
                self._changed.clear()
                await self._changed.wait()

    async def denoise(self, req: DenoiseRequest, drafts: list | None = None):
        return await asyncio.wait_for(
            self.client.denoise(req, (drafts if drafts is not None else []).append), WAIT
        )


async def started(server: CompletionsServer, model: str = "tiny-random", **options) -> Watched:
    options.setdefault("timeouts", Timeouts(connect=5.0, read=WAIT, total=WAIT))
    options.setdefault("backoff", Backoff(first=0.1, most=0.5))
    watched = Watched(VllmEngineClient(server.url, model, **options))
    await watched.client.start()
    return watched


@pytest.fixture
async def remote(server: CompletionsServer) -> AsyncIterator[Watched]:
    watched = await started(server)
    await watched.reaches("ready")
    yield watched
    await watched.client.close()


async def eventually(predicate, seconds: float = WAIT) -> None:
    async with asyncio.timeout(seconds):
        while not predicate():
            await asyncio.sleep(0.02)


# -- what is sent, what comes back ---------------------------------------------------------------


async def test_the_prompt_is_the_prompt_builders_text(server: CompletionsServer, remote: Watched):
    builder = PromptBuilder(server.runtime.tokenizer)
    await remote.denoise(request())
    body = server.counters.bodies[-1]
    assert body["prompt"] == builder.layout.text(CONTEXT).all
    assert server.runtime.tokenizer(body["prompt"], add_special_tokens=False)["input_ids"] == builder.build(CONTEXT).all
    assert body["add_special_tokens"] is False  # the template's <bos> is in the text: never a second one
    assert (body["model"], body["n"], body["max_tokens"], body["stream"]) == ("tiny-random", 1, 32, True)
    assert "suffix" not in body  # vLLM rejects it for DiffusionGemma


async def test_candidates_are_the_models_answers_reassembled_from_the_stream(server, remote: Watched):
    drafts: list = []
    result = await remote.denoise(request(candidates=3, max_tokens=96, seed=11), drafts)
    body = server.counters.bodies[-1]
    direct = server.complete(body["prompt"], n=3, max_tokens=96, seed=11, add_special_tokens=False)
    assert [c.text for c in result.candidates] == [c.text for c in direct.candidates]
    assert [c.confidence for c in result.candidates] == pytest.approx([c.confidence for c in direct.candidates])
    assert len({c.text for c in result.candidates}) > 1  # n canvases, not one answer thrice
    assert result.prompt_tokens == direct.prompt_tokens
    assert drafts == []  # the API streams no denoising steps
    assert remote.client.status().state == "ready"


async def test_a_rewrite_carries_the_selection_in_the_prompt_and_ignores_per_request_steps(server, remote: Watched, caplog):
    builder = PromptBuilder(server.runtime.tokenizer)
    rewrite = DenoiseRequest(context=CONTEXT, settings=GenerationSettings(steps=5, max_tokens=32, seed=3),
                             selection="math.pi * radius ** 2", strength=0.5)
    with caplog.at_level(logging.INFO, logger="dgemma_lsp.engine.remote.vllm_client"):
        result = await remote.denoise(rewrite)
    body = server.counters.bodies[-1]
    assert body["prompt"] == builder.layout.text(CONTEXT, rewrite=True, original=rewrite.selection).all
    assert rewrite.selection in body["prompt"]  # what to rewrite travels in the prompt: no starting canvas
    assert not {"steps", "max_denoising_steps", "suffix"} & body.keys()
    assert len(result.candidates) == 1
    assert len([r for r in caplog.records if r.name == "dgemma_lsp.engine.remote.vllm_client"]) >= 2


async def test_requests_share_one_kept_alive_connection(server: CompletionsServer, remote: Watched):
    before = server.counters.connections  # the probe's connection may still be in the pool
    for seed in (1, 2, 3):
        await remote.denoise(request(seed=seed))
    await server.counted("completed", 3)
    assert server.counters.connections - before <= 1  # streams read to their end leave the connection reusable


# -- cancellation ------------------------------------------------------------------------------------


async def test_cancelling_mid_stream_closes_the_stream(server: CompletionsServer, remote: Watched):
    server.behaviour.chunk_delay = 0.5
    task = asyncio.ensure_future(remote.client.denoise(request(candidates=2, max_tokens=64), lambda d: None))
    assert await asyncio.to_thread(server.streaming.wait, WAIT)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await eventually(lambda: server.counters.disconnected == 1)
    server.behaviour.chunk_delay = 0.0
    assert len((await remote.denoise(request())).candidates) == 1
    await server.counted("completed", 1)  # the cancelled stream was never finished (it was counted disconnected)
    assert remote.client.status().state == "ready"


async def test_cancelling_while_the_model_runs_stops_the_model(server: CompletionsServer, remote: Watched):
    server.behaviour.steps = 400  # long enough to be caught mid-denoise
    task = asyncio.ensure_future(remote.client.denoise(request(max_tokens=64), lambda d: None))
    assert await asyncio.to_thread(server.denoising.wait, WAIT)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await eventually(lambda: server.counters.aborted == 1)
    server.behaviour.steps = 2
    assert len((await remote.denoise(request())).candidates) == 1


# -- faults -----------------------------------------------------------------------------------------


async def test_a_server_error_turns_the_status_to_error_then_it_recovers_by_itself(server, remote: Watched):
    server.behaviour.fail_status, server.behaviour.fail_count = 503, 1
    with pytest.raises(EngineUnavailableError):
        await remote.denoise(request())
    status = remote.client.status()
    assert status.state == "error" and status.message
    await remote.reaches("ready")  # the recovery probe, with no request from us
    assert server.counters.probes >= 2
    assert len((await remote.denoise(request())).candidates) == 1


async def test_a_rejected_request_fails_alone_and_starts_no_backoff(server: CompletionsServer, remote: Watched):
    server.behaviour.fail_status, server.behaviour.fail_count = 400, 1
    with pytest.raises(RemoteEngineError) as error:
        await remote.denoise(request())
    assert error.value.fault == "rejected"
    assert remote.client.status().state == "error"
    assert len((await remote.denoise(request())).candidates) == 1  # straight through, no waiting window
    assert server.counters.completions == 2
    assert remote.client.status().state == "ready"


async def test_a_failing_server_is_not_hammered(server: CompletionsServer):
    """Inside a backoff window requests fail at once, unsent; recovery at the window's end is
    `test_server_down_then_back`. The window outlasts any test, so no machine speed decides this."""
    watched = await started(server, backoff=Backoff(first=600.0, most=600.0))
    try:
        await watched.reaches("ready")
        server.behaviour.fail_status, server.behaviour.fail_count = 503, 1000
        server.behaviour.probe_status = 503
        probes = server.counters.probes
        for _ in range(20):  # a user typing on while the server fails
            with pytest.raises(EngineUnavailableError):
                await watched.denoise(request())
        assert server.counters.completions == 1  # the first failed; the other 19 never left the client
        assert server.counters.probes == probes  # and nobody probes before the window ends
        assert watched.client.status().state == "error"
    finally:
        await watched.client.close()


@pytest.mark.parametrize(("kind", "fault"), [
    ("json", "malformed-event"),  # an event whose data is not JSON
    ("no-done", "incomplete-stream"),  # the stream ends without [DONE]
    ("content-type", "not-a-stream"),  # a JSON body where an event stream belongs
    ("drop", "connection-lost"),  # the connection shut mid-stream
])
async def test_a_malformed_stream_is_an_error_and_the_next_request_works(server, remote: Watched, kind: str, fault: str):
    server.behaviour.malformed = kind
    with pytest.raises(RemoteUnavailableError) as error:  # the server is unwell: a backoff starts
        await remote.denoise(request())
    assert error.value.fault == fault
    assert remote.client.status().state == "error"
    await remote.reaches("ready")
    assert len((await remote.denoise(request())).candidates) == 1


async def test_server_down_then_back(server: CompletionsServer, remote: Watched):
    server.stop()
    with pytest.raises(EngineUnavailableError):
        await remote.denoise(request())
    assert remote.client.status().state == "error"
    server.start()  # the same port
    await remote.reaches("ready")
    assert len((await remote.denoise(request())).candidates) == 1


async def test_reload_asks_the_server_now_whatever_the_backoff(server: CompletionsServer):
    """`dgemma.reloadModel` on a remote engine: one probe at once, not at the end of a long backoff."""
    watched = await started(server, backoff=Backoff(first=600.0, most=600.0))
    try:
        await watched.reaches("ready")
        server.behaviour.fail_status, server.behaviour.fail_count = 503, 1
        with pytest.raises(EngineUnavailableError):
            await watched.denoise(request())
        assert watched.client.status().state == "error"  # and the next probe is 10 minutes away
        probes = server.counters.probes
        status = await asyncio.wait_for(watched.client.reload(), WAIT)
        assert status.state == "ready" and server.counters.probes == probes + 1
        assert len((await watched.denoise(request())).candidates) == 1
    finally:
        await watched.client.close()


async def test_a_slow_server_is_waited_for_and_a_stuck_one_times_out(server: CompletionsServer):
    read = 6.0  # between two chunks; the model's own time (a busy machine) counts too
    watched = await started(server, timeouts=Timeouts(connect=5.0, read=read, total=WAIT))
    try:
        await watched.reaches("ready")
        server.behaviour.first_byte_delay = 0.5
        assert len((await watched.denoise(request())).candidates) == 1
        server.behaviour.first_byte_delay = 3 * read
        with pytest.raises(EngineUnavailableError):
            await watched.denoise(request())
        assert watched.client.status().state == "error"
        server.behaviour.first_byte_delay = 0.0
        await watched.reaches("ready")
        assert len((await watched.denoise(request())).candidates) == 1
    finally:
        await watched.client.close()


# -- configuration --------------------------------------------------------------------------------


async def test_the_api_key_is_sent_as_a_bearer_token(server: CompletionsServer):
    server.api_key = "team-secret"
    keyless = await started(server)
    keyed = await started(server, api_key="team-secret")
    try:
        await keyless.reaches("error")
        await keyed.reaches("ready")
        assert len((await keyed.denoise(request())).candidates) == 1
        with pytest.raises(EngineUnavailableError):
            await keyless.denoise(request())
    finally:
        server.api_key = None
        await keyless.client.close()
        await keyed.client.close()


async def test_the_served_models_context_limit_is_in_the_status(server: CompletionsServer, remote: Watched, tmp_path):
    # The server cuts every request's context to EngineStatus.context_tokens (tests/server/test_model_context.py);
    # a remote engine loads no tokenizer, so it reads the limit from the tokenizer files it lays prompts out with.
    assert remote.client.status().context_tokens is None  # tiny-random names none
    for name in TOKENIZER_FILES:
        if (tiny_random_dir() / name).is_file():
            shutil.copy(tiny_random_dir() / name, tmp_path / name)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({**config, MODEL_CONTEXT_KEY: 120}))
    limited = await started(server, tokenizer=str(tmp_path))
    try:
        await limited.reaches("ready")
        assert limited.client.status().context_tokens == 120
    finally:
        await limited.client.close()

async def test_a_model_the_server_does_not_serve_is_an_error(server: CompletionsServer):
    watched = await started(server, model=str(tiny_random_dir()))  # right tokenizer, wrong served name
    try:
        await watched.reaches("error")
        assert watched.client.status().message
        with pytest.raises(EngineUnavailableError):
            await watched.denoise(request())
    finally:
        await watched.client.close()


async def test_an_engine_url_that_is_no_http_url_is_an_error_not_a_crash():
    watched = Watched(VllmEngineClient("ftp://gpu-box/v1", "tiny-random"))
    await watched.client.start()
    try:
        await watched.reaches("error")
        with pytest.raises(EngineUnavailableError):
            await watched.denoise(request())
    finally:
        await watched.client.close()
