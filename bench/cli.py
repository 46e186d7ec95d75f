"""Placeholder until the benchmarks land: `dgemma-lsp bench ...` and `make bench`."""


def add_arguments(parser):
    parser.add_argument("which", nargs="?", default="all")


def run(args) -> int:
    raise SystemExit("dgemma-lsp bench: not built yet")
