""""Rewrite selection" on the wire: textDocument/codeAction (kind `refactor.rewrite`),
codeAction/resolve, and the `dgemma.rewriteSelection` command for clients that cannot resolve
an action's edit (the server then asks the client to apply it: workspace/applyEdit).

The edit itself is `DGemmaServer.rewrite_edit`; the server never writes a file.
"""

from __future__ import annotations

from typing import Any

from lsprotocol import types as lsp
from pygls.exceptions import JsonRpcException, JsonRpcInvalidParams

from .lsp_server import CONTENT_MODIFIED, DGemmaServer

REWRITE_COMMAND = "dgemma.rewriteSelection"
TITLE = "Rewrite selection (DiffusionGemma)"


def register(server: DGemmaServer) -> None:
    server.feature(
        lsp.TEXT_DOCUMENT_CODE_ACTION,
        lsp.CodeActionOptions(code_action_kinds=[lsp.CodeActionKind.RefactorRewrite], resolve_provider=True),
    )(code_action)
    server.feature(lsp.CODE_ACTION_RESOLVE)(code_action_resolve)
    server.command(REWRITE_COMMAND)(rewrite_selection)


def code_action(ls: DGemmaServer, params: lsp.CodeActionParams):
    document = ls.document(params.text_document.uri)
    start, end = ls.span(document, params.range)
    only = params.context.only
    if start == end or (only and not any(lsp.CodeActionKind.RefactorRewrite.startswith(k) for k in only)):
        return []
    if _client_resolves_edits(ls.client_capabilities):
        data = {"uri": document.uri, "version": document.version, "range": ls.converter.unstructure(params.range)}
        return [lsp.CodeAction(title=TITLE, kind=lsp.CodeActionKind.RefactorRewrite, data=data)]
    command = lsp.Command(
        title=TITLE, command=REWRITE_COMMAND, arguments=[document.uri, ls.converter.unstructure(params.range)]
    )
    return [lsp.CodeAction(title=TITLE, kind=lsp.CodeActionKind.RefactorRewrite, command=command)]


async def code_action_resolve(ls: DGemmaServer, action: lsp.CodeAction) -> lsp.CodeAction:
    if action.data is None:  # e.g. the command form: nothing to resolve, so nothing changes
        return action
    uri, range_, version = _rewrite_data(ls, action.data)
    if version is not None and ls.document(uri).version != version:
        raise JsonRpcException("the document changed since the action was offered", code=CONTENT_MODIFIED)
    action.edit = await ls.rewrite_edit(uri, range_)
    return action


async def rewrite_selection(ls: DGemmaServer, *args: Any):
    if len(args) != 2:
        raise JsonRpcInvalidParams(f"{REWRITE_COMMAND} takes (uri, range), got {len(args)} arguments")
    uri, range_, _ = _rewrite_data(ls, {"uri": args[0], "range": args[1]})
    edit = await ls.rewrite_edit(uri, range_)
    applied = await ls.workspace_apply_edit_async(lsp.ApplyWorkspaceEditParams(edit=edit, label="Rewrite selection"))
    return {"applied": applied.applied, "failureReason": applied.failure_reason}


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
