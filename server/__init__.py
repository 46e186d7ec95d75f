"""dgemma_lsp.server: the language server and the `dgemma-lsp` command line.

Knows pygls, lsprotocol, msgspec and the engine's public types. Never imports
torch directly: with a resident engine it is a thin front end.
"""


def package_version() -> str:
    """The installed dgemma-lsp's version (`--version`, the initialize answer's serverInfo)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("dgemma-lsp")
    except PackageNotFoundError:
        return "0+unknown"
