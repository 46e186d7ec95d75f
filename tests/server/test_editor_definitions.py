"""`dgemma/definitions` over LSP: a real `dgemma-lsp --stdio --model tiny-random` and a real LSP client that answers it.

The client plays the editor: it advertises `experimental.dgemmaDefinitions`, and answers each
position with the definition the "other language servers" found, read from files on disk: a
module outside the workspace (`payments`, as if in site-packages: the workspace index cannot see
it), a class of the workspace (the index finds it too: shown once), and a name of the document
itself (the window shows it: never a snippet). The snippets of each prompt are read back with
`dgemma.contextSnippets`. Clients that answer with an error, with garbage or too late lose nothing
but the editor's snippets (one log line each); a client that does not advertise is never asked.
Last, the server's placing of a definition named by its real path in a workspace opened through a
symbolic link (as VS Code's TypeScript support names them), on a real link on disk.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from pathlib import Path

import pytest
import pytest_lsp
from lsp_session import (
    FAST,
    TIMEOUT,
    capabilities,
    initialize,
    open_document,
    plain,
    recording_client,
    server_command,
    within,
)
from lsprotocol import types as lsp
from pytest_lsp import ClientServerConfig, LanguageClient

from dgemma_lsp.engine.api import InfillContext
from dgemma_lsp.engine.crossfile.editor import EditorDefinition
from dgemma_lsp.server.documents import DocumentStore
from dgemma_lsp.server.workspace import WorkspaceContext

WORKSPACE = Path(tempfile.mkdtemp(prefix="dgemma-editor-defs-"))
LIBRARY = Path(tempfile.mkdtemp(prefix="dgemma-site-packages-"))
LOGS = Path(tempfile.mkdtemp(prefix="dgemma-editor-defs-logs-"))
MODELS = '''class Invoice:
    """A bill sent to a customer."""

    def __init__(self, customer, lines):
        self.customer = customer
        self.lines = lines
'''
PAYMENTS = '''"""A third-party payments client."""


def charge(invoice, currency="EUR", *,
           retries=3):
    """Charge the invoice's customer."""
    return {"id": 1}
'''
REPORT = '''import payments

from .models import Invoice


def summary(invoice: Invoice) -> str:
    receipt = payments.charge(invoice)
    amount = invoice.
    return f"{invoice.customer}: {amount} {receipt}"
