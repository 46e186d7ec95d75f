"""Placeholder until the language server lands: `add_arguments` / `run` for `dgemma-lsp --stdio`."""


def add_arguments(parser):
    parser.add_argument("--stdio", action="store_true", help="serve LSP over stdin/stdout (default)")
    parser.add_argument("--tcp", default=None, metavar="HOST:PORT", help="serve LSP over TCP")
    parser.add_argument("--engine", default="inprocess", choices=["auto", "inprocess", "daemon"])


def run(args) -> int:
    raise SystemExit("dgemma-lsp: the language server is not built yet")
