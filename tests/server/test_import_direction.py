"""The modules of server/ import each other one way: no circle, not even through an import inside
a function (`serve` once took the version from `cli`, which imports `serve`; the next-edit handlers
imported the server class that registered them). Handlers (`*_lsp.py`) import the server's state
(lsp_server.py); `serve.build_server` puts them together."""

from __future__ import annotations

import ast
from pathlib import Path

SERVER = Path(__file__).resolve().parents[2] / "server"


def import_graph(folder: Path) -> dict[str, set[str]]:
    """{module: the modules of `folder` it imports anywhere in its source}."""
    modules = {path.stem for path in folder.glob("*.py")}
    graph = {}
    for path in folder.glob("*.py"):
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                found |= {node.module.split(".")[0]} if node.module else {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("dgemma_lsp.server."):
                found.add(node.module.split(".")[2])
        graph[path.stem] = (found & modules) - {path.stem}
    return graph


def a_circle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of `graph` (a path that returns to its start), or None."""
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> list[str] | None:
        if module in path:
            return path[path.index(module):] + [module]
        if module in done:
            return None
        for imported in sorted(graph[module]):
            if (circle := visit(imported, [*path, module])) is not None:
                return circle
        done.add(module)
        return None

    return next((circle for module in sorted(graph) if (circle := visit(module, [])) is not None), None)


def test_the_check_finds_a_circle():
    assert a_circle({"cli": {"serve"}, "serve": {"cli"}}) == ["cli", "serve", "cli"]
    assert a_circle({"cli": {"serve"}, "serve": {"lsp_server"}, "lsp_server": set()}) is None


def test_server_modules_import_each_other_one_way():
    assert a_circle(import_graph(SERVER)) is None
