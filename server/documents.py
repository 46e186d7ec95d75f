"""Open documents: text, version and syntax tree per URI, edited in place.

Each open document is an engine `SyntaxDocument` (text + tree-sitter tree,
edited incrementally with `apply_change`) plus a `LineIndex` for converting
the client's positions. Changes arrive as LSP ranges in the negotiated
encoding; this module turns them into str offsets (through positions.py) and
nothing else. Knows no pygls types beyond plain values, and no model.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from dgemma_lsp.engine.syntax.document import SyntaxDocument

from .positions import Encoding, LineIndex, PositionError

log = logging.getLogger(__name__)


class UnknownDocumentError(KeyError):
    """A request named a URI that is not open."""

    def __str__(self) -> str:
        return f"document {self.args[0]} is not open (send textDocument/didOpen first)"


@dataclass
class OpenDocument:
    """One open document as of its latest version."""

    uri: str
    language_id: str
    version: int
    syntax: SyntaxDocument
    lines: LineIndex = field(init=False)

    def __post_init__(self) -> None:
        self.lines = LineIndex(self.syntax.text)

    @property
    def text(self) -> str:
        return self.syntax.text

    def offset(self, line: int, character: int, encoding: Encoding) -> int:
        """The str offset of an LSP position; raises PositionError outside the document."""
        return self.lines.offset(line, character, encoding)

    def position(self, offset: int, encoding: Encoding) -> tuple[int, int]:
        return self.lines.position(offset, encoding)


class DocumentStore:
    """The open documents of one client session, by URI."""

    def __init__(self) -> None:
        self._documents: dict[str, OpenDocument] = {}

    def open(self, uri: str, language_id: str, version: int, text: str) -> OpenDocument:
        document = OpenDocument(uri, language_id, version, SyntaxDocument(text, language_id))
        self._documents[uri] = document
        return document

    def close(self, uri: str) -> None:
        self._documents.pop(uri, None)

    def get(self, uri: str) -> OpenDocument:
        try:
            return self._documents[uri]
        except KeyError:
            raise UnknownDocumentError(uri) from None

    def __contains__(self, uri: str) -> bool:
        return uri in self._documents

    def change(
        self,
        uri: str,
        version: int,
        changes: list[tuple[tuple[int, int, int, int] | None, str]],
        encoding: Encoding,
    ) -> OpenDocument:
        """Apply changes in order; each is ((start line, start char, end line, end char) | None, text).

        None as the range replaces the whole text (full sync). A change whose
        range is outside the document raises PositionError after the earlier
        changes were applied — the client and server disagree, and the log says so.
        """
        document = self.get(uri)
        for span, new_text in changes:
            if span is None:
                document.syntax.set_text(new_text)
            else:
                start_line, start_char, end_line, end_char = span
                start = document.offset(start_line, start_char, encoding)
                end = document.offset(end_line, end_char, encoding)
                if end < start:
                    raise PositionError(f"range end {end_line}:{end_char} before its start")
                document.syntax.apply_change(start, end, new_text)
            document.lines = LineIndex(document.syntax.text)
        document.version = version
        return document
