"""The import direction editors -> server -> engine, and the rooms inside engine/, checked on the source files.

Relative imports are resolved to absolute names, and imports inside functions
count too: a lazy import is still a dependency.
"""

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE_OF_FOLDER = {"server": "dgemma_lsp.server", "engine": "dgemma_lsp.engine", "bench": "dgemma_lsp.bench"}


def module_name(path: Path) -> str:
    relative = path.relative_to(ROOT).with_suffix("")
    parts = list(relative.parts)
    parts[0] = PACKAGE_OF_FOLDER[parts[0]]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(folder: str) -> dict[str, set[str]]:
    found = {}
    for path in (ROOT / folder).rglob("*.py"):
        package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
        names = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                if node.level == 0:
                    base = node.module or ""
                else:
                    anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join(anchor + ([node.module] if node.module else []))
                names.add(base)
                names |= {f"{base}.{alias.name}" for alias in node.names}  # `from pkg import module`
        found[str(path.relative_to(ROOT))] = names
    assert found, f"no Python file under {folder}/: a check over no file would pass whatever the imports"
    return found


def offenders(folder: str, forbidden: tuple[str, ...]) -> list[str]:
    return sorted(
        f"{path} imports {name}"
        for path, names in imported_modules(folder).items()
        for name in names
        if any(name == f or name.startswith(f + ".") for f in forbidden)
    )


def test_engine_knows_nothing_of_lsp_or_the_server():
    assert offenders("engine", ("pygls", "lsprotocol", "dgemma_lsp.server")) == []


def test_nothing_but_the_server_imports_the_server():
    assert offenders("bench", ("dgemma_lsp.server",)) == []


def test_syntax_room_is_torch_free_and_needs_no_other_room():
    forbidden = ("torch", "transformers", "dgemma_lsp.engine.runtime", "dgemma_lsp.engine.daemon")
    assert offenders("engine/syntax", forbidden) == []


def test_server_never_imports_torch_or_transformers():
    assert offenders("server", ("torch", "transformers")) == []


def test_nothing_imports_the_bare_package_names():
    for folder in ("server", "engine", "bench"):
        assert offenders(folder, ("server", "engine")) == []


def test_a_language_server_on_a_daemon_loads_no_torch():
    """What a front end process imports (server, daemon client, syntax pipeline) pulls in no torch."""
    code = ("import sys; import dgemma_lsp.server.cli, dgemma_lsp.server.lsp_server, "
            "dgemma_lsp.engine.daemon.client, dgemma_lsp.engine.syntax.infill; "
            "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


TORCH_FREE_RUNTIME_MODULES = ("dgemma_lsp.engine.runtime.prompting", "dgemma_lsp.engine.runtime.loading",
                              "dgemma_lsp.engine.runtime.tiny_model")
"""What the remote room may take from the runtime: modules that import torch only inside functions it never calls."""


def test_remote_room_is_torch_free_and_needs_no_daemon():
    assert offenders("engine/remote", ("torch", "transformers", "dgemma_lsp.engine.daemon")) == []
    for module in TORCH_FREE_RUNTIME_MODULES:  # a name that matches no module would allow nothing
        assert (ROOT / "engine" / "runtime" / f"{module.rpartition('.')[2]}.py").is_file(), module
    for path, names in imported_modules("engine/remote").items():
        for name in names:
            if name.startswith("dgemma_lsp.engine.runtime."):
                assert any(name == m or name.startswith(m + ".") for m in TORCH_FREE_RUNTIME_MODULES), (
                    f"{path} imports {name}"
                )


def test_a_language_server_on_a_remote_engine_loads_no_torch():
    """Building the vLLM client and its prompt layout (the tiny model's template) pulls in no torch."""
    from dgemma_lsp.engine.runtime.tiny_model import ensure_tiny_random_model

    ensure_tiny_random_model()  # its tokenizer files are what the layout reads
    code = ("import sys, argparse; from dgemma_lsp.server import serve, lsp_server; "
            "from dgemma_lsp.engine.remote.template import load_layout; "
            "serve.make_engine_client(argparse.Namespace(engine='vllm', engine_url='http://127.0.0.1:9/v1', "
            "model='tiny-random')); load_layout('tiny-random'); "
            "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_the_command_line_parses_without_torch():
    """Every `dgemma-lsp` start builds the whole parser: `--stdio` and a respawned `engine serve`
    must not pay torch's import before they answer."""
    code = ("import sys; from dgemma_lsp.server import cli; "
            "cli.build_parser().parse_args(['engine', 'serve', '--model', 'tiny-random']); "
            "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
