"""The one module that reaches into pygls past its public API: the protocol the server runs on.

pygls 2.1 offers no public way to do what these do, so each overrides or calls a private
member of its `JsonRPCProtocol` (PRIVATE_SURFACE lists them with the parameters this module
was written against; tests/server/test_pygls_surface.py fails the day an installed pygls
differs, and fails if another module of server/ touches them):

- a request whose params do not decode is answered -32602 (pygls logs a traceback and never
  answers: the editor waits forever) through `_send_response`;
- a body that is not JSON is answered -32700 with id null, as JSON-RPC says (pygls' message
  loop logs a traceback and the server shows the user "Error in server") through `_send_data`:
  `_send_response` leaves out an id of None;
- an error a handler raises on purpose (a JsonRpcException other than an internal error: an
  unknown document, a position outside it, a changed document) is one INFO line, not an ERROR
  record with a traceback, by overriding `_send_handler_result`; other errors keep pygls' way;
- the futures of finished notifications are forgotten (`_handle_notification`,
  `_request_futures`): pygls 2.1 keeps one per didOpen/didChange/didClose for the session;
- pygls' built-in document sync (the `lsp_text_document__did_*` built-ins) only hands over to
  our handlers: it would keep a second copy of every document, and raise on a change or close
  for a document it does not hold.

pyproject.toml pins pygls below the next minor release for this module: a new release is taken
once the surface test passes with it. Knows nothing of our features: the server hands in the
`experimental` capabilities and an `on_message` hook.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable
from typing import Any

import cattrs
from lsprotocol import types as lsp
from pygls.exceptions import JsonRpcException, JsonRpcInternalError, JsonRpcInvalidParams, JsonRpcParseError
from pygls.protocol import LanguageServerProtocol
from pygls.protocol.language_server import lsp_method

log = logging.getLogger(__name__)

PRIVATE_SURFACE: dict[str, tuple[str, ...]] = {
    "_send_response": ("msg_id", "result", "error"),
    "_send_data": ("data",),
    "_send_handler_result": ("future", "*msg_id"),
    "_handle_notification": ("method_name", "params"),
}
"""pygls' private methods used here, with their parameters after `self` (`*name`: keyword-only)."""
PRIVATE_STATE = ("_request_futures",)
"""pygls' private attributes used here: {message id: future} of running handlers."""
REPLACED_BUILTINS = {
    "lsp_initialize": lsp.INITIALIZE,
    "lsp_text_document__did_open": lsp.TEXT_DOCUMENT_DID_OPEN,
    "lsp_text_document__did_change": lsp.TEXT_DOCUMENT_DID_CHANGE,
    "lsp_text_document__did_close": lsp.TEXT_DOCUMENT_DID_CLOSE,
}
"""pygls' built-in handlers this protocol replaces, by name (an override must keep the name)."""
PARSE_ERRORS = (json.JSONDecodeError, UnicodeDecodeError)
"""What pygls' message loop raises for a body that is not JSON (or not UTF-8)."""


class _Answered:
    """A message whose params failed to decode and that was already answered (or dropped)."""


_ANSWERED = _Answered()


