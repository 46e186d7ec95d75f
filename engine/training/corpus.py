"""The training corpus: permissively licensed source code found on this machine, and its manifest.

Sources, each with the licence it is taken under:
- the Python standard library of the running interpreter (PSF-2.0);
- every installed Python distribution whose licence is permissive, read from its
  metadata (`License-Expression`, else `License`, else the trove classifiers);
- JavaScript packages under the system's node_modules whose package.json names a
  permissive licence.

"Permissive" is a fixed list (MIT, BSD, Apache, PSF, ISC, Zlib, 0BSD, CC0, Unlicense, BlueOak,
BSL-1.0): an SPDX expression qualifies when every `AND` term does (an `OR` needs one).
Copyleft (GPL, LGPL, MPL, …) and unknown licences are left out and listed as such in
the manifest. Files that mention HumanEval are skipped, so nothing of the benchmark's
problems is trained on. `held_out` names sources kept out of training: the validation set
(validation.py) is cut from their files only, so it measures code the model never saw.
Knows files and licences; knows nothing of tokens or models.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import random
import re
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

PERMISSIVE = re.compile(
    r"^(MIT|MIT-0|BSD(-\d-Clause)?|0BSD|Apache(-2\.0)?|PSF(-2\.0)?|Python(-2\.0)?|ISC|Zlib|CC0(-1\.0)?|"
    r"Unlicense|BSL-1\.0|BlueOak-1\.0\.0|CNRI-Python|LLVM-exception|HPND)$",
    re.IGNORECASE,
)
"""SPDX ids (and the common spellings that metadata uses) we may train on and ship weights from."""

_CLASSIFIER_IDS = {
    "MIT License": "MIT", "BSD License": "BSD", "Apache Software License": "Apache-2.0",
    "Python Software Foundation License": "PSF-2.0", "ISC License (ISCL)": "ISC",
    "zlib/libpng License": "Zlib", "The Unlicense (Unlicense)": "Unlicense",
}
_SPELLINGS = {"apache 2.0": "Apache-2.0", "apache 2.0 license": "Apache-2.0", "apache license 2.0": "Apache-2.0",
              "isc license": "ISC", "bsd": "BSD", "mit license": "MIT", "new bsd license": "BSD-3-Clause"}
MAX_FILE_BYTES = 200_000
"""Bigger files are mostly generated tables or vendored bundles: not code to learn from."""
EXCLUDE_MARKERS = ("HumanEval",)
SKIPPED_DISTRIBUTIONS = ("dgemma-lsp",)
"""Our own package: its tests and benchmarks name the evaluation data."""


@dataclass
class Source:
    """One package (or the standard library) the corpus takes files from."""

    name: str
    version: str
    licence: str
    language: str
    files: list[Path] = field(default_factory=list)

    def manifest_entry(self, tokens: int, files_used: int, bytes_used: int) -> dict:
        return {"name": self.name, "version": self.version, "licence": self.licence, "language": self.language,
                "files": files_used, "bytes": bytes_used, "tokens": tokens}


@dataclass(frozen=True)
class CodeFile:
    """One source file's text, with the source it came from."""

    source: str
    path: str
    language: str
    text: str


def is_permissive(licence: str | None) -> bool:
    """True when an SPDX-like expression names only permissive licences (`OR`: one suffices)."""
    if not licence or len(licence) > 200:
        return False
    alternatives = re.split(r"\s+OR\s+", licence.replace("(", " ").replace(")", " ").strip())
    for alternative in alternatives:
        terms = [t for t in re.split(r"\s+(?:AND|WITH)\s+", alternative.strip()) if t]
        if terms and all(PERMISSIVE.match(_SPELLINGS.get(t.strip().lower(), t.strip())) for t in terms):
            return True
    return False


def licence_of(distribution: importlib.metadata.Distribution) -> str | None:
    """The licence a distribution declares: License-Expression, else a short License, else its classifier."""
    metadata = distribution.metadata
    expression = (metadata.get("License-Expression") or "").strip()
    if expression:
        return expression
    declared = (metadata.get("License") or "").strip()
    if declared and "\n" not in declared and len(declared) < 60:
        return _SPELLINGS.get(declared.lower(), declared)
    for classifier in metadata.get_all("Classifier") or []:
        if classifier.startswith("License :: OSI Approved :: "):
            name = classifier.rsplit(" :: ", 1)[-1]
            if name in _CLASSIFIER_IDS:
                return _CLASSIFIER_IDS[name]
    return None


