"""pygls' internals are reached from one module, server/pygls_protocol.py, and only those it declares;
these fail the day an installed pygls no longer has them as that module expects (pyproject.toml
pins pygls below its next minor release until they pass with it). What the overrides do is
tested over stdio: test_protocol_errors.py (answers, log lines), test_closed_documents.py
(finished notifications forgotten), test_vscode_session.py and test_inline_edits.py (bad params);
here, in process, that only an error raised on purpose loses its traceback.
"""

from __future__ import annotations

import ast
import inspect
import json
import logging
from pathlib import Path

from pygls.exceptions import JsonRpcInternalError, JsonRpcInvalidParams
from pygls.lsp.server import LanguageServer
from pygls.protocol import LanguageServerProtocol

from dgemma_lsp.server.pygls_protocol import PRIVATE_STATE, PRIVATE_SURFACE, REPLACED_BUILTINS, DGemmaProtocol

SERVER = Path(__file__).resolve().parents[2] / "server"
ADAPTER = SERVER / "pygls_protocol.py"


def pygls_private_names() -> set[str]:
    """Every `_name` (not dunder) of pygls' LanguageServer and its protocol: classes and instances."""
    server = LanguageServer("surface", "0")
    names: set[str] = set()
    for instance in (server, server.protocol):
        for holder in (*type(instance).__mro__, instance):
            names |= {name for name in vars(holder) if name.startswith("_") and not name.startswith("__")}
    return names


def private_uses(source: str, private: set[str]) -> set[str]:
    """The names in `private` that `source` reads, writes or overrides."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr in private:
            found.add(node.attr)
        elif isinstance(node, ast.FunctionDef) and node.name in private:
            found.add(node.name)
    return found


def test_the_private_methods_are_there_with_the_parameters_the_adapter_passes():
    for name, expected in PRIVATE_SURFACE.items():
        method = getattr(LanguageServerProtocol, name, None)
        assert callable(method), f"pygls' protocol has no {name} any more"
        parameters = list(inspect.signature(method).parameters.values())[1:]  # after self
        got = tuple(("*" if p.kind is p.KEYWORD_ONLY else "") + p.name for p in parameters)
        assert got == expected, f"{name}{got}: server/pygls_protocol.py was written for {name}{expected}"


def test_the_private_state_is_there():
    protocol = LanguageServer("surface", "0").protocol
    for name in PRIVATE_STATE:
        assert isinstance(getattr(protocol, name, None), dict), f"pygls' protocol has no dict {name} any more"


def test_the_replaced_builtins_are_pygls_handlers_of_those_methods():
    for name, method in REPLACED_BUILTINS.items():
        builtin = getattr(LanguageServerProtocol, name, None)
        assert getattr(builtin, "method_name", None) == method, (
            f"pygls' built-in for {method} is no longer {name}: the override would run beside it")


def test_the_adapter_declares_every_private_name_it_uses():
    used = private_uses(ADAPTER.read_text(), pygls_private_names())
    assert used == set(PRIVATE_SURFACE) | set(PRIVATE_STATE)


def test_no_other_server_module_touches_pygls_internals():
    private = pygls_private_names()
    offenders = {path.name: sorted(uses) for path in sorted(SERVER.glob("*.py"))
                 if path != ADAPTER and (uses := private_uses(path.read_text(), private))}
    assert offenders == {}


def test_the_check_sees_a_private_name():
    assert private_uses("x = ls.protocol._converter.unstructure(r)", {"_converter"}) == {"_converter"}
    assert private_uses("def _send_data(self, data): pass", {"_send_data"}) == {"_send_data"}
    assert private_uses("x = ls.protocol.notify('m', {})", {"_converter"}) == set()


class Collected:
    """A pygls writer that keeps what the protocol writes."""

    def __init__(self) -> None:
        self.bodies: list[dict] = []

    def write(self, data: bytes) -> None:
        self.bodies.append(json.loads(data.split(b"\r\n\r\n", 1)[1]))

    def close(self) -> None:
        pass


def answer_of_a_handler_raising(error: Exception, caplog) -> tuple[dict, list[logging.LogRecord]]:
    """The answer to a request whose handler raises `error`, and the records logged meanwhile."""
    server = LanguageServer("surface", "0", protocol_cls=DGemmaProtocol)
    writer = Collected()
    server.protocol.set_writer(writer)

    @server.feature("surface/raise")
    def raising(ls, params) -> None:
        raise error

    request = {"jsonrpc": "2.0", "id": 1, "method": "surface/raise", "params": {}}
    with caplog.at_level(logging.INFO):
        server.protocol.handle_message(server.protocol.structure_message(request))
    (answer,) = writer.bodies
    return answer, [r for r in caplog.records if r.name.startswith(("pygls", "dgemma_lsp"))]


def test_an_error_raised_to_answer_the_client_is_one_info_line(caplog):
    answer, records = answer_of_a_handler_raising(JsonRpcInvalidParams("no such document"), caplog)
    assert answer["id"] == 1 and answer["error"]["code"] == JsonRpcInvalidParams.CODE
    assert not any(r.exc_info or r.levelno > logging.INFO for r in records)  # pygls' "Sending data" is INFO too
    assert len([r for r in records if r.name.startswith("dgemma_lsp")]) == 1


def test_an_unexpected_error_keeps_its_traceback(caplog):
    answer, records = answer_of_a_handler_raising(RuntimeError("a bug"), caplog)
    assert answer["id"] == 1 and answer["error"]["code"] == JsonRpcInternalError.CODE
    assert any(r.levelno == logging.ERROR and r.exc_info and r.exc_info[0] is RuntimeError for r in records)
