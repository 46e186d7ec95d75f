"""A lean LSP client over a subprocess's stdio, for timing the server and nothing else.

`bench latency` times what happens between a keystroke and its answer. With pygls'
client in the benchmark process, every message the server sends (one answer, two
status notifications, a draft per denoising step) was also turned into lsprotocol
classes by cattrs in the timed window, and that client work ran on the same two cores
as the server it measures. An editor parses JSON natively (VS Code in V8, Neovim with
its C decoder), so that cost is neither the server's nor the editor's. This client only
frames messages and decodes them with msgspec into plain dicts: what it adds to a
measurement is close to what a real editor adds.

It answers server-to-client requests with `null` (the benchmark declares no capability
that would make the server need more). Knows JSON-RPC framing; knows no LSP types.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from typing import Any

import msgspec

Handler = Callable[[Any], None]


class ResponseError(Exception):
    """The server answered a request with a JSON-RPC error."""


class JsonRpcClient:
    """One language-server subprocess: requests, notifications and notification handlers."""

    def __init__(self) -> None:
        self._process: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task | None = None
        self._pending: dict[int, asyncio.Future] = {}
        self._ids = itertools.count(1)
        self._handlers: dict[str, Handler] = {}
        self._encoder = msgspec.json.Encoder()
        self._decoder = msgspec.json.Decoder()

    def on(self, method: str, handler: Handler) -> None:
        """Call `handler(params)` for every notification `method` the server sends."""
        self._handlers[method] = handler

    @property
    def pid(self) -> int:
        """The server's process id."""
        assert self._process is not None, "the server is not started"
        return self._process.pid

    async def start(self, *command: str, stderr=asyncio.subprocess.DEVNULL) -> None:
        self._process = await asyncio.create_subprocess_exec(
            *command, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=stderr
        )
        self._reader = asyncio.ensure_future(self._read())

    async def request(self, method: str, params: Any = None) -> Any:
        message_id = next(self._ids)
        future = asyncio.get_running_loop().create_future()
        self._pending[message_id] = future
        self._send({"jsonrpc": "2.0", "id": message_id, "method": method, "params": params})
        return await future

    def notify(self, method: str, params: Any = None) -> None:
        self._send({"jsonrpc": "2.0", "method": method, "params": params})

    async def stop(self, timeout: float = 10.0) -> None:
        if self._process is None:
            return
        if self._process.returncode is None:
            try:
                self._process.stdin.close()
                await asyncio.wait_for(self._process.wait(), timeout)
            except (TimeoutError, ConnectionError):
                self._process.kill()
                await self._process.wait()
        if self._reader is not None:
            self._reader.cancel()
        self._process = None

    def _send(self, message: dict) -> None:
        body = self._encoder.encode(message)
        self._process.stdin.write(b"Content-Length: %d\r\n\r\n%s" % (len(body), body))

    async def _read(self) -> None:
        stream = self._process.stdout
        try:
            while True:
                length = None
                while (line := await stream.readline()) not in (b"\r\n", b""):
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                if line == b"" or length is None:
                    break
                self._dispatch(self._decoder.decode(await stream.readexactly(length)))
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            for future in self._pending.values():
                if not future.done():
                    future.set_exception(ConnectionError("the server's stdout closed"))

    def _dispatch(self, message: dict) -> None:
        method = message.get("method")
        if method is None:  # a response
            future = self._pending.pop(message.get("id"), None)
            if future is None or future.done():
                return
            if "error" in message:
                future.set_exception(ResponseError(message["error"].get("message", "error")))
            else:
                future.set_result(message.get("result"))
        elif "id" in message:  # a request from the server: nothing the benchmark needs to grant
            self._send({"jsonrpc": "2.0", "id": message["id"], "result": None})
        elif (handler := self._handlers.get(method)) is not None:
            handler(message.get("params"))
