"""Typed errors the engine raises at its boundary.

Each carries a one-line message meant for a person; the CLI prints it, the
server maps it to a JSON-RPC error or a status message. Nothing here knows LSP.
"""


class EngineError(Exception):
    """Base class: a failure the caller can report in one line."""


class ModelNotFoundError(EngineError):
    """The model is neither a local folder nor in the Hugging Face cache."""


class ModelLoadError(EngineError):
    """The model files exist but could not be loaded (corrupt, wrong type, out of memory)."""


class BadRequestError(EngineError):
    """The request itself is invalid (position outside the document, bad knob values)."""


class CancelledError(EngineError):
    """The request was cancelled while denoising; the engine stays usable."""
