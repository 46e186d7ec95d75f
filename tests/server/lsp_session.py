"""Shared helpers for the language-server tests (imported as `lsp_session`): a real `dgemma-lsp --stdio --model tiny-random`
driven by pytest-lsp's client, which also records our custom notifications and answers
`workspace/applyEdit` and `client/registerCapability` like an editor would.

Position helpers here are written independently of server/positions.py (by encoding the
text), so the tests check the server's conversion rather than repeat it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import json
import sys
import uuid
from pathlib import Path
from typing import Any

from lsprotocol import types as lsp
from pytest_lsp import ClientServerConfig, LanguageClient, client_capabilities, make_test_lsp_client

ROOT = Path(__file__).resolve().parents[2]
FIB = ROOT / "examples" / "fib.py"
TIMEOUT = 240.0
"""Seconds any single wait may take: the tiny model on a busy 2-core machine is slow, never stuck."""

FAST = {"steps": 2, "maxTokens": 32, "seed": 7, "earlyStop": False, "debounceMs": 10}
"""Settings that keep the tiny model quick and deterministic."""


def server_command(*extra: str) -> list[str]:
    return [sys.executable, "-m", "dgemma_lsp.server.cli", "--stdio", "--model", "tiny-random", "--engine", "inprocess", *extra]


def recording_client() -> LanguageClient:
    """pytest-lsp's client plus: every dgemma/* notification in order, and applyEdit answered."""
    client = make_test_lsp_client()
    client.custom: list[tuple[str, Any]] = []  # type: ignore[attr-defined]
    client.applied_edits: list[lsp.WorkspaceEdit] = []  # type: ignore[attr-defined]
    client.events: list[tuple[str, Any]] = []  # type: ignore[attr-defined]

    for method in ("dgemma/draft", "dgemma/status", "dgemma/inlineEditDraft"):

        def record(ls: LanguageClient, params: Any, method: str = method) -> None:
            ls.custom.append((method, plain(params)))
            ls.events.append((method, plain(params)))

        client.feature(method)(record)

    client.registrations: list[lsp.Registration] = []  # type: ignore[attr-defined]

    @client.feature(lsp.CLIENT_REGISTER_CAPABILITY)
    def register(ls: LanguageClient, params: lsp.RegistrationParams) -> None:
        ls.registrations.extend(params.registrations)  # as an editor does (file watchers, ...)

    @client.feature(lsp.WORKSPACE_APPLY_EDIT)
    def apply_edit(ls: LanguageClient, params: lsp.ApplyWorkspaceEditParams):
        ls.applied_edits.append(params.edit)
        return lsp.ApplyWorkspaceEditResult(applied=True)

    return client


def plain(value: Any) -> Any:
    """pygls hands untyped JSON objects over as namedtuples: back to dicts and lists."""
    if hasattr(value, "_asdict"):
        return {k: plain(v) for k, v in value._asdict().items()}
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


def config(*extra: str) -> ClientServerConfig:
    return ClientServerConfig(server_command=server_command(*extra), client_factory=recording_client)


def capabilities(name: str, *, encodings: list[str] | None = None, resolve: bool = True, watch_files: bool = False,
                 experimental: dict | None = None) -> lsp.ClientCapabilities:
    """Recorded capabilities of a real editor, optionally with other encodings, no codeAction/resolve,
    file watchers registered on request (as VS Code does) or `experimental` ones."""
    caps = client_capabilities(name)
    if encodings is not None:
        caps.general = lsp.GeneralClientCapabilities(position_encodings=encodings)
    if not resolve and caps.text_document and caps.text_document.code_action:
        caps.text_document.code_action.resolve_support = None
    if watch_files:
        caps.workspace.did_change_watched_files.dynamic_registration = True  # type: ignore[union-attr]
    if experimental is not None:
        caps.experimental = experimental
    return caps


