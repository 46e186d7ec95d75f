"""Where dgemma-lsp keeps what it builds once (the random tiny model, packed weights, the focus corpus).

A leaf: imports nothing of ours, so every room can ask it.
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """The folder for what dgemma-lsp builds once and keeps: `DGEMMA_LSP_CACHE`, else the user cache dir."""
    import platformdirs

    return Path(os.environ.get("DGEMMA_LSP_CACHE") or platformdirs.user_cache_dir("dgemma-lsp"))
