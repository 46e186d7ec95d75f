"""Exact text and ranges over stdio, in each position encoding (utf-8, utf-16, utf-32).

What the editors get must line up with their buffer to the character:
- a range whose end falls inside a character covers that character (Neovim sends a
  charwise selection's end one unit into its last character): `v` on `本` in
  `x = '本'` offers a rewrite of `本`, and a selection ending one unit into 🙂 covers 🙂;
  starts round down;
- answers, drafts and rewrites carry the document's own line ending and never a lone
  "\\r" (LSP counts it as a line break, editors keep it inside the line, and from then
  on the server's line numbers and the editor's disagree).

A real `dgemma-lsp --stdio --model tiny-random`, one per encoding; the tiny model writes random
tokens, line breaks among them, so the checks are on every text it sends.
"""

from __future__ import annotations

import re

import pytest
import pytest_lsp
from lsp_session import FAST, FIB, capabilities, config, initialize, open_document, position_of, within
from lsprotocol import types as lsp
from pytest_lsp import LanguageClient

pytestmark = pytest.mark.asyncio(loop_scope="module")

ENCODINGS = ["utf-8", "utf-16", "utf-32"]
CRLF_FIB = FIB.read_text().replace("\n", "\r\n")
LONE_CR = re.compile(r"\r(?!\n)")
BARE_LF = re.compile(r"(?<!\r)\n")


@pytest_lsp.fixture(scope="module", params=ENCODINGS, config=config())
async def client(lsp_client: LanguageClient, request):
    caps = capabilities("visual-studio-code", encodings=[request.param])
    lsp_client.encoding = request.param
    lsp_client.init_result = await initialize(lsp_client, caps, {**FAST, "drafts": True, "maxCandidates": 3})
    assert lsp_client.init_result.capabilities.position_encoding == request.param
    yield
    await lsp_client.shutdown_session()


def one_unit_into(text: str, offset: int, encoding: str) -> lsp.Position:
    """The position one code unit past `offset` (inside the character there when it is wider)."""
    start = position_of(text, offset, encoding)
    return lsp.Position(line=start.line, character=start.character + 1)


async def rewrite_range(client: LanguageClient, uri: str, selection: lsp.Range) -> lsp.Range | None:
    """The range the offered rewrite replaces, through codeAction + codeAction/resolve; None: no action."""
    actions = await within(client.text_document_code_action_async(lsp.CodeActionParams(
        text_document=lsp.TextDocumentIdentifier(uri=uri), range=selection,
        context=lsp.CodeActionContext(diagnostics=[]),
    )))
    rewrites = [a for a in actions or [] if isinstance(a, lsp.CodeAction) and a.kind == "refactor.rewrite"]
    if not rewrites:
        return None
    resolved = await within(client.code_action_resolve_async(rewrites[0]))
    (edit,) = resolved.edit.changes[uri]
    return edit.range


@pytest.mark.parametrize(("line", "wide"), [("x = '本'\n", "本"), ('s = "🙂"\n', "🙂")])
async def test_a_selection_ending_inside_a_character_covers_it(client: LanguageClient, line: str, wide: str):
    encoding = client.encoding
    uri = f"file:///tmp/inside_{encoding}_{ord(wide):x}.py"
    open_document(client, uri, line)
    at = line.index(wide)
    # `v` on the character alone: the end one unit in.
    got = await rewrite_range(client, uri, lsp.Range(start=position_of(line, at, encoding),
                                                     end=one_unit_into(line, at, encoding)))
    assert got == lsp.Range(start=position_of(line, at, encoding), end=position_of(line, at + 1, encoding))
    # A longer selection whose end falls inside it: from the start of the line.
    got = await rewrite_range(client, uri, lsp.Range(start=lsp.Position(line=0, character=0),
                                                     end=one_unit_into(line, at, encoding)))
    assert got == lsp.Range(start=lsp.Position(line=0, character=0), end=position_of(line, at + 1, encoding))


async def test_a_start_inside_a_character_rounds_down(client: LanguageClient):
    encoding = client.encoding
    line = 'y = "🙂 ok"\n'
    uri = f"file:///tmp/start_inside_{encoding}.py"
    open_document(client, uri, line)
    at = line.index("🙂")
    start = one_unit_into(line, at, encoding)  # inside 🙂 in utf-8 and utf-16; past it in utf-32
    expected_start = position_of(line, at if encoding != "utf-32" else at + 1, encoding)
    got = await rewrite_range(client, uri, lsp.Range(start=start, end=position_of(line, line.index("ok") + 2, encoding)))
    assert got is not None and got.start == expected_start


def inline(uri: str, position: lsp.Position) -> lsp.InlineCompletionParams:
    return lsp.InlineCompletionParams(
        text_document=lsp.TextDocumentIdentifier(uri=uri), position=position,
        context=lsp.InlineCompletionContext(trigger_kind=lsp.InlineCompletionTriggerKind.Invoked),
    )


@pytest.mark.parametrize("ending", ["\r\n", "\n"], ids=["crlf", "lf"])
async def test_answers_drafts_and_rewrites_carry_the_documents_line_ending(client: LanguageClient, ending: str):
    encoding = client.encoding
    text = FIB.read_text().replace("\n", ending)
    uri = f"file:///tmp/endings_{encoding}_{len(ending)}.py"
    open_document(client, uri, text)
    sent: list[str] = []
    for cursor in (text.index(f"    return {ending}") + len("    return "), text.index("    return [") + len("    ")):
        client.custom.clear()
        result = await within(client.text_document_inline_completion_async(inline(uri, position_of(text, cursor, encoding))))
        sent += [item.insert_text for item in result.items]
        sent += [params["text"] for method, params in client.custom if method == "dgemma/draft"]
    start, end = text.index("    if n < 2:"), len(text) - len(ending)
    selection = lsp.Range(start=position_of(text, start, encoding), end=position_of(text, end, encoding))
    actions = await within(client.text_document_code_action_async(lsp.CodeActionParams(
        text_document=lsp.TextDocumentIdentifier(uri=uri), range=selection, context=lsp.CodeActionContext(diagnostics=[]),
    )))
    for action in actions:
        resolved = await within(client.code_action_resolve_async(action))
        sent += [edit.new_text for edit in resolved.edit.changes[uri]]
    assert sent and any("\n" in text for text in sent), "nothing with a line break was sent: nothing checked"
    for piece in sent:
        assert not LONE_CR.search(piece), f"a lone CR in {piece!r}"
        if ending == "\r\n":
            assert not BARE_LF.search(piece), f"a bare LF in a CRLF document: {piece!r}"
        else:
            assert "\r" not in piece, f"a CR in an LF document: {piece!r}"
