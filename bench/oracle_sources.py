"""Where `bench oracle` gets its real code: the fetch step and the sources folder it fills.

`dgemma-lsp bench oracle --fetch` downloads each source below with the ordinary client of
its registry (`apt-get download` + `dpkg-deb -x`, `apt-get source --download-only` + the
upstream tarball, `npm pack`, `pip download --no-binary`),
unpacks the files the oracle reads into `<sources>/<name>/` and writes `source.json` beside
them: the language(s), where the code came from, its licence and the globs of the files to
read. The Python standard library is read where it is installed (no download). A source
already fetched is not fetched again (delete its folder to refetch). The default sources
folder is ~/.cache/dgemma-lsp/oracle-sources; `--sources DIR` reads (and fetches into)
another one, e.g. tests/data/oracle, the small committed sample `make test` runs.

A source folder needs only its `source.json`:
    {"name": ..., "origin": "...", "licence": "...", "root": "." or an absolute path,
     "include": ["glob", ...], "language": optional}
Each file's language comes from its extension (`languages.language_for_path`), or from the
source's "language" where the files' names carry none (bash-completion's scripts), so a
grammar added to LANGUAGES is covered by adding a source whose globs match its files.

Needs apt-get (run `apt-get update` once first), npm and pip on PATH for the sources that use
them; a source whose client is missing is skipped with a message. The Debian source packages
(registry "apt-source": Scala, whose binary packages ship only jars) need a `deb-src` line for
the configured Debian mirror in /etc/apt/sources.list.d/ (Types: deb-src, the same URIs and
suite, Components: main) and `apt-get update` after it; without one they are skipped. Knows nothing of holes.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_SOURCES = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "dgemma-lsp" / "oracle-sources"


@dataclass(frozen=True)
class Source:
    name: str
    registry: str
    """apt, apt-source (a Debian source package's upstream tarball), npm, pip or installed (read in place)."""
    package: str
    licence: str
    include: tuple[str, ...]
    """Globs, relative to the unpacked package, of the files the oracle reads."""
    exclude: tuple[str, ...] = field(default=())
    inner_zip: str | None = None
    """A zip inside the package that holds the sources (OpenJDK's src.zip), relative to it."""
    language: str | None = None
    """Every file's language, for files whose names carry none (bash-completion's scripts);
    None: from each file's extension."""


SOURCES: tuple[Source, ...] = (
    Source("python-stdlib", "installed", "python", "PSF-2.0", ("*.py", "asyncio/*.py", "email/*.py",
                                                                 "json/*.py", "http/*.py", "importlib/*.py")),
    Source("lodash-es", "npm", "lodash-es@4", "MIT", ("package/*.js",)),
    Source("tanstack-query-core", "npm", "@tanstack/query-core@5", "MIT", ("package/src/*.ts",)),
    Source("tanstack-react-query", "npm", "@tanstack/react-query@5", "MIT", ("package/src/*.ts", "package/src/*.tsx")),
    Source("tanstack-react-router", "npm", "@tanstack/react-router@1", "MIT", ("package/src/*.tsx",)),
    Source("golang-src", "apt", "golang-1.19-src", "BSD-3-Clause",
           ("usr/share/go-1.19/src/strings/*.go", "usr/share/go-1.19/src/bytes/*.go",
            "usr/share/go-1.19/src/sort/*.go", "usr/share/go-1.19/src/net/http/*.go",
            "usr/share/go-1.19/src/encoding/json/*.go", "usr/share/go-1.19/src/go/parser/*.go",
            "usr/share/go-1.19/src/text/template/*.go", "usr/share/go-1.19/src/bufio/*.go")),
    Source("rust-src", "apt", "rust-src", "MIT OR Apache-2.0",
           ("usr/src/rustc-*/library/alloc/src/*.rs", "usr/src/rustc-*/library/alloc/src/collections/*.rs",
            "usr/src/rustc-*/library/std/src/*.rs", "usr/src/rustc-*/library/std/src/fs.rs",
            "usr/src/rustc-*/library/core/src/str/*.rs", "usr/src/rustc-*/library/core/src/iter/*.rs")),
    Source("openjdk-17-source", "apt", "openjdk-17-source", "GPL-2.0 WITH Classpath-exception-2.0",
           ("java.base/java/util/*.java", "java.base/java/io/*.java", "java.base/java/lang/*.java"),
           inner_zip="usr/lib/jvm/openjdk-17/lib/src.zip"),
    Source("cordova-android", "npm", "cordova-android@15", "Apache-2.0", ("package/framework/src/**/*.java",)),
    Source("tree-sitter-core", "pip", "tree-sitter==0.25.2", "MIT",
           ("tree-sitter-*/tree_sitter/core/lib/src/*.c", "tree-sitter-*/tree_sitter/binding/*.c")),
    Source("googletest", "apt", "googletest", "BSD-3-Clause",
           ("usr/src/googletest/googletest/src/*.cc", "usr/src/googletest/googlemock/src/*.cc",
            "usr/src/googletest/googletest/samples/*.cc")),
    Source("greenlet", "pip", "greenlet==3.5.6", "MIT", ("greenlet-*/src/greenlet/*.cpp",)),
    Source("neovim-runtime", "apt", "neovim-runtime", "Apache-2.0 (runtime/lua)",
           ("usr/share/nvim/runtime/lua/**/*.lua",)),
    # The grammars added in issue 29 (C#, Ruby, PHP, Kotlin, Swift, Bash, JSON, YAML, TOML, HTML, CSS).
    Source("pythonnet", "pip", "pythonnet==3.2.1", "MIT", ("pythonnet-*/src/runtime/**/*.cs",)),
    Source("libruby", "apt", "libruby3.1", "Ruby OR BSD-2-Clause",
           ("usr/lib/ruby/3.1.0/*.rb", "usr/lib/ruby/3.1.0/net/*.rb", "usr/lib/ruby/3.1.0/uri/*.rb",
            "usr/lib/ruby/3.1.0/optparse/*.rb", "usr/lib/ruby/3.1.0/rubygems/*.rb")),
    Source("php-monolog", "apt", "php-monolog", "MIT", ("usr/share/php/Monolog/**/*.php",)),
    Source("php-twig", "apt", "php-twig", "BSD-3-Clause", ("usr/share/php/Twig/**/*.php",)),
    Source("expo-modules-core", "npm", "expo-modules-core@2.5.0", "MIT",
           ("package/android/src/main/java/**/*.kt", "package/ios/Core/**/*.swift", "package/ios/Api/**/*.swift")),
    Source("bash-completion", "apt", "bash-completion", "GPL-2.0-or-later",
           ("usr/share/bash-completion/completions/*", "usr/share/bash-completion/bash_completion"),
           language="bash"),
    Source("ajv-json-schemas", "npm", "ajv@8.20.0", "MIT", ("package/lib/refs/**/*.json",)),
    Source("ruby-faker-locales", "apt", "ruby-faker", "MIT",
           ("usr/share/rubygems-integration/all/gems/faker-*/lib/locales/**/*.yml",)),
    Source("rust-src-cargo-toml", "apt", "rust-src", "MIT OR Apache-2.0",
           ("usr/src/rustc-*/**/Cargo.toml", "usr/src/rustc-*/config.toml.example")),
    # HTML: jQuery UI's demos, hand-written pages (inline scripts and styles too), CC0 as Debian's
    # copyright file says of demos/*. (Bootstrap's example pages, the first HTML source, are Hugo
    # templates: `{{< placeholder ... >}}` shortcodes are not HTML and made holes no editor sees.)
    Source("jquery-ui-demos", "apt", "libjs-jquery-ui-docs", "CC0-1.0 (jQuery UI's demos)",
           ("usr/share/doc/libjs-jquery-ui-docs/examples/*/*.html",),
           exclude=("usr/share/doc/libjs-jquery-ui-docs/examples/*/index.html",)),
    # Scala: Debian's scala source package (the 2.11.12 upstream tarball): the standard library.
    Source("scala-library-src", "apt-source", "scala", "BSD-3-Clause",
           ("scala-*/src/library/scala/*.scala", "scala-*/src/library/scala/collection/*.scala",
            "scala-*/src/library/scala/collection/immutable/*.scala",
            "scala-*/src/library/scala/collection/mutable/*.scala",
            "scala-*/src/library/scala/concurrent/*.scala", "scala-*/src/library/scala/util/*.scala")),
    Source("codemirror5-css", "npm", "codemirror@5.65.21", "MIT", ("package/theme/*.css", "package/lib/*.css",
                                                                    "package/addon/**/*.css")),
)


def fetch(sources_dir: Path, only: set[str] | None = None, log=lambda s: sys.stderr.write(s + "\n")) -> int:
    """Fetch every source not yet in `sources_dir`; the number that could not be fetched."""
    sources_dir.mkdir(parents=True, exist_ok=True)
    failed = 0
    for source in SOURCES:
        if only and source.name not in only:
            continue
        target = sources_dir / source.name
        if (target / "source.json").exists():
            log(f"oracle sources: {source.name} already in {target}")
            continue
        try:
            origin, root = _fetch_one(source, target)
        except (OSError, subprocess.CalledProcessError, RuntimeError) as error:
            failed += 1
            log(f"oracle sources: {source.name} not fetched: {error}")
            shutil.rmtree(target, ignore_errors=True)
            continue
        manifest = {"name": source.name, "origin": origin, "licence": source.licence, "root": root,
                    "include": list(source.include), "exclude": list(source.exclude)}
        if source.language:
            manifest["language"] = source.language
        (target / "source.json").write_text(json.dumps(manifest, indent=2) + "\n")
        log(f"oracle sources: {source.name} from {origin}")
    return failed


def _fetch_one(source: Source, target: Path) -> tuple[str, str]:
    """Unpack one source into `target`; (origin as text, root of the include globs)."""
    if source.registry == "installed":
        stdlib = sysconfig.get_paths()["stdlib"]
        target.mkdir(parents=True, exist_ok=True)
        return f"the Python {sys.version.split()[0]} standard library installed at {stdlib}", stdlib
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        if source.registry == "apt":
            _run(["apt-get", "download", source.package], tmp_path)
            [deb] = list(tmp_path.glob("*.deb"))
            unpacked = tmp_path / "unpacked"
            _run(["dpkg-deb", "-x", str(deb), str(unpacked)], tmp_path)
            origin = f"Debian package {deb.name}"
        elif source.registry == "apt-source":
            _run(["apt-get", "source", "--download-only", "-q", source.package], tmp_path)
            [orig] = [p for p in tmp_path.glob("*.orig.tar.*") if not p.name.endswith(".asc")]
            unpacked = tmp_path / "unpacked"
            with tarfile.open(orig) as archive:
                archive.extractall(unpacked, filter="data")
            origin = f"Debian source package {source.package} ({orig.name})"
        elif source.registry == "npm":
            _run(["npm", "pack", "--silent", source.package], tmp_path)
            [tgz] = list(tmp_path.glob("*.tgz"))
            unpacked = tmp_path / "unpacked"
            with tarfile.open(tgz) as archive:
                archive.extractall(unpacked, filter="data")
            origin = f"npm package {tgz.name}"
        elif source.registry == "pip":
            _run([sys.executable, "-m", "pip", "download", "-q", "--no-binary", ":all:", "--no-deps",
                  "-d", str(tmp_path), source.package], tmp_path)
            [sdist] = list(tmp_path.glob("*.tar.gz"))
            unpacked = tmp_path / "unpacked"
            with tarfile.open(sdist) as archive:
                archive.extractall(unpacked, filter="data")
            origin = f"PyPI source distribution {sdist.name}"
        else:
            raise RuntimeError(f"unknown registry {source.registry!r}")
        if source.inner_zip:
            [zipped] = list(unpacked.glob(source.inner_zip))
            inner = tmp_path / "inner"
            with zipfile.ZipFile(zipped) as archive:
                names = [n for n in archive.namelist() if any(Path(n).match(g) for g in source.include)]
                archive.extractall(inner, names)
            unpacked = inner
        target.mkdir(parents=True, exist_ok=True)
        copied = 0
        for path in matching_files(unpacked, source.include, source.exclude):
            dest = target / path.relative_to(unpacked)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, dest)
            copied += 1
        if not copied:
            raise RuntimeError(f"no file of {source.package} matches {source.include}")
        return origin, "."


