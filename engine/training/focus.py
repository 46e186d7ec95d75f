"""The focus corpus: short, well-named functions of the kind editors are asked to fill, from pinned PyPI packages.

The main corpus (corpus.py) is what this machine has installed: libraries, mostly long
classes and plumbing. Functions like `def square(n): return n * n` — what a person types
and what HumanEval asks — are rare in it. These packages are made of them: algorithm
exercises (`algorithms`, `pygorithm`) and small utility functions (`pydash`, `toolz`, …),
each permissively licensed and pinned, so a run's data is the same on every machine.

They are installed with `pip install --no-deps --target` into the cache root (never into
the environment: corpus.py reads every installed distribution, and a run's main corpus must
not change under it), then read by corpus.collect(python_path=...) like any distribution:
licence from metadata, files deduplicated, HumanEval's marker skipped. A recipe's
`data.focusShare` is the share of examples drawn from its `data.focusPackages` (FOCUS_PACKAGES
unless it names its own; train.ExampleStream);
FOCUS_HELD_OUT is never trained on: `validation --set focus` cuts its holes from it (train refuses a
recipe whose focusPackages name it or one of its `heldOutSources`).
pip does the fetching (no code of ours for wheels or indexes). Knows packages and folders;
knows nothing of tokens or models.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

FOCUS_PACKAGES = (
    "algorithms==1.0.1",  # MIT: keon/algorithms, ~970 small algorithm functions with docstrings
    "pydash==8.1.0",  # MIT
    "toolz==1.2.0",  # BSD-3-Clause
    "funcy==2.1",  # BSD-3-Clause
    "more-itertools==11.2.1",  # MIT
    "boltons==26.2.0",  # BSD
    "python-string-utils==1.0.0",  # MIT
)
FOCUS_HELD_OUT = ("pygorithm==1.0.4",)  # MIT: algorithm exercises by other authors, for validation only


def focus_folder(packages: tuple[str, ...]) -> Path:
    """Where `packages` are (or will be) installed: one folder per pinned list, under the cache root."""
    from ..model.cache import cache_root

    digest = hashlib.sha1("\n".join(sorted(packages)).encode()).hexdigest()[:12]
    return cache_root() / f"focus-{digest}"


def ensure_installed(packages: tuple[str, ...]) -> Path:
    """Install `packages` (pure Python, no dependencies) into their folder unless there already; return it."""
    folder = focus_folder(packages)
    if (folder / ".complete").exists():
        return folder
    staging = folder.with_name(folder.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)  # what a stopped install left
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                    "--no-deps", "--no-compile", "--target", str(staging), *packages], check=True,
                   stdout=sys.stderr)  # pip's chatter must never reach a stdout that carries a protocol
    (staging / ".complete").write_text("\n".join(packages) + "\n")
    shutil.rmtree(folder, ignore_errors=True)
    staging.rename(folder)
    return folder


def package_names(packages: tuple[str, ...]) -> tuple[str, ...]:
    """The distribution names of pinned requirements (`algorithms==1.0.1` → `algorithms`)."""
    return tuple(requirement.split("==")[0] for requirement in packages)
