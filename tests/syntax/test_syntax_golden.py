"""Golden cases for the syntax layer, one data file per language in golden/.

Each case is a document with a `<|>` cursor marker and the plan expected there; most
also give raw model text and the text expected to be inserted after post-processing,
which must then parse cleanly in place (syntaxOk), except for plaintext (None).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dgemma_lsp.engine.api import Candidate
from dgemma_lsp.engine.syntax.context import build_context
from dgemma_lsp.engine.syntax.document import SyntaxDocument
from dgemma_lsp.engine.syntax.planning import plan_hole
from dgemma_lsp.engine.syntax.postprocess import finish_text
from dgemma_lsp.engine.syntax.validation import rank_candidates

GOLDEN = Path(__file__).parent / "golden"
CURSOR = "<|>"


def _cases():
    for path in sorted(GOLDEN.glob("*.json")):
        data = json.loads(path.read_text())
        for case in data["cases"]:
            yield pytest.param(data["language"], case, id=f"{path.stem}: {case['name']}")


CASES = list(_cases())


def _open(language: str, marked: str) -> tuple[SyntaxDocument, int]:
    assert marked.count(CURSOR) == 1, "a golden document needs exactly one cursor marker"
    offset = marked.index(CURSOR)
    return SyntaxDocument(marked.replace(CURSOR, ""), language), offset


def test_golden_set_is_large_enough():
    per_language: dict[str, int] = {}
    for param in CASES:
        per_language[param.values[0]] = per_language.get(param.values[0], 0) + 1
    assert sum(per_language.values()) >= 80
    assert all(per_language[lang] >= 8 for lang in per_language if lang != "plaintext")
    kinds = {param.values[1]["plan"]["kind"] for param in CASES}
    assert kinds == {"block", "expression", "line", "statement", "text"}


@pytest.mark.parametrize(("language", "case"), CASES)
def test_plan(language, case):
    doc, offset = _open(language, case["doc"])
    plan = plan_hole(doc, offset)
    got = {key: getattr(plan, key) for key in case["plan"]}
    assert got == case["plan"]
    assert plan.region.start == offset <= plan.region.end <= len(doc.text)


@pytest.mark.parametrize(("language", "case"), [c for c in CASES if "raw" in c.values[1]])
def test_finish(language, case):
    doc, offset = _open(language, case["doc"])
    plan = plan_hole(doc, offset)
    context = build_context(doc, offset, plan, 2048)
    finished = finish_text(case["raw"], context, plan)
    assert finished.text == case["text"]
    assert finished.replace_chars == case.get("replace", 0)
    if finished.text:
        [ranked] = rank_candidates(
            doc, offset, [Candidate(text=finished.text, confidence=1.0, replace_chars=finished.replace_chars)]
        )
        assert ranked.syntax_ok is (None if language == "plaintext" else True)


def test_a_copy_of_a_cursor_line_the_context_cut_is_dropped():
    # A cursor line over the budget (a data file's one-line list) is cut in the context's prefix;
    # the model's copy of the whole line ends with what the context kept of it.
    line = "streets: [" + ", ".join(f"Street number {i}" for i in range(80)) + ", "
    marked = "en:\n  address:\n    " + line + CURSOR + "]\n    city: [Zvolen]\n"
    doc, offset = _open("yaml", marked)
    plan = plan_hole(doc, offset)
    context = build_context(doc, offset, plan, 300)
    assert "\n" not in context.prefix and len(context.prefix) < len(line)
    finished = finish_text(line + "Last Street]", context, plan)
    assert finished.text == "Last Street"
