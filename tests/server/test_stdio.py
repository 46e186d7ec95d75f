"""When the server reads stdin on the event loop (server/stdio.py) and when it keeps pygls' threaded reader.

The LSP tests all run the server over pipes, so the native reader is what they exercise;
these pin down the cases where it must not be used.
"""

from __future__ import annotations

import asyncio
import os
import socket
import tempfile

from dgemma_lsp.server.stdio import native_stdin_possible, stdin_reader


def test_separate_pipes_read_natively():
    stdin_read, stdin_write = os.pipe()
    stdout_read, stdout_write = os.pipe()
    try:
        assert native_stdin_possible(stdin_read, stdout_write)
    finally:
        for fd in (stdin_read, stdin_write, stdout_read, stdout_write):
            os.close(fd)


def test_one_socket_for_both_directions_keeps_the_threaded_reader():
    # Making stdin non-blocking would make stdout non-blocking too: writes could fail with EAGAIN.
    ours, theirs = socket.socketpair()
    try:
        assert not native_stdin_possible(theirs.fileno(), theirs.fileno())
    finally:
        ours.close()
        theirs.close()


def test_a_regular_file_keeps_the_threaded_reader():
    stdout_read, stdout_write = os.pipe()
    with tempfile.TemporaryFile() as file:
        try:
            assert not native_stdin_possible(file.fileno(), stdout_write)
        finally:
            os.close(stdout_read)
            os.close(stdout_write)


def test_a_closed_descriptor_keeps_the_threaded_reader():
    read, write = os.pipe()
    os.close(read)
    os.close(write)
    assert not native_stdin_possible(read, write)


async def test_a_terminal_is_read_on_the_loop_through_its_own_file_and_stdout_stays_blocking():
    # `dgemma-lsp` typed in a terminal: stdin and stdout are one terminal. No thread may sit in
    # a read of it (Ctrl-C could not end that read), and stdout must stay blocking.
    master, slave = os.openpty()
    terminal = os.fdopen(slave, "r+b", buffering=0)
    try:
        reader = await stdin_reader(terminal, terminal, server=None)  # no thread pool is asked for
        assert isinstance(reader, asyncio.StreamReader)
        assert os.get_blocking(slave)
        os.write(master, b"typed\n")
        assert await asyncio.wait_for(reader.readline(), 60) == b"typed\n"
    finally:
        terminal.close()
        os.close(master)
