"""`dgemma-lsp [--stdio] [--tcp HOST:PORT] [--engine ...] [--engine-url URL]`: build the engine client and serve LSP.

Owns the serving flags, the choice of engine client, and `build_server`, which puts the
server's state (lsp_server.py) and its handlers (the `*_lsp.py` modules, one per feature)
together. stdout carries only the protocol: logging is set up by cli.py (stderr or
--log-file) before `run` is called. Imports pygls only when it serves: `--help` stays quick.
"""

from __future__ import annotations

import argparse
import logging

from . import package_version

log = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--stdio", action="store_true", help="serve LSP over stdin/stdout (the default)")
    parser.add_argument("--tcp", default=None, metavar="HOST:PORT", help="serve LSP over TCP instead")
    parser.add_argument(
        "--engine", default="auto", choices=["auto", "inprocess", "daemon", "vllm"],
        help="where the model runs: the user's resident engine daemon, started when absent "
             "(auto, daemon), in this process (inprocess), or a vLLM server at --engine-url (vllm)",
    )
    parser.add_argument(
        "--engine-url", default="http://127.0.0.1:8000/v1", metavar="URL",
        help="--engine vllm: the server's OpenAI-compatible API (its key comes from $DGEMMA_LSP_API_KEY; "
             "--model names the model it serves)",
    )
    parser.add_argument(
        "--tokenizer", default=None, metavar="FOLDER|HF_ID",
        help="--engine vllm: where the served model's tokenizer files (its chat template) are, when --model is "
             "a served name and neither it nor the `root` the server lists for it has files here",
    )
    parser.add_argument(
        "--idle-unload", type=float, default=900.0, metavar="SECONDS",
        help="a daemon this server starts unloads the model after this long without work (0: never)",
    )


def make_engine_client(args: argparse.Namespace):
    """The EngineClient for --engine: `auto` and `daemon` attach to the resident daemon, starting it when absent;
    `vllm` talks to a remote server (engine/remote/)."""
    if args.engine == "vllm":
        from dgemma_lsp.engine.remote.vllm_client import VllmEngineClient

        return VllmEngineClient.from_args(args)
    if args.engine in ("auto", "daemon"):
        from dgemma_lsp.engine.daemon.client import DaemonEngineClient

        return DaemonEngineClient.from_args(args)
    from dgemma_lsp.engine.client import InProcessEngineClient
    from dgemma_lsp.engine.runtime.service import serving_service

    return InProcessEngineClient(
        serving_service(args.model, device=args.device, dtype=args.dtype, quantization=args.quantization))


def build_server(engine, version: str = "0"):
    """A DGemmaServer on `engine` (an EngineClient) with every feature's handlers registered."""
    from . import commands_lsp, completions_lsp, documents_lsp, inline_edit_lsp, rewrite_lsp, session_lsp
    from .lsp_server import DGemmaServer

    server = DGemmaServer(engine, version)
    for feature in (session_lsp, documents_lsp, completions_lsp, rewrite_lsp, commands_lsp, inline_edit_lsp):
        feature.register(server)
    return server


def run(args: argparse.Namespace) -> int:
    server = build_server(make_engine_client(args), package_version())
    if args.tcp:
        host, _, port = args.tcp.rpartition(":")
        if not host or not port.isdigit():
            raise SystemExit(f"dgemma-lsp: --tcp wants HOST:PORT, got {args.tcp!r}")
        server.start_tcp(host, int(port))
    else:
        from .stdio import serve_stdio

        serve_stdio(server)
    # pygls swallows the SystemExit of `exit`; the LSP rule: 0 after shutdown, 1 otherwise.
    return 0 if server.shutdown_requested else 1
