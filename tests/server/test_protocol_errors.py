"""Errors a client causes are answered the way JSON-RPC says and cost the editor's log one line at most.

- A body that is not JSON is answered -32700 (Parse error, id null), with no window/showMessage,
  and the server keeps serving.
- A request answered with an error the server expects (an unknown document, a position outside
  the document, params that do not decode: -32602) leaves no ERROR record and no traceback.

A real `dgemma-lsp --stdio --model tiny-random` logging to a file. The server handles messages
in the order they come, and logs an answer before writing it: once the answer to the next
request is in, whatever the one before caused (an answer, a message, a log line) is too.
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

import pytest
import pytest_lsp
from lsp_session import (
    FAST,
    capabilities,
    config,
    initialize,
    open_document,
    record_wire,
    send_body,
    send_raw,
    within,
)
from lsprotocol import types as lsp
from pygls.exceptions import JsonRpcException
from pytest_lsp import LanguageClient

pytestmark = pytest.mark.asyncio(loop_scope="module")

LOG = Path(tempfile.mkdtemp(prefix="dgemma-protocol-errors-")) / "server.log"
RECORD = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ (?P<level>[A-Z]+) ")
"""How every record of `--log-file` starts (cli.py's format); a traceback's lines do not."""
PARSE_ERROR = -32700
INVALID_PARAMS = -32602
DOCUMENT = "file:///tmp/protocol-errors.py"


@pytest_lsp.fixture(scope="module", config=config("--log-file", str(LOG)))
async def client(lsp_client: LanguageClient):
    await initialize(lsp_client, capabilities("neovim@v0.11.0"), FAST)
    open_document(lsp_client, DOCUMENT, "total = 1\n")
    lsp_client.wire = record_wire(lsp_client)
    yield
    await lsp_client.shutdown_session()


def log_size() -> int:
    return LOG.stat().st_size if LOG.exists() else 0


def log_since(start: int) -> list[str]:
    with LOG.open("rb") as file:
        file.seek(start)
        return file.read().decode("utf-8", errors="replace").splitlines()


def assert_at_most_one_quiet_line(lines: list[str]) -> None:
    assert all(RECORD.match(line) for line in lines), "a multi-line record (a traceback):\n" + "\n".join(lines)
    assert [RECORD.match(line)["level"] for line in lines] in ([], ["INFO"], ["WARNING"]), "\n".join(lines)


async def still_serving(client: LanguageClient) -> None:
    status = await within(client.workspace_execute_command_async(lsp.ExecuteCommandParams(command="dgemma.status")))
    assert status is not None


async def test_a_body_that_is_not_json_is_answered_parse_error_and_the_server_keeps_serving(client: LanguageClient):
    start, received = log_size(), len(client.wire)
    send_body(client, b'{"jsonrpc": "2.0", "id": 7, "method": "textDocument/inlineCompletion", "params": {"x": "unterm')
    await still_serving(client)
    errors = [m for m in client.wire[received:] if getattr(m, "error", None) is not None]
    assert [(m.id, m.error.code) for m in errors] == [(None, PARSE_ERROR)]
    assert [m for m in client.messages if m.type == lsp.MessageType.Error] == []
    assert_at_most_one_quiet_line(log_since(start))


def inline(uri: str, line: int, character: int) -> lsp.InlineCompletionParams:
    return lsp.InlineCompletionParams(
        text_document=lsp.TextDocumentIdentifier(uri=uri), position=lsp.Position(line=line, character=character),
        context=lsp.InlineCompletionContext(trigger_kind=lsp.InlineCompletionTriggerKind.Invoked),
    )


EXPECTED = {
    "unknown document": lambda client: client.text_document_inline_completion_async(
        inline("file:///tmp/never-opened.py", 0, 0)),
    "position outside the document": lambda client: client.text_document_inline_completion_async(
        inline(DOCUMENT, 40, 0)),
    "params that do not decode": lambda client: send_raw(client, lsp.TEXT_DOCUMENT_INLINE_COMPLETION, {
        "textDocument": {"uri": DOCUMENT}, "position": {"line": "one", "character": 0}}),
}


@pytest.mark.parametrize("case", list(EXPECTED))
async def test_an_expected_error_is_answered_without_an_error_record_or_traceback(client: LanguageClient, case: str):
    start = log_size()
    with pytest.raises(JsonRpcException) as error:
        await within(EXPECTED[case](client))
    assert error.value.code == INVALID_PARAMS
    assert_at_most_one_quiet_line(log_since(start))
    await still_serving(client)
