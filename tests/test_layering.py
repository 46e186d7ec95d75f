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
    forbidden = ("torch", "transformers", "dgemma_lsp.engine.daemon", "dgemma_lsp.engine.model", *TORCH_ROOMS)
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


def test_remote_room_is_torch_free_and_needs_no_daemon():
    forbidden = ("torch", "transformers", "dgemma_lsp.engine.daemon", *TORCH_ROOMS)
    assert offenders("engine/remote", forbidden) == []


def test_nothing_imports_bench_but_bench():
    """The benchmarks read the engine; the product never reads the benchmarks (the architecture's
    configs belong to the engine: engine/model/configs)."""
    assert offenders("server", ("dgemma_lsp.bench",)) == []
    assert offenders("engine", ("dgemma_lsp.bench",)) == []


TORCH_ROOMS = ("dgemma_lsp.engine.weights", "dgemma_lsp.engine.kernels", "dgemma_lsp.engine.runtime",
               "dgemma_lsp.engine.training")


def test_the_model_room_is_torch_free_and_needs_no_torch_room():
    """What a model is (its folder, prompt, built-in names) is known without torch: the server, the daemon's
    client and the vLLM client import it. Torch may be imported only inside the functions that build a model."""
    assert offenders("engine/model", ("dgemma_lsp.engine.daemon", "dgemma_lsp.engine.remote", *TORCH_ROOMS)) == []
    code = ("import sys, dgemma_lsp.engine.model.folders, dgemma_lsp.engine.model.prompting, "
            "dgemma_lsp.engine.model.tiny_model, dgemma_lsp.engine.model.architecture, "
            "dgemma_lsp.engine.model.cache_keyword; "
            "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_the_torch_rooms_point_one_way():
    """runtime -> weights -> kernels -> model: serving uses loading, loading uses the packed formats and
    kernels, and no room reaches back up."""
    assert offenders("engine/kernels", ("dgemma_lsp.engine.weights", "dgemma_lsp.engine.runtime",
                                        "dgemma_lsp.engine.daemon", "dgemma_lsp.engine.training")) == []
    assert offenders("engine/weights", ("dgemma_lsp.engine.runtime", "dgemma_lsp.engine.daemon",
                                        "dgemma_lsp.engine.training")) == []
    assert offenders("engine/runtime", ("dgemma_lsp.engine.daemon", "dgemma_lsp.engine.remote",
                                        "dgemma_lsp.engine.training")) == []


def test_no_module_imports_itself_round_a_circle():
    """Dependencies point one way between modules too: no circle of imports, lazy ones included."""
    graph = {}
    for folder in ("server", "engine", "bench"):
        for path, names in imported_modules(folder).items():
            graph[module_name(ROOT / path)] = names
    edges = {module: sorted(name for name in names if name in graph and name != module)
             for module, names in graph.items()}
    circles, state = [], {}

    def visit(module: str, trail: list[str]) -> None:  # depth first; a module on the trail closes a circle
        state[module] = "open"
        for target in edges[module]:
            if state.get(target) == "open":
                circles.append(trail[trail.index(target):] + [target])
            elif target not in state:
                visit(target, trail + [target])
        state[module] = "done"

    for module in sorted(edges):
        if module not in state:
            visit(module, [module])
    assert circles == []


def test_a_language_server_on_a_remote_engine_loads_no_torch():
    """Building the vLLM client and its prompt layout (the tiny model's template) pulls in no torch."""
    from dgemma_lsp.engine.model.tiny_model import ensure_tiny_random_model

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