async def initialize(client: LanguageClient, caps: lsp.ClientCapabilities, options: dict | None,
                     root: Path = ROOT) -> lsp.InitializeResult:
    return await client.initialize_session(
        lsp.InitializeParams(capabilities=caps, initialization_options=options, root_uri=root.as_uri())
    )


def open_document(client: LanguageClient, uri: str, text: str, language: str = "python") -> None:
    client.text_document_did_open(
        lsp.DidOpenTextDocumentParams(text_document=lsp.TextDocumentItem(uri=uri, language_id=language, version=1, text=text))
    )


def units(text: str, encoding: str) -> int:
    if encoding == "utf-8":
        return len(text.encode("utf-8"))
    if encoding == "utf-16":
        return len(text.encode("utf-16-le")) // 2
    return len(text)


def position_of(text: str, offset: int, encoding: str) -> lsp.Position:
    """The LSP position of str offset `offset` (lines split on \\n only: the test texts use \\n)."""
    line = text.count("\n", 0, offset)
    start = text.rfind("\n", 0, offset) + 1
    return lsp.Position(line=line, character=units(text[start:offset], encoding))


def offset_of(text: str, position: lsp.Position, encoding: str) -> int:
    """The str offset of an LSP position, by encoding each prefix of the line (slow, obviously right)."""
    lines = text.split("\n")
    start = sum(len(line) + 1 for line in lines[: position.line])
    line = lines[position.line]
    for i in range(len(line) + 1):
        if units(line[:i], encoding) == position.character:
            return start + i
    raise AssertionError(f"{position} is not on a character boundary of {line!r}")


def apply_item(text: str, cursor: int, item: lsp.InlineCompletionItem, encoding: str) -> str:
    """What an editor does on accept: replace item.range with insertText.

    Every item must carry a range ([cursor, cursor) for a plain insert): lsp-mode reads it
    unconditionally and shows nothing for an item without one."""
    insert = item.insert_text if isinstance(item.insert_text, str) else item.insert_text.value
    assert item.range is not None, "an inline item without a range: lsp-mode cannot show it"
    assert item.range.start.line == item.range.end.line, "an inline item's range is one line"
    start = offset_of(text, item.range.start, encoding)
    end = offset_of(text, item.range.end, encoding)
    assert start <= cursor <= end, "an inline item's range holds the cursor"
    return text[:start] + insert + text[end:]


async def within(awaitable, seconds: float = TIMEOUT):
    return await asyncio.wait_for(awaitable, seconds)


async def wait_until(client: LanguageClient, predicate, method: str, seconds: float = TIMEOUT):
    """Wait for notifications of `method` until `predicate()` holds."""

    async def loop():
        while not predicate():
            await client.wait_for_notification(method)

    await within(loop(), seconds)


def send_raw(client: LanguageClient, method: str, params: Any) -> asyncio.Future:
    """Send a request exactly as given (the typed client API cannot send malformed params)."""
    msg_id = f"raw-{uuid.uuid4().hex[:8]}"
    future: concurrent.futures.Future = concurrent.futures.Future()
    client.protocol._request_futures[msg_id] = future
    send_body(client, json.dumps({"jsonrpc": "2.0", "id": msg_id, "method": method, "params": params}).encode())
    return asyncio.wrap_future(future)


def send_body(client: LanguageClient, body: bytes) -> None:
    """Send one message body exactly as given, framed (a body that is not JSON too)."""
    written = client.protocol.writer.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)
    if inspect.isawaitable(written):
        asyncio.ensure_future(written)


def record_wire(client: LanguageClient) -> list[Any]:
    """From now on, every message the client receives, in order, as pygls decoded it (answers
    pygls' client has no request for included: an error answer with id null, say)."""
    received: list[Any] = []
    handle = client.protocol.handle_message

    def noting(message: Any) -> None:
        received.append(message)
        handle(message)

    client.protocol.handle_message = noting  # type: ignore[method-assign]
    return received
