"""The server reaches pygls through its public surface only: a private attribute of the
protocol object (`protocol._converter`, `protocol._shutdown`, ...) may change in any pygls
release. The one private call left, `_send_response` inside our protocol subclass, is why
pyproject.toml pins pygls to 2.1.x (see DGemmaProtocol)."""

from __future__ import annotations

import ast
from pathlib import Path

SERVER = Path(__file__).resolve().parents[2] / "server"


def private_protocol_uses(source: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
                and isinstance(node.value, ast.Attribute) and node.value.attr == "protocol"):
            found.append(f"line {node.lineno}: .protocol.{node.attr}")
    return found


def test_the_check_sees_a_private_protocol_attribute():
    assert private_protocol_uses("x = ls.protocol._converter.unstructure(r)") == ["line 1: .protocol._converter"]
    assert private_protocol_uses("x = ls.protocol.notify('m', {})") == []


def test_the_server_uses_no_private_attribute_of_the_pygls_protocol():
    offenders = {path.name: uses for path in sorted(SERVER.glob("*.py"))
                 if (uses := private_protocol_uses(path.read_text()))}
    assert offenders == {}
