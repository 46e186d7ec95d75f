"""Keystroke benchmark of the syntax layer (not a test): `dgemma-lsp bench syntax`.

For each language, a generated 5,000-line file (`--lines`) is opened and typed into:
characters on a line inside a function body, then Enter, again and again. The work of
one keystroke is what the server does per change before any model work: the
incremental reparse (`apply_change`, bounded by the server's parse budget as the server
bounds it), `plan_hole`, `build_context` (2,048-token budget) and `finish_text` of a
fixed raw answer. After each keystroke the document is brought up to date as the
server's syntax worker does between keystrokes (`catch_up`, the whole-document reparse
a bounded one gave up on); that time is reported apart (`catchup_*`: background work,
interrupted in the server by the next keystroke), and the next keystroke starts from an
up-to-date tree, the slower case. Reports p50/p99/max in ms per language, over all
keystrokes and over the first keystroke on a fresh line (where the context's stable
part is recomputed). Brackets are auto-closed as editors do by default (`--no-autoclose`
types them unpaired: tree-sitter's error recovery then reparses to the end of the file).
`--non-ascii` puts a comment of non-ASCII text near the top of each file, so that str and
byte offsets differ for nearly all of it (a conversion that read the file from its start would
then cost the whole file at every call). Pure CPU; no model, no torch.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from dgemma_lsp.engine.syntax.context import build_context
from dgemma_lsp.engine.syntax.document import KEYSTROKE_PARSE_BUDGET_S, SyntaxDocument
from dgemma_lsp.engine.syntax.languages import LANGUAGES
from dgemma_lsp.engine.syntax.planning import plan_hole
from dgemma_lsp.engine.syntax.postprocess import finish_text

# One function per language, formatted with {i}; each is ~10 lines. Line 0 of the body
# (the one containing `TYPE_HERE`) is where the typing happens, in the middle of the file.
_TEMPLATES = {
    "python": ("import os\n\n", "def func_{i}(a, b):\n    total = a + b\n    for k in range(b):\n"
               "        total += k * {i}\n    if total > 10:\n        return total\n    name = 'f{i}'\n"
               "    print(name, total)\n    return a\n\n"),
    "javascript": ("import fs from 'fs';\n\n", "function func_{i}(a, b) {{\n  let total = a + b;\n"
                   "  for (let k = 0; k < b; k++) {{\n    total += k * {i};\n  }}\n  if (total > 10) {{\n"
                   "    return total;\n  }}\n  return a;\n}}\n"),
    "typescript": ("import fs from 'fs';\n\n", "function func_{i}(a: number, b: number): number {{\n"
                   "  let total: number = a + b;\n  for (let k = 0; k < b; k++) {{\n    total += k * {i};\n"
                   "  }}\n  if (total > 10) {{\n    return total;\n  }}\n  return a;\n}}\n"),
    "tsx": ("import React from 'react';\n\n", "function Comp{i}(props: {{ n: number }}) {{\n"
            "  const total = props.n + {i};\n  if (total > 10) {{\n    return <div>{{total}}</div>;\n"
            "  }}\n  const label = `c{i}`;\n  console.log(label);\n  return <span>{{label}}</span>;\n}}\n\n"),
    "go": ("package main\n\nimport \"fmt\"\n\n", "func func{i}(a int, b int) int {{\n\ttotal := a + b\n"
           "\tfor k := 0; k < b; k++ {{\n\t\ttotal += k * {i}\n\t}}\n\tif total > 10 {{\n\t\treturn total\n"
           "\t}}\n\tfmt.Println(total)\n\treturn a\n}}\n"),
    "rust": ("use std::io;\n\n", "fn func_{i}(a: i64, b: i64) -> i64 {{\n    let mut total = a + b;\n"
             "    for k in 0..b {{\n        total += k * {i};\n    }}\n    if total > 10 {{\n"
             "        return total;\n    }}\n    println!(\"{{}}\", total);\n    a\n}}\n"),
    "c": ("#include <stdio.h>\n\n", "int func_{i}(int a, int b) {{\n    int total = a + b;\n"
          "    for (int k = 0; k < b; k++) {{\n        total += k * {i};\n    }}\n    if (total > 10) {{\n"
          "        return total;\n    }}\n    printf(\"%d\\n\", total);\n    return a;\n}}\n"),
    "cpp": ("#include <vector>\n\n", "int func_{i}(int a, int b) {{\n    std::vector<int> v{{a, b}};\n"
            "    int total = a + b;\n    for (int k = 0; k < b; k++) {{\n        total += k * {i};\n    }}\n"
            "    if (total > 10) {{\n        return total;\n    }}\n    return a;\n}}\n"),
    "java": ("import java.util.*;\n\nclass Big {\n", "  int func{i}(int a, int b) {{\n    int total = a + b;\n"
             "    for (int k = 0; k < b; k++) {{\n      total += k * {i};\n    }}\n    if (total > 10) {{\n"
             "      return total;\n    }}\n    return a;\n  }}\n\n"),
    "lua": ("local M = {}\n\n", "function M.func_{i}(a, b)\n  local total = a + b\n  for k = 1, b do\n"
            "    total = total + k * {i}\n  end\n  if total > 10 then\n    return total\n  end\n"
            "  print(total)\n  return a\nend\n\n"),
    "csharp": ("using System;\n\nclass Big {\n", "    int Func{i}(int a, int b) {{\n        int total = a + b;\n"
               "        for (int k = 0; k < b; k++) {{\n            total += k * {i};\n        }}\n"
               "        if (total > 10) {{\n            return total;\n        }}\n        return a;\n    }}\n\n"),
    "ruby": ("require 'set'\n\n", "def func_{i}(a, b)\n  total = a + b\n  b.times do |k|\n    total += k * {i}\n"
             "  end\n  if total > 10\n    return total\n  end\n  puts \"f{i} #{{total}}\"\n  a\nend\n\n"),
    "php": ("<?php\n\n", "function func_{i}($a, $b) {{\n    $total = $a + $b;\n    for ($k = 0; $k < $b; $k++) {{\n"
            "        $total += $k * {i};\n    }}\n    if ($total > 10) {{\n        return $total;\n    }}\n"
            "    echo \"f{i} $total\";\n    return $a;\n}}\n\n"),
    "kotlin": ("import kotlin.math.max\n\n", "fun func{i}(a: Int, b: Int): Int {{\n    var total = a + b\n"
               "    for (k in 0 until b) {{\n        total += k * {i}\n    }}\n    if (total > 10) {{\n"
               "        return total\n    }}\n    println(\"f{i} $total\")\n    return a\n}}\n\n"),
    "swift": ("import Foundation\n\n", "func func{i}(a: Int, b: Int) -> Int {{\n    var total = a + b\n"
              "    for k in 0..<b {{\n        total += k * {i}\n    }}\n    if total > 10 {{\n        return total\n"
              "    }}\n    print(\"f{i} \\(total)\")\n    return a\n}}\n\n"),
    "bash": ("#!/bin/bash\nset -e\n\n", "func_{i}() {{\n  local total=$(( $1 + $2 ))\n  for k in 1 2 3; do\n"
             "    total=$(( total + k * {i} ))\n  done\n  if [ \"$total\" -gt 10 ]; then\n    echo \"$total\"\n"
             "  fi\n  return 0\n}}\n\n"),
    "scala": ("object Big {\n", "  def func{i}(a: Int, b: Int): Int = {{\n    var total = a + b\n"
              "    for (k <- 0 until b) {{\n      total += k * {i}\n    }}\n    if (total > 10) {{\n"
              "      return total\n    }}\n    println(s\"f{i} $total\")\n    a\n  }}\n\n"),
    "json": ("{\n  \"items\": [\n", "    {{\n      \"id\": {i},\n      \"total\": {i},\n      \"name\": \"item {i}\",\n"
             "      \"tags\": [\"a\", \"b\"],\n      \"nested\": {{\n        \"x\": 1,\n        \"y\": 2\n      }}\n"
             "    }},\n"),
    "yaml": ("items:\n", "  - id: {i}\n    total: {i}\n    name: item {i}\n    tags:\n      - a\n      - b\n"
             "    nested:\n      x: 1\n      y: 2\n"),
    "toml": ("title = \"big\"\n\n", "[[items]]\nid = {i}\ntotal = {i}\nname = \"item {i}\"\ntags = [\"a\", \"b\"]\n\n"
             "[items.nested]\nx = 1\ny = 2\n\n"),
    "html": ("<!DOCTYPE html>\n<html>\n<body>\n", "<div class=\"card\" id=\"c{i}\">\n  <h2>Card {i}</h2>\n"
             "  <p class=\"total\">total {i}</p>\n  <ul>\n    <li>a</li>\n    <li>b</li>\n  </ul>\n"
             "  <a href=\"/c/{i}\">more</a>\n</div>\n\n"),
    "css": ("@import \"base.css\";\n\n", ".card-{i} {{\n  color: #333;\n  margin: 0 auto;\n"
            "  counter-reset: total {i};\n  padding: {i}px;\n}}\n\n.card-{i} > .title {{\n  font-weight: bold;\n}}\n\n"),
}
_CLOSING = {"java": "}\n", "csharp": "}\n", "scala": "}\n", "json": "    {}\n  ]\n}\n", "html": "</body>\n</html>\n"}
_COMMENT = {"python": "#", "lua": "--", "ruby": "#", "bash": "#", "yaml": "#", "toml": "#", "css": "/*",
            "html": "<!--"}
"""How a line comment starts, where it is not `//`."""
_COMMENT_END = {"css": " */", "html": " -->"}
_TYPED_FOR = {
    "bash": "result=$(compute \"$total\" 42) ",
    "json": "\"result\": [1, 42], ",
    "yaml": "result: [1, 42] ",
    "toml": "result = [1, 42] ",
    "html": "<b>result 42</b> ",
    "css": "margin: calc(1px + 42px); ",
    "php": "$result = compute($total, 42); ",
}
"""What is typed on each new line where `_TYPED` would not be this language's code."""
NON_ASCII_LINE = "naïve café, 中文 ✓"
"""With --non-ascii: a comment under the header (str and byte offsets then differ after it)."""
_TYPED = "result = compute(total, 42) "
"""Characters typed per line before Enter (28 keystrokes + Enter)."""
_RAW = "compute(total, 42)\n    return result\n```"


