"""The session's cross-file context: the workspace index kept current, and the sources a prompt draws on.

Owns when the index (engine/crossfile/index.py) is built and updated: the initial walk
runs on the syntax worker a few files at a time, only while the client is quiet (the same
rule as a document's catch-up parse, server/documents.py), so it never competes with a
keystroke; open documents are re-read into it when the client is quiet after a change or
at once on save; `workspace/didChangeWatchedFiles` re-reads or drops files from disk. Every
index access runs on the worker (the index has one owner). Also notes the lines the user
edits and views (the recent-ranges ring) and hands the open documents to the sources, and
adds the editor's definitions (server/editor_definitions.py) to what the sources chose.
Knows URIs, the document store and the engine's crossfile room; knows nothing of pygls.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from urllib.parse import unquote, urlparse

from dgemma_lsp.engine.api import CrossFileSnippet, InfillContext
from dgemma_lsp.engine.crossfile.editor import EditorDefinition, choose
from dgemma_lsp.engine.crossfile.gather import CrossFileSources
from dgemma_lsp.engine.crossfile.index import WorkspaceIndex
from dgemma_lsp.engine.crossfile.neighbours import OpenFile, RecentRanges
from dgemma_lsp.engine.syntax.languages import normalize_language

from .documents import DocumentStore, SyntaxWorker

log = logging.getLogger(__name__)

EDITOR_SHARE = 0.3
"""Of the cross-file budget, kept for the editor's definitions (when it has found any near the cursor)."""
TYPING_S = 1.0
"""A document asked for completions less than this ago is being typed into. The snippets of a
prompt change only with its line (the code outside the cursor's line, which the choice reads); a
new line while typing takes the newest choice ready (made for an earlier line) and the choice for
it is made in the background once the client has been quiet this long, for the next new line to
take (issue 30: choosing took 13-31 ms per Enter in Python, on the keystroke's path). A document
asked for after a pause, or for the first time, is chosen for at once."""


class _BackgroundJob:
    """A job of the syntax worker's background queue, posted at most once at a time (it may post itself
    again while it runs, e.g. to wait behind a request)."""

    def __init__(self, worker: SyntaxWorker, run: Callable[[], None]) -> None:
        self.worker, self.run, self.posted = worker, run, False

    def post(self) -> None:
        if not self.posted:
            self.posted = True
            self.worker.post(self._start, background=True)

    def _start(self) -> None:
        self.posted = False
        self.run()


def uri_to_path(uri: str) -> str | None:
    """The local path of a file:// URI, else None."""
    parsed = urlparse(uri)
    if parsed.scheme != "file":
        return None
    return os.path.abspath(unquote(parsed.path))


