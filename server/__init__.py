"""dgemma_lsp.server: the language server and the `dgemma-lsp` command line.

Knows pygls, lsprotocol, msgspec and the engine's public types. Never imports
torch directly: with a resident engine it is a thin front end.
"""
