"""The language server on stdin/stdout, reading stdin with asyncio's own pipe transport.

pygls 2.1's `start_io` reads stdin through `loop.run_in_executor(readline)`: every
header line and every body is a round trip through a thread pool, three thread hops
per message, each of which waits for the GIL while the syntax worker parses. Per
keystroke (a didChange and an inline completion request) that was ~0.8 ms before the
request even reached its handler. Here stdin is an `asyncio.StreamReader` on the
event loop (no thread), handed to pygls' own public message loop (`run_async`), so
framing, decoding and dispatch stay pygls'.

The native reader needs stdin to be a pipe or a socket that is not also stdout:
connecting a transport makes the file non-blocking, and a socket or pty shared with
stdout would then fail writes with EAGAIN. A terminal is read natively through a file
description of its own (so Ctrl-C finds no thread blocked in a read). Anything else (a
regular file, Windows' console) falls back to pygls' threaded reader. Knows pygls' I/O
surface; nothing of LSP features.
"""

from __future__ import annotations

import asyncio
import logging
import os
import stat
import sys
import threading

from pygls.io_ import StdinAsyncReader, StdoutWriter, run_async

from .loop_monitor import TimedEventLoop
from .pygls_protocol import MessageLoopLog

log = logging.getLogger(__name__)

SERVING = "serving LSP on stdin/stdout"
"""Logged (INFO) once the message loop starts: a test waits for it before pressing Ctrl-C."""
READ_LIMIT = 1 << 20
"""Longest header line asyncio's reader accepts (bodies are read with readexactly, unbounded)."""


def native_stdin_possible(stdin_fd: int, stdout_fd: int) -> bool:
    """Whether stdin can get an asyncio pipe transport without touching stdout's blocking mode."""
    try:
        stdin_stat, stdout_stat = os.fstat(stdin_fd), os.fstat(stdout_fd)
    except OSError:
        return False
    if not (stat.S_ISFIFO(stdin_stat.st_mode) or stat.S_ISSOCK(stdin_stat.st_mode)):
        return False
    return (stdin_stat.st_dev, stdin_stat.st_ino) != (stdout_stat.st_dev, stdout_stat.st_ino)


async def _native_reader(stdin) -> asyncio.StreamReader | None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=READ_LIMIT)
    try:
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), stdin)
    except (OSError, ValueError, NotImplementedError) as error:  # e.g. Windows' selector loop
        log.info("stdin through pygls' threaded reader: %s", error)
        return None
    return reader


async def stdin_reader(stdin, stdout, server):
    """stdin on the event loop where possible; else pygls' threaded reader."""
    reader = None
    if native_stdin_possible(stdin.fileno(), stdout.fileno()):
        reader = await _native_reader(stdin)
    elif (terminal := _own_terminal(stdin.fileno())) is not None:
        reader = await _native_reader(terminal)
    return reader or StdinAsyncReader(stdin, server.thread_pool)


def _own_terminal(fd: int):
    """A read-only file of its own on the terminal at `fd`, or None when `fd` is no terminal.

    A terminal is one file description for stdin and stdout, so a transport on it would make
    stdout non-blocking too; a second description of the same terminal leaves stdout alone. And
    no thread then sits in a read of the terminal that Ctrl-C cannot end (that thread kept the
    process alive after Ctrl-C, and a second Ctrl-C aborted the interpreter)."""
    try:
        if not os.isatty(fd):
            return None
        return os.fdopen(os.open(os.ttyname(fd), os.O_RDONLY | os.O_NOCTTY), "rb", buffering=0)
    except OSError as error:
        log.info("stdin through pygls' threaded reader: %s", error)
        return None


def serve_stdio(server, stdin=None, stdout=None) -> None:
    """What pygls' `start_io` does, with stdin read on the event loop where possible.

    Ctrl-C ends it: the KeyboardInterrupt goes on to the caller (cli.py says so and exits 130)."""
    stdin = stdin or sys.stdin.buffer
    stdout = stdout or sys.stdout.buffer
    stop = threading.Event()  # run_async's; nothing sets it: the loop ends with stdin, `exit` or Ctrl-C
    server.protocol.set_writer(StdoutWriter(stdout))

    async def main() -> None:
        reader = await stdin_reader(stdin, stdout, server)
        log.info(SERVING)
        try:
            await run_async(stop_event=stop, reader=reader, protocol=server.protocol,
                            logger=MessageLoopLog(log, {}), error_handler=server.report_server_error)
        except asyncio.IncompleteReadError:  # stdin closed in the middle of a message: the client is gone
            log.error("stdin closed in the middle of a message; shutting down")

    # On a loop whose passes the loop monitor can time (Windows keeps its default proactor loop).
    loop_factory = None if sys.platform == "win32" else TimedEventLoop
    try:
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            runner.run(main())
    except BrokenPipeError:
        log.error("the connection to the client is lost; shutting down")
    except SystemExit:  # `exit`: serve.py turns shutdown-or-not into the status
        pass
    finally:
        server.shutdown()
