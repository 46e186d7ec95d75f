"""The language server: pygls `LanguageServer` subclass, its state, and thin async handlers.

Implements initialize (position-encoding negotiation, settings), document sync
(incremental), textDocument/inlineCompletion, textDocument/codeAction +
codeAction/resolve ("Rewrite selection"), workspace/executeCommand
(`dgemma.rewriteSelection`, `dgemma.status`, `dgemma.reloadModel`), workspace/didChangeConfiguration,
and the custom messages documented in docs/protocol.md (`dgemma/draft`,
`dgemma/status`, `dgemma/didShowCompletion`, `dgemma/didPartiallyAcceptCompletion`, and the
server->client request `dgemma/definitions` to clients that advertise it: editor_definitions.py).

Each handler translates LSP values to str offsets and plain values, delegates
(to documents.py, completions.py), and translates back. Bad input is answered
with a JSON-RPC error and the server keeps serving. lsprotocol types stop here.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

import cattrs
from lsprotocol import types as lsp
from pygls.exceptions import JsonRpcException, JsonRpcInvalidParams
from pygls.lsp.server import LanguageServer
from pygls.protocol import LanguageServerProtocol, default_converter
from pygls.protocol.language_server import lsp_method

from dgemma_lsp.engine import errors
from dgemma_lsp.engine.api import EngineStatus
from dgemma_lsp.engine.client import EngineClient
from dgemma_lsp.engine.syntax.document import SyntaxDocument
from dgemma_lsp.engine.syntax.languages import normalize_language

from . import inline_edit_lsp
from .completions import PRIORITY_TYPING, PRIORITY_WAITING, Completer, Selected, Suggestion
from .documents import DocumentStore, OpenDocument, UnknownDocumentError
from .editor_definitions import EditorDefinitions, client_supports
from .inline_edits import NextEditor
from .line_endings import line_ending, with_line_ending
from .loop_monitor import LoopMonitor
from .positions import LineIndex, PositionError
from .scheduler import CompletionCache, LatestWins, Superseded
from .settings import SECTION, ServerSettings, decode_settings
from .stats import StatsRecorder
from .workspace import WorkspaceContext

log = logging.getLogger(__name__)

REWRITE_COMMAND = "dgemma.rewriteSelection"
STATUS_COMMAND = "dgemma.status"
RELOAD_COMMAND = "dgemma.reloadModel"
CONTEXT_COMMAND = "dgemma.contextSnippets"
"""The cross-file snippets of a document's latest prompt: [{path, startLine, endLine, source, score,
tokens}] (docs/context.md)."""
STATS_COMMAND = "dgemma.serverStats"
"""For benchmarks: the longest event-loop stall, the longest busy pass of the loop and the prompt
tokens encoded per request since the previous call (the first call starts the loop monitor; with
`{"probe": true}` it also probes the loop every millisecond, see server/loop_monitor.py)."""
WATCHED_EXTENSIONS = ("py", "pyi", "js", "mjs", "cjs", "jsx", "ts", "mts", "cts", "tsx", "go", "rs", "c", "h",
                      "cc", "cpp", "cxx", "hpp", "hh", "java", "lua")
"""Files whose changes on disk the index wants to hear of (engine/syntax/languages.py's extensions)."""
DRAFT_NOTIFICATION = "dgemma/draft"
STATUS_NOTIFICATION = "dgemma/status"
DID_SHOW = "dgemma/didShowCompletion"
DID_PARTIALLY_ACCEPT = "dgemma/didPartiallyAcceptCompletion"
REQUEST_FAILED = int(lsp.LSPErrorCodes.RequestFailed)
CONTENT_MODIFIED = int(lsp.LSPErrorCodes.ContentModified)


class _Answered:
    """A request whose params failed to decode and that was already answered with an error."""


_ANSWERED = _Answered()


class DGemmaProtocol(LanguageServerProtocol):
    """pygls' protocol, plus: malformed params get a JSON-RPC error instead of silence.

    pygls 2.1.1 logs a request whose params do not decode and never answers it,
    which leaves the editor waiting forever. Answering needs `_send_response`, which
    has no public twin: pyproject.toml pins pygls to 2.1.x for it (tests/server
    send malformed params and see the answer, so an upgrade that breaks it fails there).
    `_handle_notification` and `_request_futures` are private too (the notification futures
    pygls 2.1 keeps; tests/server/test_closed_documents.py fails if that changes).
    Every message also tells the syntax worker the client spoke (`SyntaxWorker.client_spoke`).
    """

    def structure_message(self, data: dict[str, Any]):
        try:
            return super().structure_message(data)
        except JsonRpcException as error:
            if not (isinstance(data, dict) and "method" in data):
                raise
            detail = _decode_problem(error.__cause__) or str(error)
            method = data.get("method")
            if "id" in data:
                self._send_response(
                    data["id"],
                    error=lsp.ResponseError(
                        code=JsonRpcInvalidParams.CODE, message=f"invalid params for {method}: {detail}"
                    ),
                )
            else:
                log.warning("ignoring %s with invalid params: %s", method, detail)
            return _ANSWERED

    @lsp_method(lsp.INITIALIZE)
    def lsp_initialize(self, params: lsp.InitializeParams):
        result = yield from super().lsp_initialize(params)
        # Next-edit suggestions are no LSP feature: announced where experimental ones go.
        result.capabilities.experimental = {**(result.capabilities.experimental or {}), **inline_edit_lsp.CAPABILITY}
        return result

    def _handle_notification(self, method_name: str, params: Any):
        """pygls 2.1 files the future of a notification run through a generator handler (didOpen,
        didChange, didClose: every one) in `_request_futures` under a made-up id, and only a
        response ever removes an entry there: five futures per document edited, kept for the
        session (the soak's RSS growth, issue 32). Whatever a notification filed goes once done,
        at the next notification: a done callback only notes the key, because pygls iterates that
        table when it cancels everything at `exit` (a pop from there broke the exit handshake)."""
        futures = self._request_futures
        finished = self._drop_finished_notifications()
        filed = len(futures)
        super()._handle_notification(method_name, params)
        if len(futures) == filed:
            return  # nothing filed (a plain handler): the keystroke path stays a length check
        for key in list(futures)[filed:]:  # dicts keep insertion order: what this call filed
            futures[key].add_done_callback(lambda _future, key=key: finished.append(key))

    def _drop_finished_notifications(self) -> list:
        """Remove the finished notifications' futures noted so far; the list that notes them."""
        finished = self.__dict__.setdefault("_finished_notifications", [])
        while finished:
            self._request_futures.pop(finished.pop(), None)
        return finished

    @property
    def running_handlers(self) -> int:
        """Entries in pygls' table of running handlers (for `dgemma.serverStats`' `retained`)."""
        self._drop_finished_notifications()
        return len(self._request_futures)

    def handle_message(self, message):
        self._server.documents.worker.client_spoke()  # background syntax work yields to this message
        if message is _ANSWERED:
            return
        super().handle_message(message)

    # Open documents live in DocumentStore, each with its syntax tree. pygls' built-in
    # sync would keep a second copy in its Workspace, applying every keystroke twice, and
    # raises KeyError (shown to the user as "Error in server") on a change or close for a
    # document it does not hold. These overrides only hand the notification to our handlers.

    @lsp_method(lsp.TEXT_DOCUMENT_DID_OPEN)
    def lsp_text_document__did_open(self, params: lsp.DidOpenTextDocumentParams):
        yield from self._user_handler(lsp.TEXT_DOCUMENT_DID_OPEN, params)

    @lsp_method(lsp.TEXT_DOCUMENT_DID_CHANGE)
    def lsp_text_document__did_change(self, params: lsp.DidChangeTextDocumentParams):
        yield from self._user_handler(lsp.TEXT_DOCUMENT_DID_CHANGE, params)

    @lsp_method(lsp.TEXT_DOCUMENT_DID_CLOSE)
    def lsp_text_document__did_close(self, params: lsp.DidCloseTextDocumentParams):
        yield from self._user_handler(lsp.TEXT_DOCUMENT_DID_CLOSE, params)

    def _user_handler(self, method: str, params):
        if (handler := self.fm.features.get(method)) is not None:
            yield handler, (params,), None


def _decode_problem(cause: BaseException | None) -> str:
    if isinstance(cause, cattrs.ClassValidationError):
        return "; ".join(cattrs.transform_error(cause, path="params")).replace("$.", "")
    return str(cause) if cause else ""


class DGemmaServer(LanguageServer):
    """Holds the session state; handlers are registered by `build_server`."""

    def __init__(self, engine: EngineClient, version: str = "0") -> None:
        # Our own handle on the converter pygls uses (its `protocol._converter` is private).
        self.converter = default_converter()
        super().__init__("dgemma-lsp", version, protocol_cls=DGemmaProtocol,
                         converter_factory=lambda: self.converter)
        self.engine = engine
        self.documents = DocumentStore()
        self.settings = ServerSettings()
        self.scheduler = LatestWins()
        self.cache = CompletionCache(self.settings.cache_size)
        self.completer = Completer(engine, self.scheduler, self.cache)
        self.crossfile = WorkspaceContext(self.documents)
        self.completer.cross_file = self.crossfile.snippets
        self.editor_definitions = EditorDefinitions(lambda method, params: self.protocol.send_request_async(method, params),
                                                    self.documents.worker.post)
        self.crossfile.editor_found = self.editor_definitions.found
        self.next_edits = NextEditor(engine, self.scheduler)
        self.stats = StatsRecorder()
        self._pending_problems: list[str] = []
        self._last_status: dict[str, Any] | None = None
        self._answers_under_way = 0
        """Inline-completion handlers running now (`answer_first`)."""
        self._held_status: dict[str, Any] | None = None
        """A `dgemma/status` "ready" held back until those handlers have answered."""
        self._load_progress: str | None = None
        self._load_error_shown = False
        self._closing: asyncio.Future | None = None
        self.shutdown_requested = False
        """Set by `shutdown`: the process exits 0 on `exit` only after it (LSP's rule)."""
        self.loop_monitor = LoopMonitor()

    # -- translation helpers -------------------------------------------------------

    @property
    def encoding(self):
        encoding = self.workspace.position_encoding or "utf-16"
        return str(getattr(encoding, "value", encoding))

    def document(self, uri: str) -> OpenDocument:
        try:
            return self.documents.get(uri)
        except UnknownDocumentError as error:
            raise JsonRpcInvalidParams(str(error)) from None

    def offset(self, document: OpenDocument, position: lsp.Position) -> int:
        try:
            return document.offset(position.line, position.character, self.encoding)
        except PositionError as error:
            raise JsonRpcInvalidParams(f"position {position.line}:{position.character}: {error}") from None

    def span(self, document: OpenDocument, range_: lsp.Range) -> tuple[int, int]:
        """A range in str offsets: an end inside a character covers it (server/positions.py)."""
        first, last = range_.start, range_.end
        try:
            start, end = document.span((first.line, first.character), (last.line, last.character), self.encoding)
        except PositionError as error:
            raise JsonRpcInvalidParams(f"range {first.line}:{first.character}-{last.line}:{last.character}: {error}") from None
        if end < start:
            raise JsonRpcInvalidParams("range ends before it starts")
        return start, end

    def to_position(self, lines: LineIndex, offset: int) -> lsp.Position:
        line, character = lines.position(offset, self.encoding)
        return lsp.Position(line=line, character=character)

    def to_range(self, lines: LineIndex, start: int, end: int) -> lsp.Range:
        return lsp.Range(start=self.to_position(lines, start), end=self.to_position(lines, end))

    # -- settings --------------------------------------------------------------------

    @property
    def request_settings(self) -> ServerSettings:
        """The settings a request is prepared with: the user's, the context budget cut to the loaded model's."""
        return self.settings.within_model_context(self.engine.status().context_tokens)

    def apply_settings(self, raw: Any, *, show_problems: bool = True) -> None:
        settings, problems = decode_settings(raw, self.settings)
        if settings != self.settings:
            self.cache.clear()
            self.cache.capacity = settings.cache_size
        if settings.prompt_cache_mb != self.settings.prompt_cache_mb:
            self.engine.set_prompt_cache_budget(settings.prompt_cache_bytes)
        self.settings = settings
        if problems:
            if show_problems:
                self.show_settings_problems(problems)
            else:
                self._pending_problems.extend(problems)

    def show_settings_problems(self, problems: list[str]) -> None:
        names = ", ".join(f"'{name}'" for name in problems)
        message = f"dgemma-lsp: invalid setting {names}; using the default instead."
        log.warning(message)
        self.window_show_message(lsp.ShowMessageParams(type=lsp.MessageType.Warning, message=message))

    # -- status and progress -------------------------------------------------------------

    def on_engine_status(self, status: EngineStatus) -> None:
        if self._load_progress is not None and status.state == "loading" and status.progress is not None:
            self.work_done_progress.report(
                self._load_progress,
                lsp.WorkDoneProgressReport(percentage=int(status.progress * 100), message=status.message or None),
            )
        if self._load_progress is not None and status.state not in ("idle", "loading"):
            token, self._load_progress = self._load_progress, None
            message = "model ready" if status.state != "error" else f"model failed to load: {status.message}"
            self.work_done_progress.end(token, lsp.WorkDoneProgressEnd(message=message))
        if status.state == "error" and not self._load_error_shown:
            self._load_error_shown = True
            self.window_show_message(
                lsp.ShowMessageParams(
                    type=lsp.MessageType.Error, message=f"dgemma-lsp: {status.message or 'model failed to load'}"
                )
            )
        payload = status_payload(status, self.scheduler.in_flight)
        payload.pop("inFlight")
        if self.settings.wants_status and payload != self._last_status:
            if status.state == "ready" and self._answers_under_way:
                self._held_status = payload  # the engine's result is on its way to an answer: that goes first
            else:
                self._held_status = None  # older than this one
                self.protocol.notify(STATUS_NOTIFICATION, payload)
        self._last_status = payload

    def answer_first(self) -> list[Callable[[], None]]:
        """Called by a request handler as it starts: its answer goes out before the bookkeeping.

        The engine reports "ready" in the same breath as the result a waiting completion is
        made from; sent then, that `dgemma/status` would be encoded and written ahead of the
        answer, on the keystroke's path (bench/RESULTS.md, 2026-11-25). So a "ready" is held
        while such handlers run and sent right after the last one's answer (a newer status
        replaces it; every other state goes out at once). The callbacks put in the returned
        list run then too. pygls writes the answer from a done-callback it adds to the
        handler's task before the handler first runs, so the one added here runs after it.
        """
        self._answers_under_way += 1
        after: list[Callable[[], None]] = []
        asyncio.current_task().add_done_callback(lambda _task: self._answered(after))
        return after

    def _answered(self, after: list[Callable[[], None]]) -> None:
        self._answers_under_way -= 1
        for callback in after:
            try:
                callback()
            except Exception:
                log.exception("bookkeeping after an answer failed")
        if self._answers_under_way == 0 and self._held_status is not None:
            payload, self._held_status = self._held_status, None
            if self.settings.wants_status:  # the client may have opted out meanwhile
                self.protocol.notify(STATUS_NOTIFICATION, payload)

    async def start_engine(self) -> None:
        self.engine.on_status(self.on_engine_status)
        await self.engine.start()
        window = self.client_capabilities.window
        if not (window and window.work_done_progress) or self.engine.status().state != "loading":
            return
        token = f"dgemma-load-{uuid.uuid4().hex[:8]}"
        try:
            await self.work_done_progress.create_async(token)
        except Exception as error:  # the client refused: no progress bar, nothing else changes
            log.info("no load progress: %s", error)
            return
        if self.engine.status().state != "loading":
            return
        self._load_progress = token
        self.work_done_progress.begin(
            token,
            lsp.WorkDoneProgressBegin(
                title="DiffusionGemma", message=f"loading model {self.engine.status().model}", cancellable=False,
                percentage=0,
            ),
        )

    async def watch_workspace_files(self) -> None:
        """Ask the client for `workspace/didChangeWatchedFiles` on source files (the index follows the disk)."""
        workspace = self.client_capabilities.workspace
        watched = workspace.did_change_watched_files if workspace else None
        if self.crossfile.index is None or not (watched and watched.dynamic_registration):
            return
        pattern = "**/*.{" + ",".join(sorted(WATCHED_EXTENSIONS)) + "}"
        try:
            await self.client_register_capability_async(lsp.RegistrationParams(registrations=[lsp.Registration(
                id=f"dgemma-watch-{uuid.uuid4().hex[:8]}", method=lsp.WORKSPACE_DID_CHANGE_WATCHED_FILES,
                register_options=lsp.DidChangeWatchedFilesRegistrationOptions(
                    watchers=[lsp.FileSystemWatcher(glob_pattern=pattern)]))]))
        except Exception as error:  # the client refused: the index follows open documents only
            log.info("no file watching: %s", error)

    # -- results -----------------------------------------------------------------------------

    def inline_items(self, lines: LineIndex, cursor: int, result: list[Suggestion] | Superseded):
        if isinstance(result, Superseded):
            return lsp.InlineCompletionList(items=[])
        # Always a range, [cursor, cursor) for a plain insert: the spec makes it optional, but
        # lsp-mode reads it unconditionally (an item without one shows nothing there), and
        # VS Code and Neovim 0.12 treat an empty range as an insert at the cursor.
        # The document's own line ending, never a lone "\r" (server/line_endings.py).
        ending = line_ending(lines.text)
        return lsp.InlineCompletionList(items=[
            lsp.InlineCompletionItem(insert_text=with_line_ending(suggestion.text, ending),
                                     range=self.to_range(lines, suggestion.start, suggestion.end))
            for suggestion in result
        ])

    async def rewrite_edit(self, uri: str, range_: lsp.Range) -> lsp.WorkspaceEdit:
        document = self.document(uri)
        start, end = self.span(document, range_)
        if start == end:
            raise JsonRpcInvalidParams("the selection is empty: select the code to rewrite")
        version, lines = document.version, document.lines
        try:
            text = await self.completer.rewrite(document, start, end, self.request_settings)
        except errors.EngineError as error:
            raise JsonRpcException(f"rewrite failed: {error}", code=REQUEST_FAILED) from None
        if text is None:
            status = self.engine.status()
            raise JsonRpcException(
                f"the model is not available ({status.state}: {status.message})", code=REQUEST_FAILED
            )
        if document.version != version:
            raise JsonRpcException("the document changed while rewriting", code=CONTENT_MODIFIED)
        text = with_line_ending(text, line_ending(lines.text))
        return lsp.WorkspaceEdit(
            changes={uri: [lsp.TextEdit(range=self.to_range(lines, start, end), new_text=text)]}
        )


def status_payload(status: EngineStatus, in_flight: int) -> dict[str, Any]:
    """The `dgemma/status` notification body (and the `dgemma.status` command's result)."""
    return {
        "state": status.state,
        "model": status.model,
        "device": status.device,
        "message": status.message,
        "lastLatencyMs": status.last_latency_ms,
        "promptCacheBytes": status.prompt_cache_bytes,
        "inFlight": in_flight,
        "cancelled": status.cancelled,
    }


def build_server(engine: EngineClient, version: str = "0") -> DGemmaServer:
    server = DGemmaServer(engine, version)

    @server.feature(lsp.INITIALIZE)
    def initialize(ls: DGemmaServer, params: lsp.InitializeParams) -> None:
        # Problems are shown after `initialized`: messages before the initialize answer are discouraged.
        ls.apply_settings(params.initialization_options, show_problems=False)
        folders = params.workspace_folders or []
        ls.crossfile.open_workspace(folders[0].uri if folders else params.root_uri)
        ls.editor_definitions.enabled = client_supports(params.capabilities.experimental)

    @server.feature(lsp.INITIALIZED)
    async def initialized(ls: DGemmaServer, params: lsp.InitializedParams) -> None:
        if ls._pending_problems:
            problems, ls._pending_problems = ls._pending_problems, []
            ls.show_settings_problems(problems)
        asyncio.ensure_future(ls.watch_workspace_files())
        await ls.start_engine()

    @server.feature(lsp.TEXT_DOCUMENT_DID_OPEN)
    def did_open(ls: DGemmaServer, params: lsp.DidOpenTextDocumentParams) -> None:
        item = params.text_document
        ls.documents.open(item.uri, item.language_id, item.version, item.text)
        ls.crossfile.opened(item.uri)

    @server.feature(lsp.TEXT_DOCUMENT_DID_CHANGE)
    def did_change(ls: DGemmaServer, params: lsp.DidChangeTextDocumentParams) -> None:
        changes = []
        for change in params.content_changes:
            if isinstance(change, lsp.TextDocumentContentChangePartial):
                r = change.range
                changes.append(((r.start.line, r.start.character, r.end.line, r.end.character), change.text))
            else:
                changes.append((None, change.text))
        try:
            ls.documents.change(params.text_document.uri, params.text_document.version, changes, ls.encoding)
            ls.next_edits.document_changed(params.text_document.uri)
        except (UnknownDocumentError, PositionError) as error:
            log.error("didChange ignored, client and server disagree: %s", error)
            return
        first = changes[0][0] if changes else None
        ls.crossfile.edited(params.text_document.uri, first[0] if first is not None else 0)

    @server.feature(lsp.TEXT_DOCUMENT_DID_SAVE)
    def did_save(ls: DGemmaServer, params: lsp.DidSaveTextDocumentParams) -> None:
        ls.crossfile.saved(params.text_document.uri)

    @server.feature(lsp.WORKSPACE_DID_CHANGE_WATCHED_FILES)
    def did_change_watched_files(ls: DGemmaServer, params: lsp.DidChangeWatchedFilesParams) -> None:
        kinds = {lsp.FileChangeType.Created: "created", lsp.FileChangeType.Changed: "changed",
                 lsp.FileChangeType.Deleted: "deleted"}
        ls.crossfile.files_changed([(change.uri, kinds.get(change.type, "changed")) for change in params.changes])

    @server.feature(lsp.TEXT_DOCUMENT_DID_CLOSE)
    def did_close(ls: DGemmaServer, params: lsp.DidCloseTextDocumentParams) -> None:
        ls.scheduler.supersede(params.text_document.uri)
        ls.documents.close(params.text_document.uri)
        ls.crossfile.closed(params.text_document.uri)
        ls.editor_definitions.forget(params.text_document.uri)
        ls.completer.last_cross_file.pop(params.text_document.uri, None)
        ls.cache.clear(params.text_document.uri)
        ls.next_edits.document_closed(params.text_document.uri)
        ls.engine.forget(params.text_document.uri)  # its prompt-cache snapshot, in the engine or its daemon

    @server.feature(lsp.WORKSPACE_DID_CHANGE_CONFIGURATION)
    async def did_change_configuration(ls: DGemmaServer, params: lsp.DidChangeConfigurationParams) -> None:
        raw = params.settings
        workspace = ls.client_capabilities.workspace
        if raw is None and workspace and workspace.configuration:  # the pull model
            (raw,) = await ls.workspace_configuration_async(
                lsp.ConfigurationParams(items=[lsp.ConfigurationItem(section=SECTION)])
            )
        ls.apply_settings(raw)

    @server.feature(lsp.TEXT_DOCUMENT_INLINE_COMPLETION, lsp.InlineCompletionOptions())
    async def inline_completion(ls: DGemmaServer, params: lsp.InlineCompletionParams):
        after_answer = ls.answer_first()
        document = ls.document(params.text_document.uri)
        cursor = ls.offset(document, params.position)
        if not ls.settings.enable:
            return lsp.InlineCompletionList(items=[])
        automatic = params.context.trigger_kind == lsp.InlineCompletionTriggerKind.Automatic
        selected = None
        if (info := params.context.selected_completion_info) is not None:
            start, end = ls.span(document, info.range)
            selected = Selected(start, end, info.text)
        on_draft = draft_sink(ls, document, params.position) if ls.settings.drafts else None
        ls.crossfile.viewed(document.uri, params.position.line)
        if ls.editor_definitions.enabled and ls.settings.cross_file_budget > 0:
            # Not awaited: the answer serves this prompt only if it comes first, else the next ones.
            ls.editor_definitions.cursor(document.uri, normalize_language(document.language_id), document.lines,
                                         params.position.line, ls.encoding)
        lines = document.lines  # the answer's positions refer to the text as of this request
        started = time.perf_counter()
        result = await ls.completer.complete(
            document,
            cursor,
            wanted=1 if automatic else ls.settings.max_candidates,
            settings=ls.request_settings,
            selected=selected,
            on_draft=on_draft,
            priority=PRIORITY_TYPING if automatic else PRIORITY_WAITING,
        )
        if not isinstance(result, Superseded) and result:
            latency_ms = (time.perf_counter() - started) * 1000
            after_answer.append(lambda: ls.stats.answered(latency_ms, items=len(result)))
            shown_version = document.version
            after_answer.append(lambda: ls.next_edits.completion_showing(document.uri, shown_version))
        return ls.inline_items(lines, cursor, result)

    @server.feature(
        lsp.TEXT_DOCUMENT_CODE_ACTION,
        lsp.CodeActionOptions(code_action_kinds=[lsp.CodeActionKind.RefactorRewrite], resolve_provider=True),
    )
    def code_action(ls: DGemmaServer, params: lsp.CodeActionParams):
        document = ls.document(params.text_document.uri)
        start, end = ls.span(document, params.range)
        only = params.context.only
        if start == end or (only and not any(lsp.CodeActionKind.RefactorRewrite.startswith(k) for k in only)):
            return []
        title = "Rewrite selection (DiffusionGemma)"
        if _client_resolves_edits(ls.client_capabilities):
            data = {"uri": document.uri, "version": document.version, "range": ls.converter.unstructure(params.range)}
            return [lsp.CodeAction(title=title, kind=lsp.CodeActionKind.RefactorRewrite, data=data)]
        command = lsp.Command(
            title=title, command=REWRITE_COMMAND, arguments=[document.uri, ls.converter.unstructure(params.range)]
        )
        return [lsp.CodeAction(title=title, kind=lsp.CodeActionKind.RefactorRewrite, command=command)]

    @server.feature(lsp.CODE_ACTION_RESOLVE)
    async def code_action_resolve(ls: DGemmaServer, action: lsp.CodeAction) -> lsp.CodeAction:
        if action.data is None:  # e.g. the command form: nothing to resolve, so nothing changes
            return action
        uri, range_, version = _rewrite_data(ls, action.data)
        if version is not None and ls.document(uri).version != version:
            raise JsonRpcException("the document changed since the action was offered", code=CONTENT_MODIFIED)
        action.edit = await ls.rewrite_edit(uri, range_)
        return action

    @server.command(REWRITE_COMMAND)
    async def rewrite_selection(ls: DGemmaServer, *args: Any):
        if len(args) != 2:
            raise JsonRpcInvalidParams(f"{REWRITE_COMMAND} takes (uri, range), got {len(args)} arguments")
        uri, range_, _ = _rewrite_data(ls, {"uri": args[0], "range": args[1]})
        edit = await ls.rewrite_edit(uri, range_)
        applied = await ls.workspace_apply_edit_async(
            lsp.ApplyWorkspaceEditParams(edit=edit, label="Rewrite selection")
        )
        return {"applied": applied.applied, "failureReason": applied.failure_reason}

    @server.command(STATUS_COMMAND)
    def status_command(ls: DGemmaServer, *args: Any):
        return status_payload(ls.engine.status(), ls.scheduler.in_flight)

    @server.command(RELOAD_COMMAND)
    async def reload_model(ls: DGemmaServer, *args: Any):
        # Load again now: after a failed load (the user fixed the folder) or to pick up new files.
        ls._load_error_shown = False  # a new failure is shown again
        status = await ls.engine.reload()
        return status_payload(status, ls.scheduler.in_flight)
    @server.command(CONTEXT_COMMAND)
    def context_snippets(ls: DGemmaServer, *args: Any):
        if len(args) != 1 or not isinstance(args[0], str):
            raise JsonRpcInvalidParams(f"{CONTEXT_COMMAND} takes (uri)")
        return [{"path": s.path, "startLine": s.start_line, "endLine": s.end_line, "source": s.source,
                 "score": s.score, "tokens": s.tokens, "text": s.text}
                for s in ls.completer.last_cross_file.get(args[0], ())]

    @server.command(STATS_COMMAND)
    def server_stats(ls: DGemmaServer, *args: Any):
        options = args[0] if len(args) == 1 else {}
        probe = options.get("probe", False) if isinstance(options, dict) else None
        # What the server retains costs a full garbage collection and a walk of every Python object
        # (~0.3 s of the event loop with the tiny model loaded): only when asked, never while typing.
        with_retained = options.get("retained", False) if isinstance(options, dict) else None
        if len(args) > 1 or not isinstance(probe, bool) or not isinstance(with_retained, bool):
            raise JsonRpcInvalidParams(
                f'{STATS_COMMAND} takes no argument or {{"probe": true|false, "retained": true|false}}')
        started = ls.loop_monitor.running
        if not started:
            ls.loop_monitor.probe = probe
        ls.loop_monitor.start()
        encoded = list(ls.completer.encoded_tokens)
        ls.completer.encoded_tokens.clear()
        index = ls.crossfile.index
        return {"loopStallMs": ls.loop_monitor.take() if started else None,
                "loopBusyMs": ls.loop_monitor.take_busy() if started else None,
                "encodedTokens": encoded, "answersFromDrafts": ls.completer.answers_from_drafts,
                "retained": retained(ls) if with_retained else None,
                "crossFileIndex": None if index is None else {"files": len(index), "complete": index.complete}}

    @server.feature(DID_SHOW)
    def did_show(ls: DGemmaServer, params: Any) -> None:
        # Counted for `dgemma-lsp stats` (lengths only, kept on this machine).
        log.debug("completion shown: %s", _short(params))
        ls.stats.shown(len(_insert_text(params)))

    @server.feature(DID_PARTIALLY_ACCEPT)
    def did_partially_accept(ls: DGemmaServer, params: Any) -> None:
        log.debug("completion partially accepted: %s", _short(params))
        accepted = getattr(params, "acceptedLength", None)
        text = _insert_text(params)
        ls.stats.accepted(accepted if isinstance(accepted, int) and accepted >= 0 else len(text), len(text))

    @server.feature(lsp.SHUTDOWN)
    def shutdown(ls: DGemmaServer, params: None) -> None:
        # Synchronous on purpose: `exit` may follow at once, and must find the shutdown done.
        ls.shutdown_requested = True
        ls.scheduler.cancel_all()
        ls.loop_monitor.stop()
        ls.documents.worker.close()
        ls.stats.close()
        ls.next_edits.scheduler.cancel_all()
        ls._closing = asyncio.ensure_future(ls.engine.close())

    inline_edit_lsp.register(server)
    return server


def retained(ls: DGemmaServer) -> dict[str, int]:
    """What the server holds now (for `bench soak` and the tests that a closed document leaves nothing
    behind but bounded caches): Python objects are counted after a full collection."""
    gc.collect()
    objects = gc.get_objects()
    per_document = (OpenDocument, SyntaxDocument, LineIndex)
    return {
        "documents": len(ls.documents),
        "documentObjects": sum(1 for o in objects if isinstance(o, per_document)),
        "requestFutures": ls.protocol.running_handlers,  # this request's own included
        "cacheEntries": len(ls.cache),
        "schedulerJobs": ls.scheduler.in_flight,
        "promptCacheBytes": ls.engine.status().prompt_cache_bytes or 0,
        "pythonObjects": len(objects),
    }


def draft_sink(ls: DGemmaServer, document: OpenDocument, position: lsp.Position):
    """Sends `dgemma/draft` for one request; the request id ties drafts to their request."""
    uri, version, request_id = document.uri, document.version, ls.protocol.msg_id
    where = {"line": position.line, "character": position.character}
    ending = line_ending(document.text)

    def send(step: int, text: str) -> None:
        text = with_line_ending(text, ending)
        ls.protocol.notify(
            DRAFT_NOTIFICATION,
            {"uri": uri, "version": version, "position": where, "requestId": request_id, "step": step, "text": text},
        )

    return send


def _rewrite_data(ls: DGemmaServer, data: Any) -> tuple[str, lsp.Range, int | None]:
    if not isinstance(data, dict) or not isinstance(data.get("uri"), str):
        raise JsonRpcInvalidParams("expected {uri, range} for the rewrite")
    try:
        range_ = ls.converter.structure(data.get("range"), lsp.Range)
    except Exception:
        raise JsonRpcInvalidParams(f"not an LSP range: {data.get('range')!r}") from None
    version = data.get("version")
    return data["uri"], range_, version if isinstance(version, int) else None


def _client_resolves_edits(capabilities: lsp.ClientCapabilities) -> bool:
    text_document = capabilities.text_document
    code_action = text_document.code_action if text_document else None
    support = code_action.resolve_support if code_action else None
    return bool(support and "edit" in support.properties)


def _insert_text(params: Any) -> str:
    """The shown/accepted item's insertText (a string or a snippet's value); "" when absent."""
    item = getattr(params, "item", None)
    text = getattr(item, "insertText", None)
    text = getattr(text, "value", text)
    return text if isinstance(text, str) else ""


def _short(params: Any) -> str:
    text = repr(params)
    return text if len(text) < 300 else text[:300] + "..."
