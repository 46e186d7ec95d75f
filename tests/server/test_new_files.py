"""A new file is empty: an inline completion there answers a list (maybe empty), never an error, and
so does a retry. The same for a file of blank lines and for the end of a file without a final line
break. A real `dgemma-lsp --stdio --model tiny-random`: the request runs the model."""

from __future__ import annotations

import pytest
import pytest_lsp
from lsp_session import FAST, apply_item, capabilities, config, initialize, open_document, position_of, within
from lsprotocol import types as lsp
from pytest_lsp import LanguageClient

pytestmark = pytest.mark.asyncio(loop_scope="module")

NEW_FILES = {
    "empty": ("", 0),
    "blank lines": ("\n\n  \n", 2),
    "blank lines, at the end": ("\n\n  \n", 5),
    "no final line break": ("total = 1", 9),
}
"""name: (text, cursor offset)."""


@pytest_lsp.fixture(scope="module", config=config())
async def client(lsp_client: LanguageClient):
    await initialize(lsp_client, capabilities("visual-studio-code"), FAST)
    yield
    await lsp_client.shutdown_session()


@pytest.mark.parametrize("name", list(NEW_FILES))
async def test_inline_completion_in_a_new_file_answers_a_list_every_time(client: LanguageClient, name: str):
    text, cursor = NEW_FILES[name]
    uri = f"file:///tmp/new file {name}.py"
    open_document(client, uri, text)
    position = position_of(text, cursor, "utf-16")
    for _ in range(2):  # a retry is answered the same way
        result = await within(client.text_document_inline_completion_async(lsp.InlineCompletionParams(
            text_document=lsp.TextDocumentIdentifier(uri=uri), position=position,
            context=lsp.InlineCompletionContext(trigger_kind=lsp.InlineCompletionTriggerKind.Invoked),
        )))
        assert isinstance(result, lsp.InlineCompletionList)
        for item in result.items:
            apply_item(text, cursor, item, "utf-16")  # each one lands at the cursor
    assert [m.message for m in client.messages if m.type == lsp.MessageType.Error] == []
