"""`dgemma-lsp bench crossfile`: context recall of the cross-file snippets, model-free.

On real multi-file code on this machine (Python standard-library packages, JS/TS npm
packages, Go standard-library packages), a hole is a line whose code (from its first
non-blank character) uses a name that is defined in another file of the same package and
appears nowhere else in the current file: the model cannot find it in the window. A name the
line declares (a parameter, an object literal's key, a field or method being written) is not a
use, there or elsewhere on the line (`(total) => total + 1`): no other file's definition is what
such a line needs. The hole line's code is cut out, the context is built at its start as the
server builds it, and the cross-file snippets are gathered with the file alone open (definitions only: no open tabs,
no recent edits). Recall = share of holes whose prompt shows that name's definition (its
signature's first line). With the feature off the prompt holds only the current file, so
recall is 0 by construction: it is counted the same way, as a check. Tokens spent are the
snippets' estimated tokens with their file headings, against `--budget` (a quarter of the
default 2,048-token context); with `--tokenizer tokenizer.json` also the model's own count of the
snippets as the infill prompt renders them (their comment block). Holes are sampled with a fixed
seed, spread over the files.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field

import msgspec

from dgemma_lsp.engine.crossfile.files import indexable_language
from dgemma_lsp.engine.crossfile.gather import CrossFileSources, heading_tokens
from dgemma_lsp.engine.crossfile.index import WorkspaceIndex
from dgemma_lsp.engine.model.prompting import cross_file_comments
from dgemma_lsp.engine.syntax.context import build_context
from dgemma_lsp.engine.syntax.document import SyntaxDocument
from dgemma_lsp.engine.syntax.infill import DEFAULT_CONTEXT_TOKENS
from dgemma_lsp.engine.syntax.planning import plan_hole

from .report import say, write_report

PYTHON_PACKAGES = ("email", "asyncio", "importlib")
GO_PACKAGES = ("net/http", "go/types", "text/template", "crypto/tls")
NPM_SOURCES = {
    # package@version: the folder inside the tarball that holds its sources
    "rxjs@7.8.1": "package/src/internal",
    "yaml@2.6.1": "package/browser/dist",
}
_WORD = re.compile(r"[A-Za-z_$][A-Za-z0-9_$]*")
# Names of the languages' own built-in functions and the methods of built-in types: `items.append(x)`
# calls list.append even when some class of the package also defines an `append`.
_BUILTIN_NAMES = {
    "python": set(dir(__builtins__) if isinstance(__builtins__, dict) is False else __builtins__) | {
        name for kind in (list, dict, str, bytes, set, tuple, int, float, object, BaseException)
        for name in dir(kind)},
    "js": set("""push pop shift unshift slice splice map filter reduce forEach some every find findIndex
        includes indexOf join concat keys values entries has get set delete add clear then catch finally
        length toString valueOf call apply bind hasOwnProperty assign freeze create defineProperty
        isArray from of sort reverse fill flat flatMap trim split replace startsWith endsWith charAt
        charCodeAt substring toLowerCase toUpperCase padStart padEnd repeat match test exec next done
        value size resolve reject all race any stringify parse log error warn max min floor ceil abs
        Symbol iterator asyncIterator constructor prototype""".split()),
    "go": set("""append cap close complex copy delete imag len make new panic print println real recover
        Error String Len Less Swap Read Write Close
        any bool byte comparable complex64 complex128 error float32 float64 int int8 int16 int32 int64 rune
        string uint uint8 uint16 uint32 uint64 uintptr true false iota nil""".split()),
}
_QUALIFIED = re.compile(r"\b([A-Za-z_][A-Za-z0-9_]*)\s*\.\s*([A-Za-z_][A-Za-z0-9_]*)")
_IMPORT_LINE = re.compile(r"^\s*(import|from|export \* from|export \{|#include|use |package |mod )")


@dataclass
class Tally:
    language: str
    holes: int = 0
    recalled: int = 0
    recalled_off: int = 0
    tokens: list[int] = field(default_factory=list)
    model_tokens: list[int] = field(default_factory=list)
    gather_ms: list[float] = field(default_factory=list)
    packages: list[str] = field(default_factory=list)


class LanguageFigures(msgspec.Struct):
    language: str
    packages: list[str]
    holes: int
    recall_off: float
    recall_on: float
    tokens_mean: float
    tokens_p90: int
    budget: int
    model_tokens_mean: float | None
    """With --tokenizer: the tokenizer's count of the snippets' comment block in the prompt."""
    model_tokens_max: int | None
    gather_cpu_ms_p50: float
    gather_cpu_ms_p99: float


class Report(msgspec.Struct):
    budget: int
    context_tokens: int
    languages: list[LanguageFigures]
    index_files: int
    index_cpu_s: float


def find_corpora(npm_dir: str | None) -> dict[str, list[tuple[str, str]]]:
    """language -> [(package name, folder)] of what this machine has."""
    corpora: dict[str, list[tuple[str, str]]] = {"python": [], "javascript/typescript": [], "go": []}
    stdlib = os.path.dirname(os.__file__)
    for name in PYTHON_PACKAGES:
        if os.path.isdir(os.path.join(stdlib, name)):
            corpora["python"].append((name, os.path.join(stdlib, name)))
    go_roots = sorted(p for p in ("/usr/share/go/src", *(f"/usr/lib/go-1.{v}/src" for v in range(30, 17, -1)))
                      if os.path.isdir(p))
    for name in GO_PACKAGES:
        for root in go_roots[:1]:
            if os.path.isdir(os.path.join(root, name)):
                corpora["go"].append((name, os.path.join(root, name)))
    if npm_dir:
        for spec, inner in NPM_SOURCES.items():
            folder = os.path.join(npm_dir, spec.split("@")[0], inner)
            if os.path.isdir(folder):
                corpora["javascript/typescript"].append((spec, folder))
    return corpora


def _workspace(tmp: str, name: str, folder: str, language: str) -> tuple[str, str]:
    """A workspace holding the package where its imports expect it; (workspace root, package dir)."""
    root = os.path.join(tmp, re.sub(r"[^A-Za-z0-9]+", "_", name))
    if language == "go":
        target = os.path.join(root, name)
        shutil.copytree(folder, target, ignore=shutil.ignore_patterns("testdata"))
        with open(os.path.join(root, "go.mod"), "w") as file:
            file.write("module std\n")
    elif language == "python":
        target = os.path.join(root, name)
        shutil.copytree(folder, target, ignore=shutil.ignore_patterns("__pycache__"))
    else:
        target = os.path.join(root, "src")
        shutil.copytree(folder, target)
    return root, target


def _code_names(text: str, language: str) -> dict[int, list[str]]:
    """Per line whose first non-blank character is code: the identifiers of its code, in order
    (names in strings and comments are not uses of a definition)."""
    doc = SyntaxDocument(text, language)
    names: dict[int, list[tuple[int, str]]] = {}
    if doc.tree is None:
        return {}
    starts_in_code: set[int] = set()
    root = doc.tree.root_node
    offset = 0
    for number, line in enumerate(text.split("\n")):
        stripped = len(line) - len(line.lstrip())
        if line.strip():
            probe = doc.byte_offset(offset + stripped)
            node = root.descendant_for_byte_range(probe, probe)
            while node is not None and not _is_text(node):
                node = node.parent
            if node is None:
                starts_in_code.add(number)
        offset += len(line) + 1
    declared: dict[int, set[str]] = {}
    stack = [root]
    while stack:
        node = stack.pop()
        if _is_text(node):
            continue
        if node.child_count == 0 and node.type.endswith("identifier") and node.start_point.row in starts_in_code:
            if _declares(node):
                declared.setdefault(node.start_point.row, set()).add(node.text.decode())
            else:
                names.setdefault(node.start_point.row, []).append((node.start_byte, node.text.decode()))
        stack.extend(node.children)
    # A name the line declares is the line's own where it is used too (`(total) => total + 1`).
    return {row: [name for _start, name in sorted(found) if name not in declared.get(row, ())]
            for row, found in names.items()}


_DECLARED_BY_FIELD = {
    # parent node type -> its fields that name what it declares (a new name, not a use of another's)
    "pair": "key",  # JS object literal {end: ']'}
    "required_parameter": "pattern", "optional_parameter": "pattern",
    "property_signature": "name", "method_signature": "name", "method_definition": "name",
    "public_field_definition": "name", "variable_declarator": "name",
    "function_declaration": "name", "class_declaration": "name", "function_definition": "name",
    "class_definition": "name", "default_parameter": "name", "typed_default_parameter": "name",
    "parameter_declaration": "name", "field_declaration": "name", "method_elem": "name",
    "method_declaration": "name", "type_spec": "name", "const_spec": "name", "var_spec": "name",
}
_DECLARED_CHILDREN = {"formal_parameters", "parameters", "typed_parameter"}
"""Parents whose identifier children are all declared names (plain parameters)."""


def _declares(node) -> bool:
    """Whether the identifier `node` names what its code declares (a parameter, an object literal's key,
    a field or method of an interface or class being written): a new name, whatever the package
    also defines, so no other file's definition is what the line needs."""
    parent = node.parent
    if parent is None:
        return False
    if parent.type in _DECLARED_CHILDREN:
        return True
    field = _DECLARED_BY_FIELD.get(parent.type)
    return field is not None and any(child == node for child in parent.children_by_field_name(field))