def generate_source(language: str, lines: int = 5000, *, non_ascii: bool = False) -> str:
    """A syntactically valid file of about `lines` lines in `language` (`non_ascii`: with a comment
    of non-ASCII text near the top)."""
    header, template = _TEMPLATES[language]
    parts = [header]
    if non_ascii:
        parts.append(f"{_COMMENT.get(language, '//')} {NON_ASCII_LINE}{_COMMENT_END.get(language, '')}\n")
    count = header.count("\n")
    i = 0
    while count < lines:
        chunk = template.format(i=i)
        parts.append(chunk)
        count += chunk.count("\n")
        i += 1
    parts.append(_CLOSING.get(language, ""))
    return "".join(parts)


def _cursor_in_middle(source: str) -> int:
    """End of the first body line of the function in the middle of the file."""
    middle = source.find("total", len(source) // 2)
    return source.find("\n", middle)


_PAIRS = {"(": ")", "[": "]", "{": "}"}


def bench_language(language: str, keystrokes: int, budget: int, autoclose: bool = True, *,
                   lines: int = 5000, parse_budget_s: float | None = KEYSTROKE_PARSE_BUDGET_S,
                   non_ascii: bool = False, clock=time.perf_counter) -> dict:
    """`clock`: time.perf_counter (wall) or time.thread_time (this thread's CPU time: what a loaded
    machine does not inflate; the parse budget itself stays on the wall clock, as in the server)."""
    source = generate_source(language, lines, non_ascii=non_ascii)
    doc = SyntaxDocument(source, language, parse_budget_s=parse_budget_s)
    offset = _cursor_in_middle(source)
    line_start = source.rfind("\n", 0, offset) + 1
    line = source[line_start:offset]
    indent = line[: len(line) - len(line.lstrip())]
    all_ms: list[float] = []
    reparse_ms: list[float] = []
    autoclosed = 0
    new_line_ms: list[float] = []
    catchup_ms: list[float] = []
    bounded = 0
    # Enter first, so the typing happens on a fresh statement line.
    pending = ["\n" + indent]
    while len(all_ms) < keystrokes:
        if not pending:
            pending = list(_TYPED_FOR.get(language, _TYPED)) + ["\n" + indent]
        change = pending.pop(0)
        t0 = clock()
        if autoclose and change in _PAIRS:
            # Editors auto-close brackets: `(` inserts `()`, typing `)` then steps over it.
            doc.apply_change(offset, offset, change + _PAIRS[change])
            autoclosed += 1
        elif autoclose and autoclosed and change in _PAIRS.values():
            autoclosed -= 1
        else:
            doc.apply_change(offset, offset, change)
        offset += len(change)
        reparse_ms.append((clock() - t0) * 1000.0)
        plan = plan_hole(doc, offset)
        context = build_context(doc, offset, plan, budget)
        finish_text(_RAW, context, plan)
        elapsed = (clock() - t0) * 1000.0
        all_ms.append(elapsed)
        if change.startswith("\n"):
            new_line_ms.append(elapsed)
        if doc.stale:
            bounded += 1
            t1 = clock()
            doc.catch_up()
            catchup_ms.append((clock() - t1) * 1000.0)
    return {
        "language": language,
        "lines": source.count("\n"),
        "keystrokes": len(all_ms),
        "p50_ms": _percentile(all_ms, 50),
        "p99_ms": _percentile(all_ms, 99),
        "max_ms": max(all_ms),
        "new_line_p50_ms": _percentile(new_line_ms, 50),
        "new_line_max_ms": max(new_line_ms),
        "mean_ms": statistics.fmean(all_ms),
        "reparse_p50_ms": _percentile(reparse_ms, 50),
        "reparse_p99_ms": _percentile(reparse_ms, 99),
        "rest_p99_ms": _percentile([a - r for a, r in zip(all_ms, reparse_ms, strict=True)], 99),
        "parse_budget_ms": None if parse_budget_s is None else parse_budget_s * 1000.0,
        "over_budget_keystrokes": bounded,
        "catchup_p50_ms": _percentile(catchup_ms, 50) if catchup_ms else 0.0,
        "catchup_p99_ms": _percentile(catchup_ms, 99) if catchup_ms else 0.0,
    }


def _percentile(values: list[float], pct: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(pct / 100.0 * (len(ordered) - 1))))
    return ordered[index]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--languages", nargs="*", default=list(LANGUAGES), help="languages to run (default: all)")
    parser.add_argument("--keystrokes", type=int, default=600, help="keystrokes measured per language")
    parser.add_argument("--budget", type=int, default=2048, help="context budget in tokens")
    parser.add_argument("--no-autoclose", dest="autoclose", action="store_false",
                        help="type brackets unpaired (the editor does not auto-close): worst case for "
                             "tree-sitter's error recovery")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--lines", type=int, default=5000, help="length of the generated file")
    parser.add_argument("--non-ascii", action="store_true",
                        help="a comment of non-ASCII text near the top of each file (str and byte offsets differ)")
    parser.add_argument("--parse-budget-ms", type=float, default=KEYSTROKE_PARSE_BUDGET_S * 1000.0,
                        help="reparse budget per keystroke, as the server uses it; 0 = unbounded (before issue 15)")
    parser.add_argument("--cpu-time", action="store_true",
                        help="time keystrokes in this thread's CPU time instead of wall time (a loaded machine)")