class DGemmaProtocol(LanguageServerProtocol):
    """pygls' protocol, with the answers and the bookkeeping the module docstring lists."""

    def __init__(self, server, converter: cattrs.Converter) -> None:
        self.converter = converter
        """The converter pygls structures messages with (our public handle on it)."""
        self.experimental: dict[str, Any] = {}
        """Added to `capabilities.experimental` of the initialize answer."""
        self.on_message: Callable[[], None] = lambda: None
        """Called first for every message from the client."""
        self._finished_notifications: list = []
        super().__init__(server, converter)

    # -- answers pygls does not give -------------------------------------------------

    def structure_message(self, data: dict[str, Any]):
        # Requests and notifications of LSP methods are structured here: pygls would log a
        # traceback for params that do not decode, and leave a request unanswered.
        method = data.get("method") if "jsonrpc" in data and "error" not in data else None
        message_type = self.get_message_type(method) if isinstance(method, str) else None
        if message_type is None:  # a response, a nested object, a method of our own
            return super().structure_message(data)
        try:
            return self.converter.structure(data, message_type)
        except Exception as error:  # cattrs' ClassValidationError and the like: the params are wrong
            detail = _decode_problem(error)
        if "id" in data:
            log.info("%s (id %s) answered Invalid params: %s", method, data["id"], detail)
            self._send_response(data["id"], error=lsp.ResponseError(
                code=JsonRpcInvalidParams.CODE, message=f"invalid params for {method}: {detail}"))
        else:
            log.warning("ignoring %s with invalid params: %s", method, detail)
        return _ANSWERED

    def answered_parse_error(self, error: BaseException) -> bool:
        """Answer -32700 (id null) when `error` is a body that is not JSON; whether it was."""
        if not isinstance(error, PARSE_ERRORS):
            return False
        log.warning("a message that is not JSON, answered Parse error: %s", error)
        answer = JsonRpcParseError(f"Parse error: {error}").to_response_error()
        self._send_data({"jsonrpc": self.VERSION, "id": None, "error": self.converter.unstructure(answer)})
        return True

    def _send_handler_result(self, future, *, msg_id):
        error = None if future.cancelled() else future.exception()
        if isinstance(error, JsonRpcException) and error.code != JsonRpcInternalError.CODE:
            # Raised on purpose to answer the client: nothing broke, so no traceback.
            self._request_futures.pop(msg_id, None)
            log.info("request %s answered %s: %s", msg_id, error.code, error.message)
            self._send_response(msg_id, error=error.to_response_error())
            return
        super()._send_handler_result(future, msg_id=msg_id)

    def handle_message(self, message):
        self.on_message()
        if message is _ANSWERED:
            return
        super().handle_message(message)

    @lsp_method(lsp.INITIALIZE)
    def lsp_initialize(self, params: lsp.InitializeParams):
        result = yield from super().lsp_initialize(params)
        # Capabilities that are no LSP feature are announced where experimental ones go.
        result.capabilities.experimental = {**(result.capabilities.experimental or {}), **self.experimental}
        return result

    # -- finished notifications ------------------------------------------------------------

    def _handle_notification(self, method_name: str, params: Any):
        """pygls 2.1 files the future of a notification run through a generator handler (didOpen,
        didChange, didClose: every one) in `_request_futures` under a made-up id, and only a
        response ever removes an entry there: five futures per document edited, kept for the
        session (the soak's RSS growth, issue 32). Whatever a notification filed goes once done,
        at the next notification: a done callback only notes the key, because pygls iterates that
        table when it cancels everything at `exit` (a pop from there broke the exit handshake)."""
        futures = self._request_futures
        self._drop_finished_notifications()
        filed = len(futures)
        super()._handle_notification(method_name, params)
        if len(futures) == filed:
            return  # nothing filed (a plain handler): the keystroke path stays a length check
        finished = self._finished_notifications
        for key in list(futures)[filed:]:  # dicts keep insertion order: what this call filed
            futures[key].add_done_callback(lambda _future, key=key: finished.append(key))

    def _drop_finished_notifications(self) -> None:
        finished = self._finished_notifications
        while finished:
            self._request_futures.pop(finished.pop(), None)

    def running_handlers(self) -> int:
        """Entries in pygls' table of running handlers (for `dgemma.serverStats`' `retained`)."""
        self._drop_finished_notifications()
        return len(self._request_futures)

    # -- document sync ---------------------------------------------------------------------
    # Open documents live in DocumentStore, each with its syntax tree. pygls' built-in sync
    # would keep a second copy in its Workspace, applying every keystroke twice, and raises
    # KeyError (shown to the user as "Error in server") on a change or close for a document
    # it does not hold. These overrides only hand the notification to our handlers.

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


class MessageLoopLog(logging.LoggerAdapter):
    """The logger to hand pygls' message loop (`pygls.io_.run_async`): it logs a traceback for a
    body that is not JSON before it calls the server's error handler, which answers it and logs
    one line (`DGemmaProtocol.answered_parse_error`); that traceback is left out here."""

    def exception(self, msg, *args, **kwargs) -> None:
        if isinstance(sys.exc_info()[1], PARSE_ERRORS):
            return
        super().exception(msg, *args, **kwargs)


def _decode_problem(error: BaseException) -> str:
    if isinstance(error, cattrs.ClassValidationError):
        return "; ".join(cattrs.transform_error(error, path="params")).replace("$.", "")
    return str(error)