def _is_text(node) -> bool:
    return "string" in node.type or "comment" in node.type or node.type in ("template_literal", "raw_string_literal")


def holes_of(index: WorkspaceIndex, package_dir: str, seed: int, limit: int) -> list[tuple[str, int, str]]:
    """(path, line, target name) for holes in the package, sampled evenly over its files.

    The package is the package folder with its subfolders (Python packages, an npm package's
    sources), or the folder alone (a Go package)."""
    nested = not any(outline.language == "go" for outline in index.files.values())
    files = sorted(p for p in index.files if os.path.dirname(p) == package_dir or
                   (nested and p.startswith(package_dir + os.sep)))
    files = [p for p in files if not p.endswith(("_test.go", ".d.ts", ".spec.ts", ".test.ts"))]
    defined: dict[str, set[str]] = {}
    for path in files:
        for definition in index.files[path].definitions:
            defined.setdefault(definition.name, set()).add(path)
    by_file: list[list[tuple[str, int, str]]] = []
    for path in files:
        with open(path, encoding="utf-8") as handle:
            lines = handle.read().split("\n")
        counts: dict[str, int] = {}
        for line in lines:
            for word in set(_WORD.findall(line)):
                counts[word] = counts.get(word, 0) + 1
        own = {definition.name for definition in index.files[path].definitions}
        language = index.files[path].language
        builtin = _BUILTIN_NAMES.get(language, _BUILTIN_NAMES["js"])
        code_names = _code_names("\n".join(lines), language)
        # Go: a name qualified by an imported package (`strings.Index`) is that package's, never one of
        # this package's files (a package cannot import itself), whatever this package also defines.
        packages = {ref.alias or ref.spec.rsplit("/", 1)[-1] for ref in index.files[path].imports} \
            if language == "go" else set()
        found = []
        for number, line in enumerate(lines):
            code = line.strip()
            if number not in code_names or _IMPORT_LINE.match(line) or len(code) > 120:
                continue
            foreign = {name for qualifier, name in _QUALIFIED.findall(line) if qualifier in packages}
            for word in code_names[number]:
                if len(word) < 3 or word in own or word in builtin or counts.get(word, 0) != 1 or word in foreign \
                        or not (defined.get(word, set()) - {path}):
                    continue
                found.append((path, number, word))
                break
        by_file.append(found)
    rng = random.Random(seed)
    sampled: list[tuple[str, int, str]] = []
    for found in by_file:
        rng.shuffle(found)
    while len(sampled) < limit and any(by_file):
        for found in by_file:
            if found and len(sampled) < limit:
                sampled.append(found.pop())
    return sampled


