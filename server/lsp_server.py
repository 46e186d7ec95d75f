"""The language server's state: the pygls `LanguageServer` subclass and what its handlers share.

One session's documents, settings, scheduler, caches and engine client, the LSP <-> str-offset
translation every handler needs, the engine's status and load progress sent to the client, and
the answers built from results (inline items, the rewrite's edit). The handlers themselves are
the `*_lsp.py` modules, one per feature, each with a `register(server)`; `serve.build_server`
puts them together. Bad input is a JSON-RPC error (`JsonRpcInvalidParams`), and the server keeps
serving. lsprotocol types stop in server/; pygls' internals stay in pygls_protocol.py.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable
from typing import Any

from lsprotocol import types as lsp
from pygls.exceptions import JsonRpcException, JsonRpcInvalidParams
from pygls.lsp.server import LanguageServer

from dgemma_lsp.engine import errors
from dgemma_lsp.engine.api import EngineStatus
from dgemma_lsp.engine.client import EngineClient

from .completions import Completer, Suggestion
from .documents import DocumentStore, OpenDocument, UnknownDocumentError
from .editor_definitions import EditorDefinitions
from .inline_edits import NextEditor
from .line_endings import line_ending, with_line_ending
from .loop_monitor import LoopMonitor
from .positions import LineIndex, PositionError
from .pygls_protocol import DGemmaProtocol
from .scheduler import CompletionCache, LatestWins, Superseded
from .settings import ServerSettings, decode_settings
from .stats import StatsRecorder
from .workspace import WorkspaceContext

log = logging.getLogger(__name__)

WATCHED_EXTENSIONS = ("py", "pyi", "js", "mjs", "cjs", "jsx", "ts", "mts", "cts", "tsx", "go", "rs", "c", "h",
                      "cc", "cpp", "cxx", "hpp", "hh", "java", "lua")
"""Files whose changes on disk the index wants to hear of (engine/syntax/languages.py's extensions)."""
STATUS_NOTIFICATION = "dgemma/status"
REQUEST_FAILED = int(lsp.LSPErrorCodes.RequestFailed)
CONTENT_MODIFIED = int(lsp.LSPErrorCodes.ContentModified)


class DGemmaServer(LanguageServer):
    """Holds the session state; the handlers (`*_lsp.py`) are registered by `serve.build_server`."""

    protocol: DGemmaProtocol

    def __init__(self, engine: EngineClient, version: str = "0") -> None:
        super().__init__("dgemma-lsp", version, protocol_cls=DGemmaProtocol)
        self.engine = engine
        self.documents = DocumentStore()
        self.protocol.on_message = self.documents.worker.client_spoke  # background syntax work yields to it
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

    @property
    def converter(self):
        """The cattrs converter pygls (un)structures messages with."""
        return self.protocol.converter

    def report_server_error(self, error: Exception, source) -> None:
        # A body that is not JSON is the client's error: answered, never shown to the user.
        if not self.protocol.answered_parse_error(error):
            super().report_server_error(error, source)

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

    def show_pending_problems(self) -> None:
        """The settings problems found at initialize, shown now (after `initialized`)."""
        if self._pending_problems:
            problems, self._pending_problems = self._pending_problems, []
            self.show_settings_problems(problems)

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
        answer, on the keystroke's path (one notification's encode and write, ~0.05–0.1 ms;
        tests/server/test_answer_first.py holds the order). So a "ready" is held
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

    async def reload_engine(self) -> EngineStatus:
        """Load the model again: after a failed load (the user fixed the folder) or to pick up new files."""
        self._load_error_shown = False  # a new failure is shown again
        return await self.engine.reload()

    def close(self) -> None:
        """What `shutdown` stops. Synchronous: `exit` may follow at once and must find it done."""
        self.shutdown_requested = True
        self.scheduler.cancel_all()
        self.loop_monitor.stop()
        self.documents.worker.close()
        self.stats.close()
        self.next_edits.scheduler.cancel_all()
        self._closing = asyncio.ensure_future(self.engine.close())

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

