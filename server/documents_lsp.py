"""Document sync and the disk: didOpen, didChange (incremental), didSave, didClose,
workspace/didChangeWatchedFiles.

The documents live in documents.py's DocumentStore; the cross-file index (workspace.py), the
next-edit memory, the caches and the engine's prompt cache hear of each change from here. A
change or close the server cannot apply is logged, never an error shown to the user.
"""

from __future__ import annotations

import logging

from lsprotocol import types as lsp

from .documents import UnknownDocumentError
from .lsp_server import DGemmaServer
from .positions import PositionError

log = logging.getLogger(__name__)

FILE_CHANGES = {lsp.FileChangeType.Created: "created", lsp.FileChangeType.Changed: "changed",
                lsp.FileChangeType.Deleted: "deleted"}


def register(server: DGemmaServer) -> None:
    server.feature(lsp.TEXT_DOCUMENT_DID_OPEN)(did_open)
    server.feature(lsp.TEXT_DOCUMENT_DID_CHANGE)(did_change)
    server.feature(lsp.TEXT_DOCUMENT_DID_SAVE)(did_save)
    server.feature(lsp.TEXT_DOCUMENT_DID_CLOSE)(did_close)
    server.feature(lsp.WORKSPACE_DID_CHANGE_WATCHED_FILES)(did_change_watched_files)


def did_open(ls: DGemmaServer, params: lsp.DidOpenTextDocumentParams) -> None:
    item = params.text_document
    ls.documents.open(item.uri, item.language_id, item.version, item.text)
    ls.crossfile.opened(item.uri)


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


def did_save(ls: DGemmaServer, params: lsp.DidSaveTextDocumentParams) -> None:
    ls.crossfile.saved(params.text_document.uri)


def did_close(ls: DGemmaServer, params: lsp.DidCloseTextDocumentParams) -> None:
    uri = params.text_document.uri
    ls.scheduler.supersede(uri)
    ls.documents.close(uri)
    ls.crossfile.closed(uri)
    ls.editor_definitions.forget(uri)
    ls.completer.last_cross_file.pop(uri, None)
    ls.cache.clear(uri)
    ls.next_edits.document_closed(uri)
    ls.engine.forget(uri)  # its prompt-cache snapshot, in the engine or its daemon


def did_change_watched_files(ls: DGemmaServer, params: lsp.DidChangeWatchedFilesParams) -> None:
    ls.crossfile.files_changed([(change.uri, FILE_CHANGES.get(change.type, "changed")) for change in params.changes])