def definition_lines(index: WorkspaceIndex, name: str, path: str) -> list[tuple[str, str]]:
    """(relative path, first signature line) of each definition of `name` outside `path`."""
    found = []
    for other, outline in index.files.items():
        if other == path:
            continue
        for definition in outline.definitions:
            if definition.name == name:
                found.append((index.relative(other), definition.signature.split("\n")[0].strip()))
    return found


def measure(index: WorkspaceIndex, holes, budget: int, context_tokens: int, tally: Tally, tokenizer=None) -> None:
    sources = CrossFileSources(index)
    for path, line_number, name in holes:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
        lines = text.split("\n")
        line = lines[line_number]
        indent = line[: len(line) - len(line.lstrip())]
        lines[line_number] = indent
        holed = "\n".join(lines)
        offset = sum(len(previous) + 1 for previous in lines[:line_number]) + len(indent)
        index.update(path, holed)  # the index sees the file as the editor has it: without the answer
        doc = SyntaxDocument(holed, indexable_language(path) or "plaintext")
        context = build_context(doc, offset, plan_hole(doc, offset), context_tokens)
        started = time.process_time()
        snippets = sources.snippets(path, doc.language, context, budget)
        tally.gather_ms.append((time.process_time() - started) * 1000)
        index.update(path, text)
        wanted = definition_lines(index, name, path)
        shown, headings = {}, {}
        for snippet in snippets:
            shown.setdefault(snippet.path, []).append(snippet.text)
            headings[snippet.path] = snippet.heading
        in_file = context.preamble + context.prefix + context.suffix
        tally.holes += 1
        tally.recalled += any(sig in "\n".join(shown.get(rel, ())) for rel, sig in wanted)
        tally.recalled_off += any(sig in in_file for _rel, sig in wanted)
        tally.tokens.append(sum(s.tokens for s in snippets) + sum(heading_tokens(h) for h in headings.values()))
        if tokenizer is not None and snippets:
            rendered = cross_file_comments(snippets, doc.language)
            tally.model_tokens.append(len(tokenizer.encode(rendered, add_special_tokens=False).ids))


