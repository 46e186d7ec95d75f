"""Import resolution: which workspace files a file's imports (and its package) name.

Per language: Python modules and packages (absolute from the file's ancestors, relative
with dots, `from pkg import module`); JS/TS relative specifiers (extensions, `index`
files, `.js` written for a `.ts` source) and tsconfig/jsconfig `paths` under `baseUrl`;
Go packages of the module (go.mod's module path, or the standard library's `std`) and the
file's own package (its directory); Rust `mod x;`, `use crate::`/`super::`/`self::`;
Java imports (classes and `.*`) and the file's own package; C/C++ `#include "…"` from the
file's directory, else by the path's tail anywhere in the workspace. Bare package names
(site-packages, node_modules, the Go module cache) are not resolved: those files are not
indexed. Knows the index; knows nothing of cursors, tokens or LSP.
"""

from __future__ import annotations

import os

import msgspec

from .index import WorkspaceIndex
from .outline import Outline


class Link(msgspec.Struct, frozen=True):
    """A workspace file that a file's import (or its package) names."""

    path: str
    names: tuple[str, ...] = ()
    """Names imported from it; empty: the whole module (reached as `alias.name`, or the same package)."""
    alias: str | None = None
    """The name the module is bound to in the importing file, if any."""
    same_package: bool = False
    """The file's own package (Go, Java): its names are used bare."""


_JS_EXTENSIONS = (".ts", ".tsx", ".d.ts", ".js", ".jsx", ".mjs", ".cjs", ".mts", ".cts")


def resolve_imports(path: str, outline: Outline, index: WorkspaceIndex) -> list[Link]:
    """The workspace files `outline` (of the file at `path`) imports, in import order, deduplicated."""
    language = outline.language
    directory = os.path.dirname(path)
    links: list[Link] = []
    if language == "python":
        for ref in outline.imports:
            links.extend(_python(index, path, ref.spec, ref.names, ref.alias))
    elif language in ("javascript", "typescript", "tsx"):
        for ref in outline.imports:
            target = _js(index, directory, ref.spec)
            if target:
                links.append(Link(target, tuple(n for n in ref.names if n != "*"), ref.alias))
    elif language == "go":
        links.extend(Link(p, same_package=True) for p in _go_package(index, path, outline.package))
        for ref in outline.imports:
            alias = ref.alias or ref.spec.rsplit("/", 1)[-1]
            links.extend(Link(p, alias=alias) for p in _go_import(index, directory, ref.spec))
    elif language == "rust":
        for ref in outline.imports:
            links.extend(Link(p, ref.names) for p in _rust(index, path, ref.spec))
    elif language == "java":
        links.extend(Link(p, same_package=True) for p in sorted(index.by_dir.get(directory, ())) if p != path
                     and p.endswith(".java"))
        for ref in outline.imports:
            links.extend(_java(index, ref.spec))
    elif language in ("c", "cpp"):
        for ref in outline.imports:
            target = _include(index, directory, ref.spec)
            if target:
                links.append(Link(target))
    seen: set[tuple[str, tuple[str, ...]]] = set()
    unique = []
    for link in links:
        if link.path != path and (link.path, link.names) not in seen and link.path in index.files:
            seen.add((link.path, link.names))
            unique.append(link)
    return unique


# -- Python -------------------------------------------------------------------------------------


def _python(index: WorkspaceIndex, path: str, spec: str, names: tuple[str, ...], alias: str | None) -> list[Link]:
    dots = len(spec) - len(spec.lstrip("."))
    parts = [part for part in spec.lstrip(".").split(".") if part]
    if dots:
        base = os.path.dirname(path)
        for _ in range(dots - 1):
            base = os.path.dirname(base)
        bases = [base]
    else:
        bases = _python_bases(index, path)
    for base in bases:
        module = _python_module(index, os.path.join(base, *parts)) if parts else None
        package_dir = os.path.join(base, *parts)
        found: list[Link] = []
        if module is not None:
            found.append(Link(module, tuple(n for n in names if n != "*"), alias if not names else None))
        for name in names:  # `from pkg import module`
            submodule = _python_module(index, os.path.join(package_dir, name))
            if submodule is not None:
                found.append(Link(submodule, (), name))
        if found:
            return found
    return []


def _python_bases(index: WorkspaceIndex, path: str) -> list[str]:
    """Where absolute imports may start: the file's ancestors up to the workspace root, then its parent."""
    bases = []
    directory = os.path.dirname(path)
    while index.contains(directory):
        bases.append(directory)
        directory = os.path.dirname(directory)
    bases.extend([os.path.join(index.root, "src"), index.root])
    return bases


def _python_module(index: WorkspaceIndex, stem: str) -> str | None:
    for candidate in (stem + ".py", stem + ".pyi", os.path.join(stem, "__init__.py")):
        if candidate in index.files:
            return candidate
    return None


# -- JavaScript / TypeScript ---------------------------------------------------------------------


