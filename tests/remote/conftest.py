"""Remote-engine fixtures: one real HTTP server of the API subset, answering with the tiny model.

The server lives in this test process (a thread); `server` hands it to a test
fresh (no faults, zeroed counters, started). tests/server is put on sys.path so
the LSP tests here share its session helpers (`lsp_session`).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from completions_server import CompletionsServer

from dgemma_lsp.engine.runtime.denoising import DenoisingRuntime

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "server"))


@pytest.fixture(scope="session")
def completions_server():
    server = CompletionsServer(DenoisingRuntime.load("tiny-random"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def server(completions_server: CompletionsServer) -> CompletionsServer:
    completions_server.reset()
    if not completions_server.running:
        completions_server.start()
    return completions_server