'''
(WORKSPACE / "app").mkdir()
(WORKSPACE / "app" / "__init__.py").write_text("")
(WORKSPACE / "app" / "models.py").write_text(MODELS)
(WORKSPACE / "app" / "report.py").write_text(REPORT)
(LIBRARY / "payments.py").write_text(PAYMENTS)
URI = (WORKSPACE / "app" / "report.py").as_uri()
CURSOR = lsp.Position(line=7, character=len("    amount = invoice."))
RESOLVES = {  # the name at a position -> (file, 0-based line of its definition)
    "charge": (LIBRARY / "payments.py", 3),
    "Invoice": (WORKSPACE / "app" / "models.py", 0),
    "summary": (WORKSPACE / "app" / "report.py", 5),
}


@pytest.fixture(scope="module", autouse=True)
def _scratch():
    yield
    shutil.rmtree(WORKSPACE, ignore_errors=True)
    shutil.rmtree(LIBRARY, ignore_errors=True)
    shutil.rmtree(LOGS, ignore_errors=True)


def definitions_of(params: dict) -> list:
    """What an editor answers: per position, the definitions of the name there, with `maxLines` lines."""
    lines = REPORT.split("\n")
    answer = []
    for position in params["positions"]:
        line, character = position["line"], position["character"]
        text = lines[line]
        start = end = character
        while end < len(text) and (text[end].isalnum() or text[end] == "_"):
            end += 1
        name = text[start:end]
        if name not in RESOLVES:
            answer.append([])  # known to have no definition (null would say: not known yet)
            continue
        file, at = RESOLVES[name]
        shown = "\n".join(file.read_text().split("\n")[at:at + params["maxLines"]])
        answer.append([{"uri": file.as_uri(), "text": shown, "range": {
            "start": {"line": at, "character": 0}, "end": {"line": at, "character": 3}}}])
    return answer


def editor_client(behaviour: str):
    """A recording client that answers `dgemma/definitions` as `behaviour` says."""

    def factory() -> LanguageClient:
        client = recording_client()
        client.asked = []  # type: ignore[attr-defined]
        client.release = asyncio.Event()  # type: ignore[attr-defined]
        if behaviour == "error":
            # The error answer is what this client is for: pytest-lsp would fail the test on any error
            # a handler raises (pygls still answers the server with it).
            client.report_server_error = lambda error, source: None  # type: ignore[method-assign]

        @client.feature("dgemma/definitions")
        async def answer(ls: LanguageClient, params):
            ls.asked.append(plain(params))
            if behaviour == "error":
                raise RuntimeError("no definition provider for this file")
            if behaviour == "garbage":
                return {"definitions": "all of them"}
            if behaviour == "late":
                await ls.release.wait()
            return definitions_of(plain(params))

        return client

    return factory


def config_for(behaviour: str) -> ClientServerConfig:
    return ClientServerConfig(server_command=server_command("--log-file", str(LOGS / f"{behaviour}.log"),
                                                             "--log-level", "INFO"),
                              client_factory=editor_client(behaviour))


async def start(client: LanguageClient, advertise: bool) -> None:
    caps = capabilities("visual_studio_code", experimental={"dgemmaDefinitions": True} if advertise else None)
    await initialize(client, caps, {**FAST, "cacheSize": 0}, WORKSPACE)
    open_document(client, URI, REPORT)


async def snippets_at(client: LanguageClient, position: lsp.Position = CURSOR) -> list[dict]:
    items = await within(client.text_document_inline_completion_async(lsp.InlineCompletionParams(
        text_document=lsp.TextDocumentIdentifier(uri=URI), position=position,
        context=lsp.InlineCompletionContext(trigger_kind=lsp.InlineCompletionTriggerKind.Invoked))))
    assert items is not None  # answered, whatever the editor did
    return await within(client.workspace_execute_command_async(
        lsp.ExecuteCommandParams(command="dgemma.contextSnippets", arguments=[URI])))


async def until(client: LanguageClient, predicate) -> list[dict]:
    async def poll():
        while not predicate(snippets := await snippets_at(client)):
            await asyncio.sleep(0.3)  # quiet: the index builds and the answer arrives
        return snippets

    return await within(poll(), TIMEOUT)


def editor_snippets(snippets: list[dict]) -> list[dict]:
    return [s for s in snippets if s["source"] == "editor"]


@pytest_lsp.fixture(config=config_for("answers"))
async def answering(lsp_client: LanguageClient):
    await start(lsp_client, advertise=True)
    yield
    await lsp_client.shutdown_session()


async def test_the_editors_definition_reaches_the_prompt_header_only_once_and_never_from_the_cursor_line(answering):
    client = answering
    snippets = await until(client, lambda found: editor_snippets(found)
                           and any(s["source"] == "definition" and "class Invoice" in s["text"] for s in found))
    (charge,) = editor_snippets(snippets)  # Invoice: the index shows it already; summary: the window shows it
    assert charge["path"] == str(LIBRARY / "payments.py")
    assert charge["text"] == 'def charge(invoice, currency="EUR", *,\n           retries=3):'  # the header, no body
    assert (charge["startLine"], charge["endLine"]) == (3, 5) and charge["tokens"] > 0
    asked = [position for params in client.asked for position in params["positions"]]
    assert asked and all(position["line"] != CURSOR.line for position in asked)
    assert all(params["textDocument"]["uri"] == URI and params["maxLines"] >= 2 for params in client.asked)

    # Typing on the cursor's line asks nothing new and keeps the snippets as they were (the prompt cache).
    questions = len(client.asked)
    client.text_document_did_change(lsp.DidChangeTextDocumentParams(
        text_document=lsp.VersionedTextDocumentIdentifier(uri=URI, version=2),
        content_changes=[lsp.TextDocumentContentChangePartial(range=lsp.Range(start=CURSOR, end=CURSOR), text="cu")]))
    typed = lsp.Position(line=CURSOR.line, character=CURSOR.character + 2)
    assert await snippets_at(client, typed) == snippets
    assert len(client.asked) == questions

    client.workspace_did_change_configuration(lsp.DidChangeConfigurationParams(settings={"crossFile": False}))
    assert await snippets_at(client, typed) == []


@pytest_lsp.fixture(config=config_for("late"))
async def late(lsp_client: LanguageClient):
    await start(lsp_client, advertise=True)
    yield
    lsp_client.release.set()
    await lsp_client.shutdown_session()


async def test_a_completion_never_waits_for_the_editor_and_a_late_answer_serves_the_next_one(late):
    client = late
    first = await snippets_at(client)  # answered while the editor still holds its answer
    assert client.asked and not editor_snippets(first)
    client.release.set()
    snippets = await until(client, editor_snippets)
    assert [s["text"].split("(")[0] for s in editor_snippets(snippets)] == ["def charge"]


@pytest_lsp.fixture(config=config_for("error"))
async def erring(lsp_client: LanguageClient):
    await start(lsp_client, advertise=True)
    yield
    await lsp_client.shutdown_session()


@pytest_lsp.fixture(config=config_for("garbage"))
async def garbage(lsp_client: LanguageClient):
    await start(lsp_client, advertise=True)
    yield
    await lsp_client.shutdown_session()


async def test_an_editor_that_answers_with_an_error_costs_its_snippets_only_with_a_log_line(erring):
    await failing_editor_costs_nothing_else(erring, "error", "the editor answered with an error")


async def test_an_editor_that_answers_garbage_costs_its_snippets_only_with_a_log_line(garbage):
    await failing_editor_costs_nothing_else(garbage, "garbage", "unusable answer")


async def failing_editor_costs_nothing_else(client: LanguageClient, behaviour: str, logged: str) -> None:
    snippets = await until(client, lambda found: any(s["source"] == "definition" for s in found))
    assert client.asked and not editor_snippets(snippets)
    assert any("class Invoice" in s["text"] for s in snippets)  # the other sources are untouched
    log = LOGS / f"{behaviour}.log"

    async def logged_line() -> None:
        while not (log.exists() and f"dgemma/definitions: {logged}" in log.read_text()):
            await asyncio.sleep(0.2)

    await within(logged_line())


@pytest_lsp.fixture(config=config_for("answers"))
async def plain_client(lsp_client: LanguageClient):
    await start(lsp_client, advertise=False)
    yield
    await lsp_client.shutdown_session()


async def test_a_client_that_does_not_advertise_is_never_asked(plain_client):
    client = plain_client
    snippets = await until(client, lambda found: any(s["source"] == "definition" for s in found))
    await snippets_at(client, lsp.Position(line=6, character=4))  # another line: another question, if any
    assert client.asked == [] and not editor_snippets(snippets)


def test_a_definition_named_by_its_real_path_is_shown_relative_to_a_workspace_opened_through_a_link(tmp_path):
    """Editors name files by their real path (VS Code's TypeScript support does) while the workspace
    folder may have been opened through a symbolic link: the snippet is still shown relative to it,
    and a definition in the current file, named either way, is never shown."""
    real = tmp_path / "real"
    (real / "lib").mkdir(parents=True)
    (real / "lib" / "payments.py").write_text(PAYMENTS)
    (real / "report.py").write_text(REPORT)
    link = tmp_path / "link"
    link.symlink_to(real, target_is_directory=True)
    documents = DocumentStore()
    context = WorkspaceContext(documents)
    try:
        context.open_workspace(link.as_uri())
        charge = EditorDefinition(str(real / "lib" / "payments.py"), 3, 5, 'def charge(invoice, currency="EUR", *,')
        itself = EditorDefinition(str(real / "report.py"), 5, 6, "def summary(invoice: Invoice) -> str:")
        context.editor_found = lambda uri: [("payments.charge", (charge,)), ("summary", (itself,))]
        snippets = context.snippets((link / "report.py").as_uri(), "python",
                                    InfillContext(prefix="", suffix="", language="python"), 512)
        assert [(s.path, s.source, s.start_line) for s in snippets] == [("lib/payments.py", "editor", 3)]
    finally:
        documents.worker.close()


async def test_an_empty_answer_of_a_language_server_still_loading_is_asked_again_while_the_user_types_on_one_line():
    """VS Code's TypeScript support answers "no definition" until its project has loaded. The user
    then types on the same line (the lines around it, so the question, unchanged): after REFRESH_S
    the names are asked again and the late definitions reach the prompts (was: never, CI's e2e)."""
    from dgemma_lsp.server import editor_definitions
    from dgemma_lsp.server.positions import LineIndex

    now = [100.0]
    ready = [False]
    asked: list[dict] = []

    def send(method: str, params: dict):
        asked.append(params)
        future = asyncio.get_running_loop().create_future()
        future.set_result(definitions_of(params) if ready[0] else [[] for _ in params["positions"]])
        return future

    definitions = editor_definitions.EditorDefinitions(send, post=lambda job: job(), clock=lambda: now[0])
    definitions.enabled = True

    async def type_on_the_cursor_line() -> list:
        definitions.cursor(URI, "python", LineIndex(REPORT), CURSOR.line, "utf-16")
        for _ in range(3):  # the question hops worker -> loop, the answer comes back in a callback
            await asyncio.sleep(0)
        return definitions.found(URI)

    assert await type_on_the_cursor_line() == []
    assert len(asked) == 1
    ready[0] = True  # the editor's language server has loaded
    now[0] += editor_definitions.RETRY_S + 1
    assert await type_on_the_cursor_line() == []
    assert len(asked) == 1, "an answer is kept for REFRESH_S"
    now[0] += editor_definitions.REFRESH_S
    found = await type_on_the_cursor_line()
    assert len(asked) == 2
    assert [(name, [d.start_line for d in found_definitions]) for name, found_definitions in found] \
        == [("payments.charge", [3])]
