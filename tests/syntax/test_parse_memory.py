"""Parsing through a read callback keeps nothing of the source (counted, never timed).

py-tree-sitter 0.26.1 keeps one reference too many to every chunk a read callback returns,
so every parse of a document left its whole text behind (`bench soak`: ~40 KB per document,
for good). `parse_in_chunks` gives those references back; tracemalloc counts what is left.
"""

from __future__ import annotations

import gc
import tracemalloc

import pytest
import tree_sitter

from dgemma_lsp.engine.syntax.document import parse_in_chunks
from dgemma_lsp.engine.syntax.languages import parser_for

SOURCE = "".join(f"def function_{i}(values):\n    return sum(values) * {i}\n\n\n" for i in range(1000)).encode()
PARSES = 10


def kept_by(parse) -> int:
    """Bytes still allocated after PARSES calls of `parse` and a full collection."""
    parse()  # warm up: the parser's own buffers
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(PARSES):
            parse()
        gc.collect()
        return tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()


def test_a_parse_through_the_read_callback_keeps_nothing_of_the_source():
    parser = parser_for("python")
    assert kept_by(lambda: parse_in_chunks(parser, SOURCE, progress=lambda _offset, _error: False)) < len(SOURCE)
    tree = parse_in_chunks(parser, SOURCE)
    assert kept_by(lambda: parse_in_chunks(parser, SOURCE, tree)) < len(SOURCE)  # an incremental reparse


def test_a_stopped_parse_keeps_nothing_either():
    parser = parser_for("python")

    def stopped() -> None:
        with pytest.raises(ValueError):
            parse_in_chunks(parser, SOURCE, progress=lambda offset, _error: offset > len(SOURCE) // 2)
        parser.reset()

    assert kept_by(stopped) < len(SOURCE)


def test_the_tree_still_reads_its_text_after_the_parse():
    source = b'greeting = "hello"\n'
    tree = parse_in_chunks(tree_sitter.Parser(parser_for("python").language), source)
    string = tree.root_node.children[0].children[0].child_by_field_name("right")
    assert string.text == b'"hello"'
