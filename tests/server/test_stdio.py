"""When the server reads stdin on the event loop (server/stdio.py) and when it keeps pygls' threaded reader.

The LSP tests all run the server over pipes, so the native reader is what they exercise;
these pin down the cases where it must not be used.
"""

from __future__ import annotations

import os
import socket
import tempfile

from dgemma_lsp.server.stdio import native_stdin_possible


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