def run_benchmark(npm_dir: str | None, budget: int, context_tokens: int, holes_per_package: int,
                  seed: int, tokenizer_path: str | None = None) -> Report:
    tokenizer = None
    if tokenizer_path:
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(tokenizer_path)
    corpora = find_corpora(npm_dir)
    figures = []
    index_files = 0
    index_cpu = 0.0
    with tempfile.TemporaryDirectory(prefix="dgemma-crossfile-") as tmp:
        for group, packages in corpora.items():
            tally = Tally(group)
            for name, folder in packages:
                language = "go" if group == "go" else ("python" if group == "python" else "js")
                root, package_dir = _workspace(tmp, name, folder, language)
                started = time.process_time()
                index = WorkspaceIndex(root)
                index.build()
                index_cpu += time.process_time() - started
                index_files += len(index)
                holes = holes_of(index, package_dir, seed, holes_per_package)
                say(f"bench crossfile: {group} {name}: {len(index)} files, {len(holes)} holes")
                measure(index, holes, budget, context_tokens, tally, tokenizer)
                tally.packages.append(name)
            if not tally.holes:
                say(f"bench crossfile: no {group} code found on this machine (see --npm-dir, golang-src)")
                continue
            tokens = sorted(tally.tokens)
            gather = sorted(tally.gather_ms)
            figures.append(LanguageFigures(
                language=group, packages=tally.packages, holes=tally.holes,
                recall_off=tally.recalled_off / tally.holes, recall_on=tally.recalled / tally.holes,
                tokens_mean=round(statistics.mean(tokens), 1), tokens_p90=tokens[int(0.9 * (len(tokens) - 1))],
                budget=budget,
                model_tokens_mean=round(statistics.mean(tally.model_tokens), 1) if tally.model_tokens else None,
                model_tokens_max=max(tally.model_tokens) if tally.model_tokens else None,
                gather_cpu_ms_p50=round(gather[len(gather) // 2], 2),
                gather_cpu_ms_p99=round(gather[int(0.99 * (len(gather) - 1))], 2)))
    return Report(budget=budget, context_tokens=context_tokens, languages=figures, index_files=index_files,
                  index_cpu_s=round(index_cpu, 2))


KEYSTROKE_S = 0.1
"""The cost benchmark's simulated typist: a keystroke (a stop) every 100 ms of wall time."""


class CostFigures(msgspec.Struct):
    workspace: str
    files: int
    bytes: int
    entries_bound: int
    cpu_s: float
    peak_mib: float
    """Peak of Python allocations while building (tracemalloc), index kept."""
    longest_step_ms: float
    """Longest CPU stretch between two checks of `should_stop` (what a keystroke may wait for)."""


def measure_cost(root: str, bounds) -> CostFigures:
    """Build an index of `root` as the server does (step by step, checking between files)."""
    import tracemalloc

    index = WorkspaceIndex(root, bounds)
    longest = 0.0
    last = [time.process_time()]

    keystroke = [time.monotonic()]

    def should_stop() -> bool:
        """Checked between files and during each parse; a keystroke every KEYSTROKE_S stops the build."""
        nonlocal longest
        now = time.process_time()
        longest = max(longest, now - last[0])
        last[0] = now
        if time.monotonic() - keystroke[0] > KEYSTROKE_S:
            keystroke[0] = time.monotonic()
            return True
        return False

    tracemalloc.start()
    started = time.process_time()
    while not index.build_step(should_stop):
        last[0] = time.process_time()  # the worker served the keystroke; the build resumes
    cpu = time.process_time() - started
    _current, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return CostFigures(workspace=root, files=len(index), bytes=index.bytes, entries_bound=bounds.max_entries,
                       cpu_s=round(cpu, 2), peak_mib=round(peak / 2**20, 1), longest_step_ms=round(longest * 1000, 1))


def synthetic_tree(folder: str, files: int) -> None:
    """`files` small Python files, 100 per folder."""
    for number in range(files):
        directory = os.path.join(folder, f"d{number // 100:04}")
        if number % 100 == 0:
            os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, f"m{number % 100:02}.py"), "w") as file:
            file.write(f"def helper_{number}(value):\n    return value + {number}\n\n\nclass Thing{number}:\n"
                       f"    size = {number}\n")


