"""The infill oracle (not a test): `dgemma-lsp bench oracle`, model-free and deterministic.

Everything between the model and the editor (hole planning, trimming, stopping, re-indenting,
ranking) is checked here without a model: holes are cut from real code the way an editor sees
them, the true middle is handed to the real pipeline as if the model had written it
(`prepare_infill` -> `candidate_checker` -> `finish_candidates`, as server/completions.py calls
them, on a document parsed whole), and the finished top candidate must rebuild the original file.

Hole kinds (cut from each file, a few of each, by a seeded RNG per file):
- line: the cursor at a token boundary of a code line, the rest of the line removed;
- expression: inside a bracket pair on one line, cursor at a token boundary, the middle up to
  the closer removed and the closer kept (an editor that auto-closes brackets);
- expression-open: the same cursor, the closer and the rest of the line removed too (no auto-close);
- statement: one statement among its siblings removed; the cursor on its (auto-indented) blank line;
- multi-line: two to four consecutive statements removed the same way;
- block: every statement of a body removed; the cursor on the body's indented blank line.
Statement, multi-line and block holes need the language's statement-holding node types
(`languages.BLOCK_TYPES`); a language without them gets the line and expression kinds.

Answers (variants) for each hole:
- truth: the removed text;
- run-on: the truth followed by the next 200 characters of the file (the model runs on);
- foreign: the truth, then the closers of brackets the suffix already closes (each on its own line
  after a line hole), then a top-level declaration from another file of the language: code that
  cannot belong to the hole;
- fenced: the truth in a Markdown code fence;
- repeated: the line before the cursor (its text before the cursor, or, on a blank line, the
  previous code line) repeated before the truth;
- outdented (languages whose indentation is syntax, holes in an indented block): the truth, then
  on the very next line, at column 0, the first line of a top-level declaration from another file:
  the model running on past the block with code that is not the suffix's, which only the
  indentation ends (a blank line between, the foreign answer, is the easier case).

Pass: the finished top candidate, inserted at the cursor in place of the `replace_chars` it
replaces, rebuilds the original file: exactly where indentation is syntax (INDENT_SYNTAX; but for
spaces at a line's end, which the pipeline trims and no grammar reads), with whitespace
ignored between tokens elsewhere; CRLF and LF count as the same line end (an editor
inserts text in its own line ends). Files are read as they are, except that, to cover what
editors see, every fifth file is read with CRLF line ends, every fifth (offset by two) with
its indentation in tabs, and every fifth (offset by four) with a line of non-ASCII text at
the top (a comment). Each figure says which source it came from (`source.json` in the
sources folder, see bench/oracle_sources.py). Pure CPU, no torch.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
import zlib
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from dgemma_lsp.engine.api import DenoiseResult, GenerationSettings, RawCandidate, Timings
from dgemma_lsp.engine.syntax.brackets import CLOSERS, OPENERS, code_chars, first_unmatched_closer
from dgemma_lsp.engine.syntax.document import SyntaxDocument
from dgemma_lsp.engine.syntax.infill import candidate_checker, finish_candidates, prepare_infill
from dgemma_lsp.engine.syntax.languages import (
    BLOCK_TYPES,
    DEFINITION_TYPES,
    LANGUAGES,
    PLAINTEXT,
    language_for_path,
)

from .oracle_sources import DEFAULT_SOURCES, SourceFile, fetch, read_sources

KINDS = ("line", "expression", "expression-open", "statement", "multi-line", "block")
VARIANTS = ("truth", "run-on", "foreign", "fenced", "repeated", "outdented")
TARGETS = {"truth": 0.995, "run-on": 0.97, "foreign": 0.97, "fenced": 0.97, "repeated": 0.97, "outdented": 0.97}
INDENT_SYNTAX = frozenset({"python", "yaml", "haskell", "nim", "fsharp"})
"""Languages whose indentation is syntax: compared exactly."""
COMMENT_MARKS = {"python": "#", "lua": "--", "ruby": "#", "bash": "#", "yaml": "#", "toml": "#"}
"""Line comment marker for the non-ASCII line; `//` for the rest, None for none (no such line)."""
NO_LINE_COMMENT = frozenset({"json", "html", "css"})
RUN_ON_CHARS = 200
MAX_LINES = {"statement": 12, "multi-line": 12, "block": 24}
"""The longest truth per kind (within the planner's caps: statement 16, block 32 lines)."""
MAX_FILE_CHARS = 150_000
NON_ASCII_LINE = "Größe — naïve café, 日本語のテキスト, Ελληνικά"


@dataclass(frozen=True)
class Hole:
    kind: str
    start: int
    """Cursor (str offset in the original text)."""
    end: int
    """End of the removed text."""


@dataclass
class Outcome:
    language: str
    kind: str
    variant: str
    passed: bool
    source: str
    path: str
    detail: dict = field(default_factory=dict)


# --- reading files ---------------------------------------------------------------------------


def load_text(file: SourceFile, index: int, language: str) -> tuple[str, str]:
    """The file's text as the oracle reads it (see the module docstring), and the transform's name."""
    text = file.path.read_text(encoding="utf-8", errors="replace").replace("\r\n", "\n")
    if index % 5 == 0:
        return text.replace("\n", "\r\n"), "crlf"
    if index % 5 == 2 and language not in INDENT_SYNTAX:
        return _tabify(text), "tabs"
    if index % 5 == 4 and language not in NO_LINE_COMMENT:
        mark = COMMENT_MARKS.get(language, "//")
        return f"{mark} {NON_ASCII_LINE}\n" + text, "non-ascii"
    return text, "as-is"


def _tabify(text: str) -> str:
    """Each indentation step (the narrowest indentation in the file) as a tab."""
    lines = text.split("\n")
    widths = [len(line) - len(line.lstrip(" ")) for line in lines if line.strip()]
    unit = min((w for w in widths if w), default=4)
    out = []
    for line in lines:
        body = line.lstrip(" ")
        width = len(line) - len(body)
        out.append("\t" * (width // unit) + " " * (width % unit) + body)
    return "\n".join(out)


# --- cutting holes ---------------------------------------------------------------------------


def cut_holes(doc: SyntaxDocument, rng: random.Random, per_kind: int) -> list[Hole]:
    """Up to `per_kind` holes of each kind in the document (as parsed, with no hole yet)."""
    text = doc.text
    lines = _line_spans(text)
    holes: list[Hole] = []
    line_pool, expr_pool = [], []
    for start, end in lines:
        line = text[start:end]
        if not line.strip() or line != line.rstrip() or len(line.strip()) < 2:
            continue
        indent = len(line) - len(line.lstrip())
        for col in _boundaries(line, indent + 1, len(line)):
            if not _in_string_or_comment(doc, start + col):
                line_pool.append(Hole("line", start + col, end))
        for open_at, close_at in _bracket_pairs(line):
            for col in _boundaries(line, open_at + 1, close_at + 1):
                middle = text[start + col:start + close_at]
                if middle.strip() and first_unmatched_closer(middle) is None \
                        and not _in_string_or_comment(doc, start + col):
                    expr_pool.append((start + col, start + close_at, end))
    for kind, pool in (("line", line_pool), ("expression", expr_pool), ("expression-open", expr_pool)):
        for pick in _sample(rng, pool, per_kind):
            if kind == "line":
                holes.append(pick)
            else:
                cursor, closer, line_end = pick
                holes.append(Hole(kind, cursor, closer if kind == "expression" else line_end))
    if doc.tree is not None and doc.language in BLOCK_TYPES:
        statements, runs, blocks = _statement_pools(doc)
        holes += _sample(rng, statements, per_kind)
        holes += _sample(rng, runs, per_kind)
        holes += _sample(rng, blocks, per_kind)
    return holes


def _sample(rng: random.Random, pool: list, count: int) -> list:
    return rng.sample(pool, min(count, len(pool)))


def _line_spans(text: str) -> list[tuple[int, int]]:
    """(start, end) of each line, the end before its `\\r\\n` or `\\n`."""
    spans, pos = [], 0
    for line in text.split("\n"):
        end = pos + len(line)
        spans.append((pos, end - 1 if line.endswith("\r") else end))
        pos = end + 1
    return spans


def _boundaries(line: str, start: int, end: int) -> list[int]:
    """Columns in [start, end) where a token ends or begins: where a cursor usually stands."""
    def word(c: str) -> bool:
        return c.isalnum() or c == "_"
    return [i for i in range(max(start, 1), end) if not (word(line[i - 1]) and word(line[i]))
            and not (line[i - 1] == " " and line[i] == " ")]


def _bracket_pairs(line: str) -> list[tuple[int, int]]:
    """(opener, closer) columns of bracket pairs opened and closed on the line, outside strings."""
    stack, pairs = [], []
    for i, c in code_chars(line):
        if c in OPENERS:
            stack.append((i, c))
        elif c in CLOSERS:
            if stack and stack[-1][1] == CLOSERS[c]:
                pairs.append((stack.pop()[0], i))
            else:
                stack.clear()
    return pairs


def _in_string_or_comment(doc: SyntaxDocument, offset: int) -> bool:
    if doc.tree is None:
        return False
    byte = doc.byte_offset(offset)
    node = doc.tree.root_node.descendant_for_byte_range(byte, byte)
    while node is not None:
        if ("string" in node.type or "comment" in node.type or "char" in node.type) \
                and node.start_byte < byte < node.end_byte:
            return True
        node = node.parent
    return False


def _statement_pools(doc: SyntaxDocument) -> tuple[list[Hole], list[Hole], list[Hole]]:
    text = doc.text
    types = BLOCK_TYPES[doc.language]
    statements, runs, blocks = [], [], []
    stack = [doc.tree.root_node]
    while stack:
        node = stack.pop()
        stack.extend(node.named_children)
        if node.type not in types or node.has_error:
            continue
        children = [c for c in node.named_children if "comment" not in c.type and c.type not in _NOT_STATEMENTS]
        whole = [(c, *_whole_lines(doc, c)) for c in children]
        spans = [(s, e) for _, s, e in whole if s is not None]
        if len(children) >= 2:
            for s, e in spans:
                if _rows(text, s, e) <= MAX_LINES["statement"]:
                    statements.append(Hole("statement", s, e))
            for i in range(len(whole) - 1):
                for j in range(i + 1, min(i + 4, len(whole))):
                    if all(w[1] is not None for w in whole[i:j + 1]) and (i > 0 or j < len(whole) - 1):
                        s, e = whole[i][1], whole[j][2]
                        if _rows(text, s, e) <= MAX_LINES["multi-line"]:
                            runs.append(Hole("multi-line", s, e))
        if node.parent is not None and children and whole[0][1] is not None and whole[-1][2] is not None:
            s, e = whole[0][1], whole[-1][2]
            header_end = text.rfind("\n", 0, s)
            opener_line = text[text.rfind("\n", 0, max(header_end, 0)) + 1:max(header_end, 0)].rstrip()
            if header_end > 0 and opener_line.endswith(("{", ":", ")", "then", "do", "else")) \
                    and _rows(text, s, e) <= MAX_LINES["block"]:
                blocks.append(Hole("block", s, e))
    return statements, runs, blocks


_NOT_STATEMENTS = frozenset({"start_tag", "end_tag", "elif_clause", "else_clause", "rescue", "else", "elsif",
                             "ensure"})
"""Children of a statement-holding node that are its delimiters, not statements: an HTML element's
tags, Bash's `elif`/`else` clauses, Ruby's `rescue`/`else`/`elsif`/`ensure` (like a brace
language's `}` and `else`, which no statement hole there can take either)."""


def _whole_lines(doc: SyntaxDocument, node) -> tuple[int | None, int | None]:
    """(node start, end of its last line) when the node starts its line and nothing follows it there.
    A node whose span takes its last line's end (YAML's mappings) ends before it: the hole keeps
    the file's last line end, as an editor's does."""
    text = doc.text
    start, end = doc.node_span(node)
    end = start + len(text[start:end].rstrip("\r\n"))
    line_start = text.rfind("\n", 0, start) + 1
    line_end = text.find("\n", end)
    line_end = len(text) if line_end < 0 else line_end
    if text[line_start:start].strip() or text[end:line_end].strip():
        return None, None
    if text[line_end - 1:line_end] == "\r":
        line_end -= 1
    return start, line_end


def _rows(text: str, start: int, end: int) -> int:
    return text.count("\n", start, end) + 1


# --- answers ---------------------------------------------------------------------------------


def answers(language: str, hole: Hole, text: str, foreign_decl: str | None) -> dict[str, str]:
    """The raw middle of each variant for `hole` in the original `text`."""
    truth = text[hole.start:hole.end]
    suffix = text[hole.end:]
    prefix = text[:hole.start]
    out = {"truth": truth, "run-on": truth + suffix[:RUN_ON_CHARS]}
    line_before = prefix[prefix.rfind("\n") + 1:]
    top_level = hole.kind in ("statement", "multi-line") and not line_before
    if foreign_decl is not None and not top_level:
        # (At the top level a new declaration may well belong to a statement hole: not foreign there.)
        closers = _closers_ahead(truth, suffix)
        joint = "" if hole.kind == "expression" else "\n"
        eol = "\r\n" if "\r\n" in text else "\n"
        out["foreign"] = truth + "".join(joint + c for c in closers) + eol + eol + foreign_decl
    out["fenced"] = f"```{language}\n{truth}\n```\n"
    if line_before.strip():
        out["repeated"] = line_before + truth
    else:
        head = prefix[:len(prefix) - len(line_before)].rstrip("\r\n")
        lines = [line for line in head.split("\n")[-8:] if line.strip()]
        previous = lines[-1].rstrip("\r") if lines else ""
        out["repeated"] = previous + "\n" + line_before + truth if previous else truth
    if foreign_decl is not None and language in INDENT_SYNTAX and line_before[:1] in (" ", "\t"):
        eol = "\r\n" if "\r\n" in text else "\n"
        out["outdented"] = truth + eol + foreign_decl.split("\n", 1)[0].rstrip("\r")
    return out


def _closers_ahead(truth: str, suffix: str, count: int = 2) -> list[str]:
    """The first `count` closers in the suffix that close brackets opened before the hole."""
    depth, found = 0, []
    for i, c in code_chars(truth + suffix[:4000]):
        if c in OPENERS:
            depth += 1
        elif c in CLOSERS:
            depth -= 1
            if depth < 0:
                if i >= len(truth):
                    found.append(c)
                depth = 0
                if len(found) >= count:
                    break
    return found


_FOREIGN_NODES = {"html": frozenset({"element"})}
"""Where a language has no definitions: the nodes a foreign answer may take (a page is one `<html>`)."""


def top_level_declaration(doc: SyntaxDocument) -> str | None:
    """A top-level declaration of 2 to 15 lines starting at column 0, or else a definition
    (`languages.DEFINITION_TYPES`) of that size from deeper in, moved to column 0; or None."""
    if doc.tree is None:
        return None
    for node in doc.tree.root_node.named_children:
        if "comment" in node.type or node.has_error:
            continue
        start, end = doc.node_span(node)
        if start > 0 and doc.text[start - 1] != "\n":
            continue
        if 2 <= _rows(doc.text, start, end) <= 15:
            return doc.text[start:end]
    definitions = DEFINITION_TYPES.get(doc.language) or _FOREIGN_NODES.get(doc.language, frozenset())
    stack = [doc.tree.root_node]
    while stack:
        node = stack.pop()
        stack.extend(reversed(node.named_children))
        if node.type not in definitions or node.has_error:
            continue
        start, end = doc.node_span(node)
        line_start = doc.text.rfind("\n", 0, start) + 1
        indent = doc.text[line_start:start]
        if not indent.strip() and 2 <= _rows(doc.text, start, end) <= 15:
            lines = doc.text[line_start:end].split("\n")
            return "\n".join(line[len(indent):] if line.startswith(indent) else line.lstrip() for line in lines)
    return None


# --- judging -------------------------------------------------------------------------------------


_SPACE = re.compile(r"\s+")
_SPACE_AT_EOL = re.compile(r"[ \t]+\n")
_SPACE_AT_PUNCT = re.compile(r" (?=\W)|(?<=\W) ")


def _normal(text: str, exact: bool) -> str:
    text = text.replace("\r\n", "\n")
    if exact:
        return _SPACE_AT_EOL.sub("\n", text)
    return _SPACE_AT_PUNCT.sub("", _SPACE.sub(" ", text))


def rebuilds(original: str, hole: Hole, inserted: str, replace_chars: int, exact: bool) -> bool:
    """Whether the document with the hole, `inserted` at the cursor, is the original (around the hole)."""
    window = 300
    lo = max(0, hole.start - window)
    after = original[hole.end + replace_chars:hole.end + replace_chars + window]
    if replace_chars > len(original) - hole.end:
        return False
    rebuilt = original[lo:hole.start] + inserted + after
    truth = original[lo:hole.end + replace_chars + window]
    return _normal(rebuilt, exact) == _normal(truth, exact)


def run_hole(language: str, text: str, hole: Hole, foreign_decl: str | None,
             as_language: str | None = None) -> dict[str, tuple[bool, str, int]]:
    """Each variant's (passed, finished text, replace_chars) for one hole, through the real pipeline."""
    holed = text[:hole.start] + text[hole.end:]
    doc = SyntaxDocument(holed, as_language or language)
    prepared = prepare_infill(doc, hole.start, GenerationSettings())
    checker = candidate_checker(prepared, doc)
    exact = language in INDENT_SYNTAX
    out = {}
    for variant, raw in answers(language, hole, text, foreign_decl).items():
        result = as_model_output(raw)
        candidates = finish_candidates(prepared, doc, result, checker)
        if not candidates:
            out[variant] = (False, "", 0)
            continue
        top = candidates[0]
        out[variant] = (rebuilds(text, hole, top.text, top.replace_chars, exact), top.text, top.replace_chars)
    return out


def as_model_output(raw: str) -> DenoiseResult:
    """`raw` as if the model had written it: one candidate, nothing else measured."""
    return DenoiseResult(candidates=[RawCandidate(text=raw, confidence=1.0, tokens=0)], steps=0,
                         tokens_per_forward=0.0, drafts=0, canvases=1, prompt_tokens=0,
                         cached_prompt_tokens=0, timings_ms=Timings())


# --- the run -------------------------------------------------------------------------------------


@dataclass
class Report:
    outcomes: list[Outcome]
    sources: dict[str, dict]
    """language -> {source name: (origin, licence, files)}"""
    holes: int


def run_oracle(sources_dir: Path, *, files_per_language: int = 40, per_kind: int = 2, seed: int = 0,
               languages: tuple[str, ...] | None = None, plaintext: bool = False) -> Report:
    """The oracle over the sources folder's files. `plaintext`: also open each file without its
    grammar (reported as `plaintext (<language>)`): the fallback's stops from brackets and indentation.
    Those rows are a diagnostic of the fallback, not a language an editor sees (each has a grammar):
    the targets are per language, and `summary` does not count them."""
    by_language: dict[str, list[SourceFile]] = defaultdict(list)
    for file in read_sources(sources_dir):
        language = file.language or language_for_path(str(file.path))
        if language == PLAINTEXT or language not in LANGUAGES:
            continue
        if languages and language not in languages:
            continue
        by_language[language].append(file)
    outcomes: list[Outcome] = []
    sources: dict[str, dict] = defaultdict(dict)
    holes = 0
    for language in sorted(by_language):
        pool = [f for f in by_language[language] if 0 < f.path.stat().st_size <= MAX_FILE_CHARS]
        random.Random(f"{seed}:{language}").shuffle(pool)
        chosen = sorted(pool[:files_per_language], key=lambda f: str(f.path))
        docs = []
        for index, file in enumerate(chosen):
            text, transform = load_text(file, index, language)
            docs.append((file, text, transform, SyntaxDocument(text, language)))
        declarations = [top_level_declaration(doc) for *_, doc in docs]
        for index, (file, text, transform, doc) in enumerate(docs):
            entry = sources[language].setdefault(file.source, {"origin": file.origin, "licence": file.licence,
                                                               "files": 0})
            entry["files"] += 1
            others = [d for i, d in enumerate(declarations) if d and i != index] or \
                [d for d in declarations if d]  # one file only: its own declaration, repeated
            foreign = others[index % len(others)] if others else None
            if foreign is not None and "\r\n" in text:
                foreign = foreign.replace("\r\n", "\n").replace("\n", "\r\n")
            rng = random.Random(zlib.crc32(f"{seed}:{file.path.name}".encode()))
            for hole in cut_holes(doc, rng, per_kind):
                holes += 1
                rows = [(language, None)] + ([(f"plaintext ({language})", PLAINTEXT)] if plaintext else [])
                for row_language, as_language in rows:
                    for variant, (passed, got, replaced) in run_hole(language, text, hole, foreign,
                                                                      as_language).items():
                        detail = {} if passed else {
                            "transform": transform, "cursor": hole.start,
                            "truth": text[hole.start:hole.end], "got": got, "replace": replaced,
                            "before": text[max(0, hole.start - 160):hole.start],
                            "after": text[hole.end:hole.end + 120]}
                        outcomes.append(Outcome(row_language, hole.kind, variant, passed, file.source,
                                                str(file.path), detail))
    return Report(outcomes, dict(sources), holes)


def summary(report: Report) -> dict:
    """Pass rates per language × variant and per language × kind, and whether the targets are met."""
    table: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(lambda: [0, 0]))
    kinds: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(lambda: [0, 0]))
    for o in report.outcomes:
        cell = table[o.language][o.variant]
        cell[0] += o.passed
        cell[1] += 1
        cell = kinds[o.language][o.kind]
        cell[0] += o.passed
        cell[1] += 1
    languages = {}
    for language, row in sorted(table.items()):
        rates = {v: {"passed": p, "total": n, "rate": p / n} for v, (p, n) in row.items()}
        met = all(rates[v]["rate"] >= TARGETS[v] for v in rates)
        languages[language] = {"variants": rates, "meets_targets": met, "diagnostic": is_diagnostic(language),
                               "kinds": {k: {"passed": p, "total": n, "rate": p / n}
                                         for k, (p, n) in sorted(kinds[language].items())}}
    counted = [data["meets_targets"] for language, data in languages.items() if not data["diagnostic"]]
    return {"holes": report.holes, "languages": languages, "sources": report.sources, "targets": TARGETS,
            "languages_meeting_targets": sum(counted), "languages_counted": len(counted)}


def is_diagnostic(row: str) -> bool:
    """Whether a row is the plain-text fallback on a language that has a grammar (`--plaintext`)."""
    return row.startswith(f"{PLAINTEXT} (")


def format_table(summary_: dict) -> str:
    header = ["language", *VARIANTS, "holes", "targets"]
    rows = [header]
    for language, data in summary_["languages"].items():
        variants = data["variants"]
        holes = max((v["total"] for v in variants.values()), default=0)
        rows.append([language] + [f"{variants[v]['rate']:.1%}" if v in variants else "-" for v in VARIANTS]
                    + [str(holes), _verdict(data)])
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    out = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    out.insert(1, "  ".join("-" * w for w in widths))
    out.append("")
    out.append(f"targets met in {summary_['languages_meeting_targets']} of "
               f"{summary_['languages_counted']} languages")
    if any(data["diagnostic"] for data in summary_["languages"].values()):
        out.append("plaintext (...) rows: the plain-text fallback on files that have a grammar, a diagnostic "
                   "of the fallback (no editor opens them so), not counted against the targets")
    out.append("")
    out.append("per hole kind (all variants):")
    for language, data in summary_["languages"].items():
        out.append(f"  {language}: " + ", ".join(f"{k} {v['rate']:.1%} of {v['total']}"
                                                  for k, v in data["kinds"].items()))
    out.append("")
    out.append("sources:")
    for language, sources in sorted(summary_["sources"].items()):
        for name, s in sorted(sources.items()):
            out.append(f"  {language}: {s['files']} files of {name}: {s['origin']} ({s['licence']})")
    return "\n".join(out)


def _verdict(data: dict) -> str:
    if data["diagnostic"]:
        return "met (diagnostic)" if data["meets_targets"] else "below (diagnostic)"
    return "met" if data["meets_targets"] else "MISSED"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sources", type=Path, default=DEFAULT_SOURCES,
                        help=f"folder of sources (default {DEFAULT_SOURCES}); filled by --fetch")
    parser.add_argument("--fetch", action="store_true", help="download the sources not yet in --sources, then run")
    parser.add_argument("--fetch-only", action="store_true", help="download the sources and stop")
    parser.add_argument("--files", type=int, default=40, help="files per language (a seeded choice)")
    parser.add_argument("--per-kind", type=int, default=2, help="holes of each kind per file")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--language", action="append", help="only this language (repeatable)")
    parser.add_argument("--plaintext", action="store_true",
                        help="also open every file without its grammar: the plain-text fallback "
                             "(a diagnostic, not counted against the targets)")
    parser.add_argument("--failures", type=Path, help="write every failed hole here as JSON lines")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    if args.fetch or args.fetch_only:
        failed = fetch(args.sources)
        if args.fetch_only:
            return 1 if failed else 0
    if not any(args.sources.glob("*/source.json")):
        sys.stderr.write(f"bench oracle: no sources in {args.sources}; run `dgemma-lsp bench oracle --fetch`\n")
        return 2
    report = run_oracle(args.sources, files_per_language=args.files, per_kind=args.per_kind, seed=args.seed,
                        languages=tuple(args.language) if args.language else None, plaintext=args.plaintext)
    result = summary(report)
    if args.failures:
        with args.failures.open("w") as out:
            for o in report.outcomes:
                if not o.passed:
                    out.write(json.dumps({"language": o.language, "kind": o.kind, "variant": o.variant,
                                          "path": o.path, **o.detail}) + "\n")
    sys.stdout.write((json.dumps(result, indent=2) if args.json else format_table(result)) + "\n")
    return 0
