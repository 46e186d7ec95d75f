"""Next-edit suggestions on the wire: Copilot's `textDocument/copilotInlineEdit` and its companions.

Request `textDocument/copilotInlineEdit`, params TextDocumentPositionParams whose textDocument also
carries `version`; answer `{edits: [{text, textDocument: {uri, version}, range, command}]}` with
at most one edit (Copilot's several edits are alternatives; we offer one). The client shows it,
sends `textDocument/didShowInlineEdit {item: {command}}`, and on acceptance applies `text` over
`range` itself and runs `command` (`dgemma.acceptInlineEdit`, workspace/executeCommand), which
tells the server it was accepted. A dismissal is `dgemma/didRejectInlineEdit {item: {command}}`
(ours: Copilot's protocol has none). `dgemma/didHideCompletion {textDocument: {uri, version}}`
(ours) says the inline completion answered for that version is no longer shown (the user
dismissed it), so it stops blocking next edits there. With drafts on, `dgemma/inlineEditDraft` carries the edit
each denoising step would propose. Advertised as `capabilities.experimental.copilotInlineEdit`.
The policy (versions, memory, filters, debounce) is server/inline_edits.py; this module only
translates. Same shapes as Copilot's so its Neovim and Emacs clients can render ours.
"""

from __future__ import annotations

from typing import Any

from lsprotocol import types as lsp
from pygls.exceptions import JsonRpcInvalidParams

from .line_endings import line_ending, with_line_ending
from .lsp_server import DGemmaServer
from .scheduler import Superseded

INLINE_EDIT = "textDocument/copilotInlineEdit"
DID_SHOW_INLINE_EDIT = "textDocument/didShowInlineEdit"
DID_REJECT_INLINE_EDIT = "dgemma/didRejectInlineEdit"
DID_HIDE_COMPLETION = "dgemma/didHideCompletion"
ACCEPT_COMMAND = "dgemma.acceptInlineEdit"
DRAFT_NOTIFICATION = "dgemma/inlineEditDraft"
CAPABILITY = {
    "copilotInlineEdit": {
        "acceptCommand": ACCEPT_COMMAND,
        "didShow": DID_SHOW_INLINE_EDIT,
        "didReject": DID_REJECT_INLINE_EDIT,
        "didHideCompletion": DID_HIDE_COMPLETION,
        "draft": DRAFT_NOTIFICATION,
    }
}
"""What `initialize` answers under capabilities.experimental."""


def _get(value: Any, name: str) -> Any:
    """A field of an untyped JSON object as pygls hands it over (a namedtuple) or a dict."""
    return value.get(name) if isinstance(value, dict) else getattr(value, name, None)


def request_params(params: Any) -> tuple[str, int | None, lsp.Position]:
    """(uri, version or None, position) of a copilotInlineEdit request; invalid params are an error."""
    document = _get(params, "textDocument")
    uri = _get(document, "uri")
    version = _get(document, "version")
    position = _get(params, "position")
    line, character = _get(position, "line"), _get(position, "character")
    if not isinstance(uri, str) or not all(isinstance(n, int) and n >= 0 for n in (line, character)):
        raise JsonRpcInvalidParams(f"{INLINE_EDIT} takes {{textDocument: {{uri, version}}, position: {{line, character}}}}")
    if version is not None and not isinstance(version, int):
        raise JsonRpcInvalidParams(f"{INLINE_EDIT}: textDocument.version must be an integer")
    return uri, version, lsp.Position(line=line, character=character)


def offer_id(params: Any) -> str | None:
    """The edit id in `{item: {command: {arguments: [id]}}}` (didShow/didReject), or None."""
    command = _get(_get(params, "item"), "command")
    arguments = _get(command, "arguments")
    if isinstance(arguments, (list, tuple)) and arguments and isinstance(arguments[0], str):
        return arguments[0]
    return None


def register(server: DGemmaServer) -> None:
    server.protocol.experimental.update(CAPABILITY)
    server.feature(INLINE_EDIT)(inline_edit)
    server.feature(DID_SHOW_INLINE_EDIT)(did_show_inline_edit)
    server.feature(DID_REJECT_INLINE_EDIT)(did_reject_inline_edit)
    server.feature(DID_HIDE_COMPLETION)(did_hide_completion)
    server.command(ACCEPT_COMMAND)(accept_inline_edit)


async def inline_edit(ls: DGemmaServer, params: Any):
    uri, version, position = request_params(params)
    document = ls.document(uri)
    nothing: dict[str, list] = {"edits": []}
    if not ls.settings.next_edit or (version is not None and version != document.version):
        return nothing  # off, or a stale request: an edit for it would land on the wrong text
    cursor = ls.offset(document, position)
    if ls.next_edits.completion_blocks(uri, document.version):
        return nothing
    lines, asked_version = document.lines, document.version
    ending = line_ending(lines.text)  # the document's own, never a lone "\r" (server/line_endings.py)
    on_draft = None
    if ls.settings.drafts:
        request_id = ls.protocol.msg_id

        def on_draft(step: int, edit) -> None:
            body = None if edit is None else {"range": ls.converter.unstructure(
                ls.to_range(lines, edit.start, edit.end)), "text": with_line_ending(edit.text, ending)}
            ls.protocol.notify(DRAFT_NOTIFICATION, {"uri": uri, "version": asked_version,
                                                    "requestId": request_id, "step": step, "edit": body})

    offer = await ls.next_edits.propose(document, cursor, ls.request_settings, on_draft)
    if offer is None or isinstance(offer, Superseded) or document.version != asked_version:
        return nothing
    command = lsp.Command(title="Accept next edit", command=ACCEPT_COMMAND, arguments=[offer.id])
    return {"edits": [{
        "text": with_line_ending(offer.edit.text, ending),
        "textDocument": {"uri": uri, "version": asked_version},
        "range": ls.converter.unstructure(ls.to_range(lines, offer.edit.start, offer.edit.end)),
        "command": ls.converter.unstructure(command),
    }]}


def did_show_inline_edit(ls: DGemmaServer, params: Any) -> None:
    if (found := offer_id(params)) is not None:
        ls.next_edits.shown(found)


def did_reject_inline_edit(ls: DGemmaServer, params: Any) -> None:
    if (found := offer_id(params)) is not None:
        ls.next_edits.rejected(found)


def did_hide_completion(ls: DGemmaServer, params: Any) -> None:
    document = _get(params, "textDocument")
    uri, version = _get(document, "uri"), _get(document, "version")
    if isinstance(uri, str) and isinstance(version, int):
        ls.next_edits.completion_hidden(uri, version)


def accept_inline_edit(ls: DGemmaServer, *args: Any):
    if len(args) != 1 or not isinstance(args[0], str):
        raise JsonRpcInvalidParams(f"{ACCEPT_COMMAND} takes the edit's id")
    return {"accepted": ls.next_edits.accepted(args[0])}