def python_sources(path: list[str] | None = None) -> Iterator[Source | tuple[str, str]]:
    """The stdlib and every installed distribution: a Source, or (name, licence) when left out.

    `path`: only the distributions installed in these folders (focus.py's), without the stdlib."""
    if path is None:
        stdlib = Path(sysconfig.get_paths()["stdlib"])
        files = sorted(p for p in stdlib.rglob("*.py") if "site-packages" not in p.parts)
        yield Source("python-stdlib", sysconfig.get_python_version(), "PSF-2.0", "python", files)
    seen = set()
    found = importlib.metadata.distributions() if path is None else importlib.metadata.distributions(path=path)
    for distribution in sorted(found, key=lambda d: d.metadata["Name"].lower()):
        name = distribution.metadata["Name"]
        if name.lower() in seen or name in SKIPPED_DISTRIBUTIONS:
            continue
        seen.add(name.lower())
        licence = licence_of(distribution)
        if not is_permissive(licence):
            yield (name, licence or "unknown")
            continue
        paths = sorted(Path(distribution.locate_file(f)) for f in distribution.files or () if f.suffix == ".py")
        yield Source(name, distribution.version, licence, "python", [p for p in paths if p.is_file()])


def javascript_sources(roots=("/usr/lib/node_modules", "/usr/local/lib/node_modules")) -> Iterator[Source | tuple[str, str]]:
    """JavaScript packages of the system's node_modules, by their package.json licence."""
    for root in map(Path, roots):
        if not root.is_dir():
            continue
        for manifest in sorted(root.rglob("package.json")):
            if "test" in manifest.parts or "tests" in manifest.parts:
                continue
            try:
                package = json.loads(manifest.read_text("utf-8"))
            except (OSError, ValueError):
                continue
            if not isinstance(package, dict) or "name" not in package:
                continue
            licence = package.get("license")
            licence = licence if isinstance(licence, str) else None
            folder = manifest.parent
            if not is_permissive(licence):
                yield (str(package["name"]), licence or "unknown")
                continue
            # Only this package's own files: nested node_modules are packages of their own.
            files = sorted(p for p in folder.rglob("*.js")
                           if "node_modules" not in p.relative_to(folder).parts and not p.name.endswith(".min.js"))
            yield Source(str(package["name"]), str(package.get("version", "")), licence, "javascript", files)


def collect(max_bytes: int, seed: int, *, languages=("python", "javascript"), held_out: tuple[str, ...] = (),
            only: tuple[str, ...] | None = None, python_path: list[str] | None = None) -> tuple[list[CodeFile], dict]:
    """Up to `max_bytes` of source files, sampled by seed across all permitted sources, and the manifest.

    `held_out`: source names never taken (listed in the manifest as held out); `only`: take
    nothing but these sources (how the validation set reads the held-out ones); `python_path`:
    the Python distributions of these folders instead of the environment's (focus.py).

    The manifest lists every source used (licence, files, bytes; tokens are filled in by
    the caller once the tokenizer exists) and every source left out with its licence.
    """
    sources: list[Source] = []
    left_out: list[dict] = []
    finders = {"python": lambda: python_sources(python_path), "javascript": javascript_sources}
    for language in languages:
        for found in finders[language]():
            if isinstance(found, Source):
                if found.name in held_out or (only is not None and found.name not in only):
                    continue
                if found.files:
                    sources.append(found)
            else:
                left_out.append({"name": found[0], "licence": found[1], "language": language})
    candidates = [(source, path) for source in sources for path in source.files]
    random.Random(seed).shuffle(candidates)
    chosen: list[CodeFile] = []
    used: dict[str, list[int]] = {}
    total = 0
    seen_hashes: set[str] = set()
    for source, path in candidates:
        if total >= max_bytes:
            break
        try:
            size = path.stat().st_size
            if size == 0 or size > MAX_FILE_BYTES:
                continue
            text = path.read_text("utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        if any(marker in text for marker in EXCLUDE_MARKERS):
            continue
        digest = hashlib.sha1(text.encode()).hexdigest()
        if digest in seen_hashes:  # vendored copies of one file count once
            continue
        seen_hashes.add(digest)
        chosen.append(CodeFile(source=source.name, path=str(path), language=source.language, text=text))
        files, size_used = used.setdefault(source.name, [0, 0])
        used[source.name] = [files + 1, size_used + len(text.encode())]
        total += len(text.encode())
    manifest = {
        "seed": seed,
        "maxBytes": max_bytes,
        "bytes": total,
        "excludedMarkers": list(EXCLUDE_MARKERS),
        "heldOut": list(held_out),
        "sources": [source.manifest_entry(0, *used[source.name]) for source in sources if source.name in used],
        "leftOut": sorted(left_out, key=lambda entry: entry["name"].lower()),
    }
    return chosen, manifest
