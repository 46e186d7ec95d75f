"""The infill oracle on the committed sample of real code (tests/data/oracle): the true middle, and
the true middle with run-on, foreign code, fences, a repeated line or (where indentation is
syntax) a line at column 0 after it, must rebuild every file through the real pipeline, at the
issue's targets in every language the sample holds."""

import json
from pathlib import Path

from dgemma_lsp.bench.oracle import INDENT_SYNTAX, TARGETS, Hole, answers, rebuilds, run_oracle, summary

SAMPLE = Path(__file__).parents[1] / "data" / "oracle"
SAMPLED = ("c", "cpp", "go", "java", "javascript", "lua", "python", "rust", "tsx", "typescript",
           "csharp", "ruby", "php", "json", "css", "scala", "html")

NO_BLOCK_HOLES = {"html": {"block"}}
"""An element's content is planned as statements (children), never as a block body."""


def test_the_committed_sample_meets_the_targets_in_every_language():
    result = summary(run_oracle(SAMPLE, files_per_language=10, per_kind=2))
    assert set(SAMPLED) <= set(result["languages"])
    for language, data in result["languages"].items():
        variants = set(TARGETS) - ({"outdented"} if language not in INDENT_SYNTAX else set())
        assert set(data["variants"]) == variants, language
        kinds = {"line", "expression", "expression-open", "statement"} | ({"block"} - NO_BLOCK_HOLES.get(language, set()))
        assert set(data["kinds"]) >= kinds, language
        for variant, figure in data["variants"].items():
            assert figure["total"] >= 8, (language, variant)
            assert figure["rate"] >= TARGETS[variant], (language, variant, figure)


def test_every_sample_says_where_it_came_from_and_has_its_licence_beside_it():
    manifests = sorted(SAMPLE.glob("*/source.json"))
    assert len(manifests) >= 10
    for path in manifests:
        manifest = json.loads(path.read_text())
        assert manifest["origin"] and manifest["licence"] and "GPL" not in manifest["licence"]
        assert any(p.name.upper().startswith(("LICENSE", "COPYRIGHT")) or p.name.endswith("copyright")
                   for p in path.parent.iterdir()), path.parent


def test_a_wrong_or_misindented_answer_does_not_rebuild():
    original = "def f():\n    x = 1\n    return x\n"
    hole = Hole("statement", original.index("x = 1"), original.index("x = 1") + 5)
    assert rebuilds(original, hole, "x = 1", 0, exact=True)
    assert not rebuilds(original, hole, "x = 2", 0, exact=True)
    assert not rebuilds(original, hole, "x = 1\n  y", 0, exact=True)
    assert rebuilds(original, hole, "x  =  1", 0, exact=False)
    assert not rebuilds(original, hole, "x  =  1", 0, exact=True)
    trailing = "a:\n  b: \n  c: 1\n"  # spaces at a line's end: the pipeline trims them, no grammar reads them
    line_hole = Hole("multi-line", trailing.index("b"), trailing.index(" 1"))
    assert rebuilds(trailing, line_hole, "b:\n  c:", 0, exact=True)
    assert not rebuilds(trailing, line_hole, "b:\n c:", 0, exact=True)


def test_the_answers_of_a_nested_hole():
    original = "int f(int a) {\n    return g(a, 1);\n}\n"
    start = original.index("a, 1")
    hole = Hole("expression", start, original.index(");"))
    got = answers("c", hole, original, "int h(void) {\n    return 0;\n}")
    assert got["truth"] == "a, 1"
    assert got["run-on"].startswith("a, 1);\n}")
    assert got["foreign"] == "a, 1)}\n\nint h(void) {\n    return 0;\n}"
    assert got["fenced"] == "```c\na, 1\n```\n"
    assert got["repeated"] == "    return g(a, 1"
    assert "outdented" not in got  # brackets end C's blocks, not a line at column 0


def test_the_outdented_answer_runs_past_an_indented_block_into_code_at_column_0():
    original = "def f(xs):\n    for x in xs:\n        total += x\n    return total\n"
    hole = Hole("block", original.index("total +="), original.index("\n    return"))
    got = answers("python", hole, original, "def g():\n    return 0")
    assert got["outdented"] == "total += x\ndef g():"
    top = "x = 1\ny = 2\n"
    assert "outdented" not in answers("python", Hole("statement", 6, 11), top, "def g():\n    return 0")