def _run(command: list[str], cwd: Path) -> None:
    if shutil.which(command[0]) is None and not Path(command[0]).exists():
        raise RuntimeError(f"{command[0]} is not installed")
    subprocess.run(command, cwd=cwd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def matching_files(root: Path, include, exclude=()) -> list[Path]:
    """Files under `root` matching any of the globs in `include` and none in `exclude`, sorted."""
    found: set[Path] = set()
    for pattern in include:
        found.update(p for p in root.glob(pattern) if p.is_file() and not p.is_symlink())
    return sorted(p for p in found if not any(p.relative_to(root).match(g) for g in exclude))


@dataclass(frozen=True)
class SourceFile:
    path: Path
    source: str
    """The source.json's name."""
    origin: str
    licence: str
    language: str | None = None
    """The source.json's language for every file, or None: from the file's extension."""


def read_sources(sources_dir: Path) -> list[SourceFile]:
    """Every file the sources folder's source.json files name, with where it came from."""
    files: list[SourceFile] = []
    for manifest_path in sorted(sources_dir.glob("*/source.json")):
        manifest = json.loads(manifest_path.read_text())
        root = manifest_path.parent / manifest.get("root", ".")
        for path in matching_files(root, manifest["include"], manifest.get("exclude", ())):
            files.append(SourceFile(path, manifest["name"], manifest["origin"], manifest["licence"],
                                    manifest.get("language")))
    return files
