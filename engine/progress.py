"""Load progress as a bar on a terminal's stderr, for the command-line tools.

`shard_progress_bar()` gives a `(done, total)` callback (the shape the loaders
report in) that draws a tqdm bar on stderr, never on stdout: stdout carries the
LSP protocol or a command's answer. The bar is drawn only when stderr is a
terminal: piped into a log, an editor's buffer or a script, a bar is noise
(editors get `$/progress` from the language server instead). Knows tqdm; knows
nothing of models.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager


@contextmanager
def shard_progress_bar(description: str = "loading weights") -> Iterator[Callable[[int, int], None]]:
    """A `(done, total)` callback drawing a bar on stderr for the `with` block's lifetime."""
    if not _stderr_is_terminal():
        yield lambda done, total: None
        return
    from tqdm import tqdm

    bar = None

    def update(done: int, total: int) -> None:
        nonlocal bar
        if bar is None:
            bar = tqdm(total=total, desc=description, unit="shard", file=sys.stderr, leave=True)
        bar.total = total
        bar.n = done
        bar.refresh()

    try:
        yield update
    finally:
        if bar is not None:
            bar.close()


def _stderr_is_terminal() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # replaced or closed stderr
        return False