def format_table(report: Report) -> str:
    out = [f"cross-file context recall, budget {report.budget} tokens of a {report.context_tokens}-token context",
           f"{'language':24} {'holes':>6} {'off':>6} {'on':>6} {'tokens mean':>12} {'p90':>5} {'gather ms p50/p99':>18}"]
    for f in report.languages:
        out.append(f"{f.language:24} {f.holes:>6} {f.recall_off:>6.1%} {f.recall_on:>6.1%} {f.tokens_mean:>12} "
                   f"{f.tokens_p90:>5} {f.gather_cpu_ms_p50:>8} / {f.gather_cpu_ms_p99:<8}")
        if f.model_tokens_mean is not None:
            out.append(f"  the model's tokenizer: mean {f.model_tokens_mean}, max {f.model_tokens_max} tokens")
        out.append(f"  packages: {', '.join(f.packages)}")
    out.append(f"index: {report.index_files} files, {report.index_cpu_s} s CPU in all")
    return "\n".join(out)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--npm-dir", default=os.environ.get("DGEMMA_BENCH_NPM_DIR"),
                        help="folder with unpacked npm tarballs (<name>/package/...): rxjs@7.8.1, yaml@2.6.1")
    parser.add_argument("--context-tokens", type=int, default=DEFAULT_CONTEXT_TOKENS)
    parser.add_argument("--budget", type=int, default=None, help="cross-file tokens (default: a quarter of the context)")
    parser.add_argument("--holes", type=int, default=150, help="holes per package")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--tokenizer", metavar="TOKENIZER_JSON", default=None,
                        help="also count the snippets with this tokenizer (the model's tokenizer.json)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--cost", metavar="FOLDER", default=None,
                        help="instead: index build cost of FOLDER (first --cost-files files) and of a generated "
                             "--huge-files tree under the default bounds")
    parser.add_argument("--cost-files", type=int, default=2000)
    parser.add_argument("--huge-files", type=int, default=100_000)


def run_cost(args: argparse.Namespace) -> int:
    from dgemma_lsp.engine.crossfile.files import Bounds

    figures = [measure_cost(os.path.abspath(args.cost), Bounds(max_files=args.cost_files))]
    with tempfile.TemporaryDirectory(prefix="dgemma-huge-tree-") as tmp:
        say(f"bench crossfile: writing {args.huge_files} files under {tmp}")
        synthetic_tree(tmp, args.huge_files)
        figures.append(measure_cost(tmp, Bounds()))
    if args.json:
        write_report(figures, True, str)
    else:
        for f in figures:
            sys.stdout.write(f"{f.workspace}: {f.files} files, {f.bytes} bytes, {f.cpu_s} s CPU, peak "
                             f"{f.peak_mib} MiB, longest step {f.longest_step_ms} ms CPU\n")
    return 0


def run(args: argparse.Namespace) -> int:
    if args.cost:
        return run_cost(args)
    budget = args.budget if args.budget is not None else args.context_tokens // 4
    report = run_benchmark(args.npm_dir, budget, args.context_tokens, args.holes, args.seed, args.tokenizer)
    write_report(report, args.json, format_table)
    return 0 if report.languages else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    sys.exit(run(parser.parse_args()))
