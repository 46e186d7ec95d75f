"""The shutdown/exit handshake: `shutdown` then `exit` ends the server with status 0."""

from __future__ import annotations

import pytest_lsp
from lsp_session import FAST, capabilities, config, initialize, within
from pytest_lsp import LanguageClient


@pytest_lsp.fixture(config=config())
async def client(lsp_client: LanguageClient):
    await initialize(lsp_client, capabilities("neovim@v0.11.0"), FAST)
    yield


async def test_shutdown_then_exit_exits_zero(client: LanguageClient):
    await within(client.shutdown_session())
    assert client._server.returncode == 0
