"""Placeholder until the resident engine lands: `dgemma-lsp engine start|stop|status`."""


def add_arguments(parser):
    parser.add_argument("action", choices=["start", "stop", "status"])
    parser.add_argument("--json", action="store_true")


def run(args) -> int:
    raise SystemExit("dgemma-lsp engine: not built yet")
