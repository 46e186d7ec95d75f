"""Two real language servers (`dgemma-lsp --stdio --engine daemon`) on one daemon, and kill -9.

Both servers start at once and race to spawn the daemon: one daemon, one model
load, two clients. Completions from both go through it (drafts stream back).
Then the daemon is killed with SIGKILL: both servers report it in `dgemma/status`,
respawn it, and the next completion works without restarting either server.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from typing import Any

from daemon_helpers import TIMEOUT, engine_status, within
from lsprotocol import types as lsp
from pytest_lsp import LanguageClient, client_capabilities, make_test_lsp_client

SETTINGS = {"steps": 2, "maxTokens": 32, "seed": 7, "earlyStop": False, "debounceMs": 10,
            "drafts": True, "status": True}
TEXT = "def area(radius):\n    return \n\n\nprint(area(2.0))\n"


def language_server() -> LanguageClient:
    client = make_test_lsp_client()
    client.statuses: list[dict[str, Any]] = []  # type: ignore[attr-defined]
    client.drafts: list[dict[str, Any]] = []  # type: ignore[attr-defined]
    client.status_changed = asyncio.Event()  # type: ignore[attr-defined]

    @client.feature("dgemma/status")
    def on_status(ls: LanguageClient, params: Any) -> None:
        ls.statuses.append(_plain(params))
        ls.status_changed.set()

    @client.feature("dgemma/draft")
    def on_draft(ls: LanguageClient, params: Any) -> None:
        ls.drafts.append(_plain(params))

    return client


def _plain(value: Any) -> Any:
    return {k: _plain(v) for k, v in value._asdict().items()} if hasattr(value, "_asdict") else value


async def wait_for_state(client: LanguageClient, *states: str, after: int = 0) -> int:
    """Index of the first `dgemma/status` at index >= `after` whose state is one of `states`."""

    async def loop() -> int:
        while True:
            for index in range(after, len(client.statuses)):
                if client.statuses[index]["state"] in states:
                    return index
            client.status_changed.clear()
            await client.status_changed.wait()

    return await within(loop())


async def complete(client: LanguageClient, uri: str) -> lsp.InlineCompletionList:
    drafts_before = len(client.drafts)
    result = await within(client.text_document_inline_completion_async(lsp.InlineCompletionParams(
        text_document=lsp.TextDocumentIdentifier(uri=uri), position=lsp.Position(line=1, character=11),
        context=lsp.InlineCompletionContext(trigger_kind=lsp.InlineCompletionTriggerKind.Invoked),
    )))
    assert isinstance(result, lsp.InlineCompletionList)
    assert len(client.drafts) > drafts_before, "no drafts: the request never reached the daemon's model"
    return result


def open_document(client: LanguageClient, uri: str) -> None:
    client.text_document_did_open(lsp.DidOpenTextDocumentParams(
        text_document=lsp.TextDocumentItem(uri=uri, language_id="python", version=1, text=TEXT)))


async def test_two_servers_share_one_daemon_and_survive_its_kill(runtime_dir):
    command = [sys.executable, "-m", "dgemma_lsp.server.cli", "--stdio", "--engine", "daemon", "--model", "tiny-random"]
    servers = [language_server(), language_server()]
    try:
        await asyncio.gather(*(s.start_io(*command, env=dict(os.environ)) for s in servers))
        await within(asyncio.gather(*(
            s.initialize_session(lsp.InitializeParams(
                capabilities=client_capabilities("visual-studio-code"), initialization_options=SETTINGS))
            for s in servers
        )))
        for server in servers:
            await wait_for_state(server, "ready")

        status = engine_status()
        assert status["running"] and status["clients"] == 2 and status["loads"] == 1
        assert sorted(status["clientPids"]) == sorted(s._server.pid for s in servers)
        for index, server in enumerate(servers):
            open_document(server, f"file:///tmp/area{index}.py")
            await complete(server, f"file:///tmp/area{index}.py")
        assert engine_status()["loads"] == 1

        # kill -9: both servers notice, say so, respawn; the next completion just works.
        seen = [len(s.statuses) for s in servers]
        os.kill(status["pid"], signal.SIGKILL)
        for server, after in zip(servers, seen, strict=True):
            failed = await wait_for_state(server, "error", after=after)
            assert server.statuses[failed]["message"]
            await wait_for_state(server, "ready", after=failed)
        for index, server in enumerate(servers):
            open_document(server, f"file:///tmp/again{index}.py")
            await complete(server, f"file:///tmp/again{index}.py")

        after_kill = engine_status()
        assert after_kill["pid"] != status["pid"]
        assert after_kill["clients"] == 2 and after_kill["loads"] == 1
    finally:
        for server in servers:
            try:
                await asyncio.wait_for(server.shutdown_session(), TIMEOUT)
            except Exception:
                pass
            await server.stop()
