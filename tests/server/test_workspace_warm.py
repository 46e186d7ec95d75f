"""The first choice's one-time work, made ahead: a Go file opens in a real package on disk, and the
server's workspace context (server/workspace.py, with its real syntax worker) makes the windows of
the package's other files in the background, once its index is built and the client is quiet, before
any completion asks (the first choice for a Go package made them on the completion's path: up to
~0.3 s). A file closed before that costs nothing."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from dgemma_lsp.server.documents import DocumentStore
from dgemma_lsp.server.workspace import WorkspaceContext

SIBLINGS = {
    "client.go": "package web\n\nfunc Fetch(url string) string {\n\treturn url\n}\n",
    "cache.go": "package web\n\ntype Cache struct {\n\tsize int\n}\n\nfunc (c *Cache) Get(key string) string {\n\treturn key\n}\n",
    "retry.go": "package web\n\nfunc retry(times int) int {\n\treturn times\n}\n",
}
SERVE = "package web\n\nfunc Serve(c *Cache) {\n\tc.Get(Fetch(\"x\"))\n}\n"


def _workspace(tmp_path: Path) -> Path:
    (tmp_path / "go.mod").write_text("module example.com/m\n")
    (tmp_path / "web").mkdir()
    for name, text in {**SIBLINGS, "serve.go": SERVE}.items():
        (tmp_path / "web" / name).write_text(text)
    return tmp_path / "web" / "serve.go"


def _until(condition, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_opening_a_file_makes_its_packages_windows_in_the_background(tmp_path):
    serve = _workspace(tmp_path)
    documents = DocumentStore()
    context = WorkspaceContext(documents)
    windows = context.sources.file_windows
    siblings = [str(tmp_path / "web" / name) for name in SIBLINGS]
    try:
        context.open_workspace(tmp_path.as_uri())
        documents.open(serve.as_uri(), "go", 1, SERVE)
        context.opened(serve.as_uri())  # as the server's didOpen does
        assert _until(lambda: all(path in windows for path in siblings)), [p for p in siblings if p not in windows]
        assert str(serve) not in windows  # never the file itself
    finally:
        documents.worker.close()


def test_a_file_closed_before_the_index_is_built_is_not_warmed(tmp_path):
    serve = _workspace(tmp_path)
    documents = DocumentStore()
    context = WorkspaceContext(documents)
    try:
        busy = threading.Event()
        documents.worker.post(lambda: busy.wait(60))  # the build waits behind a busy worker
        context.open_workspace(tmp_path.as_uri())
        documents.open(serve.as_uri(), "go", 1, SERVE)
        context.opened(serve.as_uri())
        documents.close(serve.as_uri())
        context.closed(serve.as_uri())
        busy.set()
        assert _until(lambda: context.index is not None and context.index.complete)
        # The worker settles only once nothing is queued: a warm-up the build posted would have run.
        assert documents.worker.settled.wait(60), "the syntax worker never settled"
        assert not any(str(tmp_path / "web" / name) in context.sources.file_windows for name in SIBLINGS)
    finally:
        documents.worker.close()