def run(args: argparse.Namespace) -> int:
    autoclose = getattr(args, "autoclose", True)
    budget_ms = getattr(args, "parse_budget_ms", KEYSTROKE_PARSE_BUDGET_S * 1000.0)
    non_ascii = getattr(args, "non_ascii", False)
    clock = time.thread_time if getattr(args, "cpu_time", False) else time.perf_counter
    results = [bench_language(lang, args.keystrokes, args.budget, autoclose, lines=getattr(args, "lines", 5000),
                              parse_budget_s=budget_ms / 1000.0 if budget_ms else None, non_ascii=non_ascii,
                              clock=clock)
               for lang in args.languages]
    if getattr(args, "json", False):
        sys.stdout.write(json.dumps({"benchmark": "syntax-keystroke", "results": results}, indent=2) + "\n")
        return 0
    header = f"{'language':<11} {'lines':>6} {'keys':>5} {'p50 ms':>7} {'p99 ms':>7} {'max ms':>7} {'Enter p50':>9} {'Enter max':>9} {'reparse p50':>11} {'reparse p99':>11} {'rest p99':>8} {'over budget':>11} {'catch-up p50':>12} {'catch-up p99':>12}"
    mode = "auto-closed brackets" if autoclose else "unpaired brackets"
    mode += f", parse budget {budget_ms:g} ms" if budget_ms else ", unbounded reparse"
    mode += ", non-ASCII text" if non_ascii else ""
    mode += ", thread CPU time" if clock is time.thread_time else ""
    sys.stdout.write(f"keystroke = incremental reparse + plan + context + post-process ({mode})\n" + header + "\n")
    for r in results:
        sys.stdout.write(
            f"{r['language']:<11} {r['lines']:>6} {r['keystrokes']:>5} {r['p50_ms']:>7.2f} {r['p99_ms']:>7.2f} "
            f"{r['max_ms']:>7.2f} {r['new_line_p50_ms']:>9.2f} {r['new_line_max_ms']:>9.2f} "
            f"{r['reparse_p50_ms']:>11.2f} {r['reparse_p99_ms']:>11.2f} {r['rest_p99_ms']:>8.2f} "
            f"{r['over_budget_keystrokes']:>11} {r['catchup_p50_ms']:>12.2f} {r['catchup_p99_ms']:>12.2f}\n"
        )
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_arguments(parser)
    return run(parser.parse_args())


if __name__ == "__main__":
    raise SystemExit(main())
