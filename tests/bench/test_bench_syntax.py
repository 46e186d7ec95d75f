"""The syntax benchmark's generated files are valid code in every language, with or without non-ASCII text,
so that it measures typing into a sound file and not tree-sitter's error recovery."""

import pytest

from dgemma_lsp.bench.syntax_bench import NON_ASCII_LINE, bench_language, generate_source
from dgemma_lsp.engine.syntax.document import SyntaxDocument
from dgemma_lsp.engine.syntax.languages import LANGUAGES


@pytest.mark.parametrize("language", LANGUAGES)
@pytest.mark.parametrize("non_ascii", [False, True])
def test_a_generated_file_parses_without_errors(language, non_ascii):
    source = generate_source(language, 60, non_ascii=non_ascii)
    assert (NON_ASCII_LINE in source) is non_ascii
    assert not SyntaxDocument(source, language).tree.root_node.has_error


def test_a_short_run_reports_every_figure():
    result = bench_language("python", 40, 2048, lines=300, non_ascii=True)
    assert result["keystrokes"] == 40
    assert 0 < result["p50_ms"] <= result["p99_ms"] <= result["max_ms"]
    assert result["new_line_p50_ms"] > 0
