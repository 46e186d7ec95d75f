"""The import direction editors -> server -> engine, checked on the source files."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def imported_modules(folder: str) -> dict[str, set[str]]:
    found = {}
    for path in (ROOT / folder).rglob("*.py"):
        names = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module)
        found[str(path.relative_to(ROOT))] = names
    return found


def offenders(folder: str, forbidden: tuple[str, ...]) -> list[str]:
    return [
        f"{path} imports {name}"
        for path, names in imported_modules(folder).items()
        for name in names
        if name.split(".")[0] in forbidden or name.startswith(forbidden)
    ]


def test_engine_knows_nothing_of_lsp_or_the_server():
    assert offenders("engine", ("pygls", "lsprotocol", "dgemma_lsp.server")) == []


def test_server_never_imports_torch_or_transformers():
    assert offenders("server", ("torch", "transformers")) == []


def test_nothing_imports_the_bare_package_names():
    assert offenders("server", ("server", "engine")) == []
    assert offenders("engine", ("server", "engine")) == []