class WorkspaceContext:
    """The index of one workspace folder (or none), the recent ranges, and the snippet choice."""

    def __init__(self, documents: DocumentStore) -> None:
        self.documents = documents
        self.worker: SyntaxWorker = documents.worker
        self.recent = RecentRanges()
        self.index: WorkspaceIndex | None = None
        self.sources = CrossFileSources(None, self._open_files, self.recent)
        self._dirty: set[str] = set()
        self._updating = _BackgroundJob(self.worker, self._update_dirty)
        self._building = _BackgroundJob(self.worker, self._build)
        self.editor_found: Callable[[str], list[tuple[str, tuple[EditorDefinition, ...]]]] | None = None
        """The editor's definitions for the names near a document's cursor (server/editor_definitions.py);
        None: a client that does not answer `dgemma/definitions`."""
        self._editor_shown: dict[str, tuple] = {}
        """Per document, the editor's definitions its latest prompt showed (logged when they change)."""
        self._shown_paths: dict[str, str] = {}
        self._real_root = ""
        self._asked_at: dict[str, float] = {}
        """Per document, when its latest prompt was built (the worker's clock): is the user typing?"""
        self._shown: dict[str, tuple[tuple | None, tuple[CrossFileSnippet, ...]]] = {}
        """Per document, the sources' choice its current line shows, by the choice's key (gather.py)."""
        self._to_choose: dict[str, tuple[str, str, InfillContext, int]] = {}
        """Per document, the latest request whose choice was put off until the client is quiet."""
        self._choosing = _BackgroundJob(self.worker, self._choose_when_quiet)
        self._to_warm: set[str] = set()
        """Paths of opened documents whose first choice's one-time work is made ahead (`opened`)."""
        self._warming = _BackgroundJob(self.worker, self._warm_when_quiet)

    # -- event loop side -----------------------------------------------------------------------

    def open_workspace(self, root_uri: str | None) -> None:
        """Start indexing the folder at `root_uri` in the background (None: no workspace, no index)."""
        root = uri_to_path(root_uri) if root_uri else None
        if root is None or not os.path.isdir(root):
            return
        self.index = WorkspaceIndex(root)
        self._real_root = os.path.realpath(root)
        self.sources.index = self.index
        self._building.post()

    def opened(self, uri: str) -> None:
        """A document opened: what its first choice makes once for good (its links, the linked files'
        windows: up to ~0.3 s for a Go package) is made in the background, once the index is built
        and the client is quiet, so that the first completion does not wait for it."""
        path = uri_to_path(uri)
        if path is None or self.index is None:
            return
        self._to_warm.add(path)
        self._warming.post()

    def edited(self, uri: str, line: int) -> None:
        """A change at `line` of an open document: noted as recent; its outline is re-read when quiet."""
        path = uri_to_path(uri)
        if path is None:
            return
        self.recent.note(path, line, "edited")
        self._dirty.add(uri)
        self._updating.post()

    def viewed(self, uri: str, line: int) -> None:
        path = uri_to_path(uri)
        if path is not None:
            self.recent.note(path, line, "viewed")

    def saved(self, uri: str) -> None:
        self._dirty.add(uri)
        self.worker.post(lambda: self._reindex(uri))

    def closed(self, uri: str) -> None:
        path = uri_to_path(uri)
        self._dirty.discard(uri)
        self._editor_shown.pop(uri, None)
        self._asked_at.pop(uri, None)
        self._shown.pop(uri, None)
        self._to_choose.pop(uri, None)
        self._to_warm.discard(path)
        if path is not None and self.index is not None:
            index = self.index
            self.worker.post(lambda: index.update(path))  # back to what is on disk

    def files_changed(self, changes: list[tuple[str, str]]) -> None:
        """`workspace/didChangeWatchedFiles`: (uri, "created" | "changed" | "deleted") each."""
        index = self.index
        if index is None:
            return

        def apply() -> None:
            for uri, kind in changes:
                path = uri_to_path(uri)
                if path is None or uri in self.documents:
                    continue  # an open document's text is the editor's, not the disk's
                if kind == "deleted":
                    index.remove(path)
                    if os.path.isdir(path) is False:
                        for known in [p for p in index.files if p.startswith(path + os.sep)]:
                            index.remove(known)  # a deleted folder
                else:
                    index.update(path)

        self.worker.post(apply)

    # -- worker side ------------------------------------------------------------------------------

    def snippets(self, uri: str, language: str, context: InfillContext, budget: int) -> tuple[CrossFileSnippet, ...]:
        """On the worker: the snippets for a prompt of `uri` (prepare_infill's cross_file provider).

        The editor's definitions, when it found any for the names near the cursor, come after the
        other sources' choice, in what that left of the budget and at least EDITOR_SHARE of it,
        skipping what those already show (engine/crossfile/editor.py)."""
        path = uri_to_path(uri) or uri
        found = self.editor_found(uri) if self.editor_found is not None else []
        if not found:
            return self._sources_choice(uri, path, language, context, budget)
        chosen = self._sources_choice(uri, path, language, context, budget - int(budget * EDITOR_SHARE))
        extra = choose(found, chosen, budget, path, self._shown_path)
        shown = tuple((s.path, s.start_line, s.text.split("\n")[0][:100]) for s in extra)
        if self._editor_shown.get(uri, ()) != shown:  # once per change, not per keystroke
            self._editor_shown[uri] = shown
            log.info("prompts of %s show the editor's definitions: %s", uri,
                     "; ".join(f"{p}:{line + 1} {text!r}" for p, line, text in shown) or "none")
        return chosen + extra

    def _sources_choice(self, uri: str, path: str, language: str, context: InfillContext,
                        budget: int) -> tuple[CrossFileSnippet, ...]:
        """The sources' choice for this prompt: the same for every keystroke of a line; while the user
        types, a new line takes the newest choice made in the background, never one made on its path."""
        now = self.worker.clock()
        typing = now - self._asked_at.get(uri, -TYPING_S) < TYPING_S
        self._asked_at[uri] = now
        if len(self._asked_at) > 4096:
            self._asked_at.clear()
        key = self.sources.key(path, language, context, budget)
        shown = self._shown.get(uri)
        if shown is not None and shown[0] == key:
            return shown[1]
        known = self.sources.known(path, key) if typing else None
        if known is None:
            chosen = self.sources.snippets(path, language, context, budget)
        else:
            chosen, for_this_place = known
            if not for_this_place:
                self._to_choose[uri] = (path, language, context, budget)
                self._choosing.post()
        self._shown[uri] = (key, chosen)
        return chosen

    def _choose_when_quiet(self) -> None:
        """Background: the choices put off while the user typed, made once the client has been quiet
        for TYPING_S (a shorter wait would run them in the gaps of steady typing, and a choice, which
        does not give way midway, would hold up the keystroke after it)."""
        if not self._to_choose:
            return
        if not self.worker.wait_for_quiet(TYPING_S):
            self._choosing.post()
            return
        while self._to_choose and not self.worker.busy:
            _uri, (path, language, context, budget) = self._to_choose.popitem()
            self.sources.snippets(path, language, context, budget)  # memoized: the next new line takes it
        if self._to_choose:
            self._choosing.post()

    def _shown_path(self, path: str) -> str:
        """`path` relative to the workspace folder when inside it, else as given. The editor may name a
        file by its real path while the folder was opened through a symbolic link (memoized: the
        editor's definitions are placed on every keystroke)."""
        if self.index is None:
            return path
        shown = self._shown_paths.get(path)
        if shown is None:
            shown = self.index.relative(path)
            real = os.path.realpath(path)
            if shown == path and self._real_root and real.startswith(self._real_root + os.sep):
                shown = os.path.relpath(real, self._real_root).replace(os.sep, "/")
            if len(self._shown_paths) > 4096:
                self._shown_paths.clear()
            self._shown_paths[path] = shown
        return shown

    def _build(self) -> None:
        index = self.index
        if index is None or index.complete:
            return
        if self.worker.wait_for_quiet() and index.build_step(lambda: self.worker.busy):
            log.info("workspace index: %d files, %d bytes", len(index), index.bytes)
            if self._to_warm:
                self._warming.post()
            return
        self._building.post()  # behind the job that interrupted it

    def _warm_when_quiet(self) -> None:
        index = self.index
        if index is None or not index.complete or not self._to_warm:
            return  # the index's build posts this again when it ends
        if not self.worker.wait_for_quiet():
            self._warming.post()
            return
        while self._to_warm:
            path = next(iter(self._to_warm))
            if not self.sources.warm(path, lambda: self.worker.busy):
                self._warming.post()  # a request came: the rest after it (what was made is kept)
                return
            self._to_warm.discard(path)

    def _update_dirty(self) -> None:
        if not self._dirty:
            return
        if not self.worker.wait_for_quiet():
            self._updating.post()
            return
        for uri in list(self._dirty):
            self._reindex(uri)

    def _reindex(self, uri: str) -> None:
        self._dirty.discard(uri)
        path = uri_to_path(uri)
        if self.index is None or path is None or uri not in self.documents:
            return
        self.index.update(path, self.documents.get(uri).text)

    def _open_files(self) -> list[OpenFile]:
        files = []
        for document in self.documents.all():
            path = uri_to_path(document.uri)
            if path is not None:
                files.append(OpenFile(path, normalize_language(document.language_id), document.text,
                                      document.revision))
        return files