def _js(index: WorkspaceIndex, directory: str, spec: str) -> str | None:
    if spec.startswith("."):
        return _js_file(index, os.path.normpath(os.path.join(directory, spec)))
    mapped = index.ts_paths(directory)
    if mapped is None:
        return None
    base, paths = mapped
    for pattern, targets in paths.items():
        prefix, star, suffix = pattern.partition("*")
        if star and spec.startswith(prefix) and spec.endswith(suffix):
            middle = spec[len(prefix): len(spec) - len(suffix) if suffix else None]
        elif not star and spec == pattern:
            middle = ""
        else:
            continue
        for target in targets if isinstance(targets, list) else []:
            found = _js_file(index, os.path.normpath(os.path.join(base, str(target).replace("*", middle))))
            if found:
                return found
    return _js_file(index, os.path.normpath(os.path.join(base, spec)))  # baseUrl alone


def _js_file(index: WorkspaceIndex, stem: str) -> str | None:
    if stem in index.files:
        return stem
    root, ext = os.path.splitext(stem)
    if ext in (".js", ".jsx", ".mjs", ".cjs"):  # TypeScript's ESM convention: `./x.js` names x.ts
        for candidate in (root + ".ts", root + ".tsx", root + ".mts", root + ".cts"):
            if candidate in index.files:
                return candidate
    for extension in _JS_EXTENSIONS:
        for candidate in (stem + extension, os.path.join(stem, "index" + extension)):
            if candidate in index.files:
                return candidate
    return None


# -- Go ---------------------------------------------------------------------------------------------


def _go_files(index: WorkspaceIndex, directory: str, package: str | None, testing: bool) -> list[str]:
    files = []
    for candidate in sorted(index.by_dir.get(directory, ())):
        outline = index.files.get(candidate)
        if outline is None or outline.language != "go" or (candidate.endswith("_test.go") and not testing):
            continue
        if package is None or outline.package == package:
            files.append(candidate)
    return files


def _go_package(index: WorkspaceIndex, path: str, package: str) -> list[str]:
    return [p for p in _go_files(index, os.path.dirname(path), package, path.endswith("_test.go")) if p != path]


def _go_import(index: WorkspaceIndex, directory: str, spec: str) -> list[str]:
    module = index.go_module(directory)
    if module is None:
        return []
    name, module_dir = module
    if name == "std":
        target = os.path.join(module_dir, spec)
    elif spec == name or spec.startswith(name + "/"):
        target = os.path.join(module_dir, spec[len(name):].lstrip("/"))
    else:
        return []
    return _go_files(index, os.path.normpath(target), None, False)


# -- Rust ---------------------------------------------------------------------------------------------


def _rust(index: WorkspaceIndex, path: str, spec: str) -> list[str]:
    directory = os.path.dirname(path)
    stem = os.path.splitext(os.path.basename(path))[0]
    module_dir = directory if stem in ("mod", "lib", "main") else os.path.join(directory, stem)
    if spec.startswith("mod:"):
        return _rust_module(index, [os.path.join(module_dir, spec[4:])])
    parts = spec.split("::")
    if parts[0] == "crate":
        cargo = index.nearest(directory, "Cargo.toml")
        base = os.path.join(os.path.dirname(cargo), "src") if cargo else index.root
        parts = parts[1:]
    elif parts[0] == "super":
        base = os.path.dirname(module_dir)
        while parts and parts[0] == "super":
            parts = parts[1:]
    elif parts[0] == "self":
        base, parts = module_dir, parts[1:]
    else:
        return []
    if not parts:
        return _rust_module(index, [base]) or [p for p in (os.path.join(base, "lib.rs"),
                                                          os.path.join(base, "main.rs")) if p in index.files]
    # `use crate::a::b::C`: the module is a::b, or a when b is an item of a.
    return _rust_module(index, [os.path.join(base, *parts), os.path.join(base, *parts[:-1])] if len(parts) > 1
                        else [os.path.join(base, *parts)])


def _rust_module(index: WorkspaceIndex, stems: list[str]) -> list[str]:
    for stem in stems:
        for candidate in (stem + ".rs", os.path.join(stem, "mod.rs")):
            if candidate in index.files:
                return [candidate]
    return []


# -- Java ---------------------------------------------------------------------------------------------


def _java(index: WorkspaceIndex, spec: str) -> list[Link]:
    parts = spec.split(".")
    if parts[-1] == "*":
        tail = os.path.join(*parts[:-1]) if len(parts) > 1 else ""
        return [Link(p) for directory, paths in index.by_dir.items() if directory.endswith(os.sep + tail)
                for p in sorted(paths) if p.endswith(".java")]
    # a.b.C or a.b.C.member (static import): the longest prefix that names a file
    for cut in range(len(parts), 0, -1):
        name = parts[cut - 1] + ".java"
        tail = os.sep + os.path.join(*parts[:cut]) + ".java"
        matches = [p for p in index.by_name.get(name, ()) if p.endswith(tail)]
        if matches:
            return [Link(matches[0], tuple(parts[cut:]))]
    return []


# -- C / C++ --------------------------------------------------------------------------------------------


def _include(index: WorkspaceIndex, directory: str, spec: str) -> str | None:
    local = os.path.normpath(os.path.join(directory, spec))
    if local in index.files:
        return local
    tail = os.sep + os.path.normpath(spec)
    matches = sorted(p for p in index.by_name.get(os.path.basename(spec), ()) if p.endswith(tail))
    return matches[0] if matches else None
