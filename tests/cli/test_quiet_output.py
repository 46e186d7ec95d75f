"""The CLI and the language server print only what was asked for.

Real processes on the tiny model, with the interpreter's default warning filters (no
PYTHONWARNINGS) and stderr a pipe, as an editor or a script sees it: no library warning
(transformers' FutureWarnings about `past_key_values`), no progress bar ("Writing model
shards" while the tiny model is built, the load bar), and a reader that closes the pipe
early (`| head -c1`) ends the command quietly, as SIGPIPE would.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIB = ROOT / "examples" / "fib.py"


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    """A fresh cache for this module: the first command builds (and saves) the tiny model in it."""
    return tmp_path_factory.mktemp("cache")


def environment(cache: Path) -> dict[str, str]:
    env = {name: value for name, value in os.environ.items() if name != "PYTHONWARNINGS"}
    env["DGEMMA_LSP_CACHE"] = str(cache)
    return env


def noise(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines()
            if "Warning" in line or "%|" in line or "Traceback" in line or "shards" in line]


def test_complete_prints_the_answer_and_nothing_on_stderr(cache: Path):
    done = subprocess.run(
        [sys.executable, "-m", "dgemma_lsp.server.cli", "complete", f"{FIB}:8:12", "--model", "tiny-random",
         "--steps", "2", "--seed", "1"],
        capture_output=True, text=True, timeout=600, env=environment(cache),
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout
    assert noise(done.stderr) == [] and done.stderr == ""


def test_a_reader_that_leaves_early_ends_the_command_quietly(cache: Path):
    read, write = os.pipe()
    os.close(read)  # `| head -c1` that has already gone: every write fails with EPIPE
    try:
        done = subprocess.run(
            [sys.executable, "-m", "dgemma_lsp.server.cli", "complete", f"{FIB}:8:12", "--model", "tiny-random",
             "--steps", "2", "--seed", "1", "--json"],
            stdout=write, stderr=subprocess.PIPE, text=True, timeout=600, env=environment(cache),
        )
    finally:
        os.close(write)
    assert done.stderr == ""
    assert done.returncode == 141  # what a shell reports for a command ended by SIGPIPE


def frame(message: dict) -> bytes:
    body = json.dumps(message).encode()
    return b"Content-Length: %d\r\n\r\n" % len(body) + body


def test_the_language_server_writes_no_warning_or_bar_to_stderr(cache: Path):
    """A whole session (initialize, open, an inline completion, shutdown, exit) in one write:
    the server answers in order and exits; its stderr is what Neovim would log as [ERROR]."""
    uri = FIB.as_uri()
    session = b"".join(frame(m) for m in [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize",
         "params": {"processId": None, "rootUri": None, "capabilities": {},
                    "initializationOptions": {"steps": 2, "maxTokens": 16, "seed": 1, "debounceMs": 0}}},
        {"jsonrpc": "2.0", "method": "initialized", "params": {}},
        {"jsonrpc": "2.0", "method": "textDocument/didOpen", "params": {"textDocument": {
            "uri": uri, "languageId": "python", "version": 1, "text": FIB.read_text()}}},
        {"jsonrpc": "2.0", "id": 2, "method": "textDocument/inlineCompletion", "params": {
            "textDocument": {"uri": uri}, "position": {"line": 7, "character": 11}, "context": {"triggerKind": 1}}},
    ])
    server = subprocess.Popen(
        [sys.executable, "-m", "dgemma_lsp.server.cli", "--stdio", "--model", "tiny-random", "--engine", "inprocess"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=environment(cache),
    )
    server.stdin.write(session)
    server.stdin.flush()
    answered = b""
    while b'"id": 2' not in answered and b'"id":2' not in answered:  # the completion's answer
        chunk = server.stdout.read1(65536)
        assert chunk, "the server closed stdout before answering"
        answered += chunk
    server.stdin.write(frame({"jsonrpc": "2.0", "id": 3, "method": "shutdown"})
                       + frame({"jsonrpc": "2.0", "method": "exit"}))
    server.stdin.close()
    server.stdout.read()
    stderr = server.stderr.read().decode()
    assert server.wait(timeout=120) == 0, stderr
    assert noise(stderr) == [], stderr
