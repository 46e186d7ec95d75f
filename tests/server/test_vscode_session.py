"""One `dgemma-lsp --stdio --model tiny-random` session with VS Code's recorded capabilities (UTF-16),
drafts and status opted in: capabilities, inline completion around non-BMP text, drafts,
latest-wins and explicit cancellation under a burst, rewrite code action + resolve, settings
changes, and every error path. Each test opens its own document."""

from __future__ import annotations

import asyncio
import difflib
import json
import subprocess
import sys

import pytest
import pytest_lsp
from lsp_session import (
    FAST,
    FIB,
    apply_item,
    capabilities,
    config,
    initialize,
    open_document,
    plain,
    position_of,
    send_raw,
    wait_until,
    within,
)
from lsprotocol import types as lsp
from pygls.exceptions import JsonRpcException
from pytest_lsp import LanguageClient

from dgemma_lsp.server.stats import stats_path, summarize

pytestmark = pytest.mark.asyncio(loop_scope="module")
ENCODING = "utf-16"
NON_BMP_LINE = 'label = "😀 漢字 é̃ 𝒳"; value = '


@pytest_lsp.fixture(scope="module", config=config())
async def client(lsp_client: LanguageClient):
    result = await initialize(
        lsp_client, capabilities("visual-studio-code"), {**FAST, "drafts": True, "status": True, "maxCandidates": 2}
    )
    lsp_client.init_result = result
    yield
    await lsp_client.shutdown_session()


def inline_params(uri, position, kind=lsp.InlineCompletionTriggerKind.Automatic, selected=None):
    return lsp.InlineCompletionParams(
        text_document=lsp.TextDocumentIdentifier(uri=uri),
        position=position,
        context=lsp.InlineCompletionContext(trigger_kind=kind, selected_completion_info=selected),
    )


async def complete(client, uri, position, **kwargs) -> lsp.InlineCompletionList:
    return await within(client.text_document_inline_completion_async(inline_params(uri, position, **kwargs)))


async def status(client) -> dict:
    return plain(await within(
        client.workspace_execute_command_async(lsp.ExecuteCommandParams(command="dgemma.status", arguments=[]))
    ))


async def test_capabilities(client: LanguageClient):
    caps = client.init_result.capabilities
    assert caps.position_encoding == lsp.PositionEncodingKind.Utf16
    sync = caps.text_document_sync
    assert sync.change == lsp.TextDocumentSyncKind.Incremental and sync.open_close
    assert caps.inline_completion_provider is not None
    assert list(caps.code_action_provider.code_action_kinds) == [lsp.CodeActionKind.RefactorRewrite]
    assert caps.code_action_provider.resolve_provider is True
    assert set(caps.execute_command_provider.commands) >= {"dgemma.rewriteSelection", "dgemma.status"}


async def test_model_loads_with_progress_and_status(client: LanguageClient):
    await wait_until(
        client, lambda: any(p["state"] == "ready" for m, p in client.custom if m == "dgemma/status"), "dgemma/status"
    )
    states = [p["state"] for m, p in client.custom if m == "dgemma/status"]
    assert states[0] == "loading" and "ready" in states
    (reports,) = client.progress_reports.values()
    assert isinstance(reports[0], lsp.WorkDoneProgressBegin)
    assert isinstance(reports[-1], lsp.WorkDoneProgressEnd)


async def test_completion_after_non_bmp_keeps_surrounding_text(client: LanguageClient):
    uri = "file:///tmp/non_bmp_utf16.py"
    text = NON_BMP_LINE + "\nprint(value)\n"
    cursor = len(NON_BMP_LINE)
    open_document(client, uri, text)
    result = await complete(client, uri, position_of(text, cursor, ENCODING))
    assert len(result.items) == 1  # Automatic: one candidate
    applied = apply_item(text, cursor, result.items[0], ENCODING)
    assert applied.startswith(NON_BMP_LINE)
    assert applied.endswith("\nprint(value)\n")


async def test_selected_completion_is_extended_and_replaced(client: LanguageClient):
    uri = "file:///tmp/selected_utf16.py"
    text = 'name = "😀"; total = na\n'
    cursor = text.index("na\n") + 2
    start = cursor - 2
    open_document(client, uri, text)
    selected = lsp.SelectedCompletionInfo(
        range=lsp.Range(start=position_of(text, start, ENCODING), end=position_of(text, cursor, ENCODING)),
        text="name",
    )
    result = await complete(client, uri, position_of(text, cursor, ENCODING), selected=selected)
    assert result.items
    for item in result.items:
        assert item.insert_text.startswith("name")
        assert item.range.start == selected.range.start
        applied = apply_item(text, cursor, item, ENCODING)
        assert applied.startswith('name = "😀"; total = name')
        assert applied.endswith("\n")


async def test_a_repeated_request_with_a_selected_completion_is_answered_from_the_cache(client: LanguageClient):
    """The text as if the popup's item were accepted has no change history: the cache entry is found
    by the hashes of the text before and after the cursor (computed on the worker meanwhile)."""
    uri = "file:///tmp/selected_repeat.py"
    text = "def area(width, height):\n    return wid\n"
    cursor = text.index("wid\n") + 3
    open_document(client, uri, text)
    selected = lsp.SelectedCompletionInfo(
        range=lsp.Range(start=position_of(text, cursor - 3, ENCODING), end=position_of(text, cursor, ENCODING)),
        text="width",
    )
    first = await complete(client, uri, position_of(text, cursor, ENCODING), selected=selected)
    drafts_before = sum(m == "dgemma/draft" for m, _ in client.custom)
    again = await complete(client, uri, position_of(text, cursor, ENCODING), selected=selected)
    assert [(i.insert_text, i.range) for i in again.items] == [(i.insert_text, i.range) for i in first.items]
    assert sum(m == "dgemma/draft" for m, _ in client.custom) == drafts_before  # answered without denoising


async def test_invoked_gives_up_to_max_candidates_and_repeat_is_cached(client: LanguageClient):
    uri = "file:///tmp/invoked.py"
    text = FIB.read_text()
    cursor = text.index("return \n") + len("return ")
    open_document(client, uri, text)
    position = position_of(text, cursor, ENCODING)
    first = await complete(client, uri, position, kind=lsp.InlineCompletionTriggerKind.Invoked)
    assert 1 <= len(first.items) <= 2
    drafts_before = sum(m == "dgemma/draft" for m, _ in client.custom)
    again = await complete(client, uri, position, kind=lsp.InlineCompletionTriggerKind.Invoked)
    assert [i.insert_text for i in again.items] == [i.insert_text for i in first.items]
    assert sum(m == "dgemma/draft" for m, _ in client.custom) == drafts_before  # answered without denoising


async def test_typed_ahead_is_answered_from_cache(client: LanguageClient):
    uri = "file:///tmp/typed_ahead.py"
    text = FIB.read_text()
    cursor = text.index("return \n") + len("return ")
    open_document(client, uri, text)
    first = await complete(client, uri, position_of(text, cursor, ENCODING))
    suggestion = first.items[0].insert_text
    typed = suggestion[:2]
    client.text_document_did_change(
        lsp.DidChangeTextDocumentParams(
            text_document=lsp.VersionedTextDocumentIdentifier(uri=uri, version=2),
            content_changes=[
                lsp.TextDocumentContentChangePartial(
                    range=lsp.Range(start=position_of(text, cursor, ENCODING), end=position_of(text, cursor, ENCODING)),
                    text=typed,
                )
            ],
        )
    )
    text = text[:cursor] + typed + text[cursor:]
    drafts_before = sum(m == "dgemma/draft" for m, _ in client.custom)
    second = await complete(client, uri, position_of(text, cursor + len(typed), ENCODING))
    assert second.items[0].insert_text == suggestion[len(typed):]
    assert sum(m == "dgemma/draft" for m, _ in client.custom) == drafts_before


async def test_drafts_arrive_in_order_before_the_answer(client: LanguageClient):
    uri = "file:///tmp/drafts.py"
    text = FIB.read_text().replace("return \n", "return fib(n - 1) + \n")
    cursor = text.index("+ \n") + 2
    open_document(client, uri, text)
    client.events.clear()
    position = position_of(text, cursor, ENCODING)
    task = asyncio.ensure_future(client.text_document_inline_completion_async(inline_params(uri, position)))
    task.add_done_callback(lambda _: client.events.append(("response", None)))
    result = await within(task)
    drafts = [p for m, p in client.events if m == "dgemma/draft"]
    assert [d["step"] for d in drafts] == [1, 2]  # steps=2, one canvas: one draft per step
    assert {d["uri"] for d in drafts} == {uri} and len({d["requestId"] for d in drafts}) == 1
    assert all(d["position"] == {"line": position.line, "character": position.character} for d in drafts)
    assert [m for m, _ in client.events if m != "dgemma/status"][-1] == "response"
    assert result.items


async def test_burst_while_typing_latest_wins(client: LanguageClient):
    """Neovim-style: 50 keystrokes, a request after each, no $/cancelRequest."""
    uri = "file:///tmp/burst.py"
    text = FIB.read_text()
    cursor = text.index("return \n") + len("return ")
    open_document(client, uri, text)
    typed = "fib(n - 1) + fib(n - 2) if n > 1 else n  # total o"
    assert len(typed) == 50
    requests = []
    for version, ch in enumerate(typed, start=2):
        here = position_of(text, cursor, ENCODING)
        client.text_document_did_change(
            lsp.DidChangeTextDocumentParams(
                text_document=lsp.VersionedTextDocumentIdentifier(uri=uri, version=version),
                content_changes=[lsp.TextDocumentContentChangePartial(range=lsp.Range(start=here, end=here), text=ch)],
            )
        )
        text, cursor = text[:cursor] + ch + text[cursor:], cursor + 1
        requests.append(client.text_document_inline_completion_async(inline_params(uri, position_of(text, cursor, ENCODING))))
    results = await within(asyncio.gather(*requests))
    assert len(results) == 50 and all(isinstance(r, lsp.InlineCompletionList) for r in results)
    assert results[-1].items, "the newest request must be answered with items"
    assert sum(1 for r in results if r.items) < 50  # older ones were superseded, not all computed
    state = await status(client)
    assert state["inFlight"] == 0 and state["state"] == "ready"


async def test_cancel_request_stops_denoising(client: LanguageClient):
    uri = "file:///tmp/cancel.py"
    text = FIB.read_text()
    open_document(client, uri, text)
    client.workspace_did_change_configuration(lsp.DidChangeConfigurationParams(settings={"dgemma": {"steps": 200}}))
    try:
        cancelled_before = (await status(client))["cancelled"]
        client.events.clear()
        position = position_of(text, text.index("return \n") + len("return "), ENCODING)
        request = asyncio.ensure_future(client.protocol.send_request_async(
            lsp.TEXT_DOCUMENT_INLINE_COMPLETION, inline_params(uri, position), msg_id="cancel-me"
        ))
        await wait_until(client, lambda: any(m == "dgemma/draft" for m, _ in client.events), "dgemma/draft")
        client.protocol.notify(lsp.CANCEL_REQUEST, lsp.CancelParams(id="cancel-me"))
        with pytest.raises(JsonRpcException) as error:
            await within(request)
        assert error.value.code == -32800  # RequestCancelled
        # pygls answers -32800 once the request's task has ended, and the task ends only after
        # the engine let go of the model: by now the engine has either stopped or finished.
        state = await status(client)
        assert state["inFlight"] == 0 and state["state"] == "ready"
        assert state["cancelled"] == cancelled_before + 1  # it stopped, before its 200th step
    finally:
        client.workspace_did_change_configuration(lsp.DidChangeConfigurationParams(settings={"dgemma": {"steps": 2}}))


async def test_rewrite_code_action_resolves_to_an_edit_of_exactly_the_selection(client: LanguageClient):
    uri = "file:///tmp/rewrite.py"
    text = FIB.read_text()
    start = text.index("    if n < 2:")
    end = text.index("    return \n")
    open_document(client, uri, text)
    selection = lsp.Range(start=position_of(text, start, ENCODING), end=position_of(text, end, ENCODING))
    actions = await within(client.text_document_code_action_async(lsp.CodeActionParams(
        text_document=lsp.TextDocumentIdentifier(uri=uri), range=selection, context=lsp.CodeActionContext(diagnostics=[])
    )))
    (action,) = actions
    assert action.kind == lsp.CodeActionKind.RefactorRewrite and action.edit is None  # computed on resolve only
    # A light touch: at strength 0.1 most of the selection must come back (its kept tokens are pinned).
    client.workspace_did_change_configuration(lsp.DidChangeConfigurationParams(settings={"dgemma": {"rewriteStrength": 0.1}}))
    try:
        resolved = await within(client.code_action_resolve_async(action))
    finally:
        client.workspace_did_change_configuration(lsp.DidChangeConfigurationParams(settings={"dgemma": {"rewriteStrength": 0.6}}))
    (edit,) = resolved.edit.changes[uri]
    assert edit.range == selection
    kept = difflib.SequenceMatcher(None, text[start:end], edit.new_text, autojunk=False)
    assert sum(block.size for block in kept.get_matching_blocks()) >= 0.7 * (end - start)
    # Applied, the line after the selection is still a line of its own.
    assert (text[:start] + edit.new_text + text[end:]).endswith("\n" + text[end:])

    empty = lsp.Range(start=selection.start, end=selection.start)
    none = await within(client.text_document_code_action_async(lsp.CodeActionParams(
        text_document=lsp.TextDocumentIdentifier(uri=uri), range=empty, context=lsp.CodeActionContext(diagnostics=[])
    )))
    assert not none


async def test_invalid_setting_falls_back_with_one_message(client: LanguageClient):
    before = len(client.messages)
    client.workspace_did_change_configuration(
        lsp.DidChangeConfigurationParams(settings={"dgemma": {**FAST, "maxCandidates": "lots"}})
    )
    await wait_until(client, lambda: len(client.messages) > before, lsp.WINDOW_SHOW_MESSAGE)
    (message,) = client.messages[before:]
    assert message.type == lsp.MessageType.Warning and "'maxCandidates'" in message.message


async def test_disabling_completions(client: LanguageClient):
    uri = "file:///tmp/disabled.py"
    text = FIB.read_text()
    open_document(client, uri, text)
    position = position_of(text, text.index("return \n") + len("return "), ENCODING)
    client.workspace_did_change_configuration(lsp.DidChangeConfigurationParams(settings={**FAST, "enable": False}))
    try:
        result = await complete(client, uri, position)
        assert not result.items
    finally:
        client.workspace_did_change_configuration(lsp.DidChangeConfigurationParams(settings={**FAST, "enable": True}))
    assert (await complete(client, uri, position)).items


@pytest.mark.parametrize(
    "method, params",
    [
        (  # unknown document
            lsp.TEXT_DOCUMENT_INLINE_COMPLETION,
            {"textDocument": {"uri": "file:///nowhere.py"}, "position": {"line": 0, "character": 0},
             "context": {"triggerKind": 1}},
        ),
        (  # position outside the document
            lsp.TEXT_DOCUMENT_INLINE_COMPLETION,
            {"textDocument": {"uri": "file:///tmp/errors.py"}, "position": {"line": 99, "character": 0},
             "context": {"triggerKind": 1}},
        ),
        (  # malformed params
            lsp.TEXT_DOCUMENT_INLINE_COMPLETION,
            {"textDocument": {"uri": "file:///tmp/errors.py"}, "position": {"line": "one", "character": 0}},
        ),
        (  # a rewrite of nothing
            lsp.WORKSPACE_EXECUTE_COMMAND,
            {"command": "dgemma.rewriteSelection", "arguments": ["file:///tmp/errors.py",
             {"start": {"line": 0, "character": 0}, "end": {"line": 0, "character": 0}}]},
        ),
        (  # a command with the wrong arguments
            lsp.WORKSPACE_EXECUTE_COMMAND,
            {"command": "dgemma.rewriteSelection", "arguments": [42]},
        ),
        (  # the benchmarks' command with an option of the wrong type
            lsp.WORKSPACE_EXECUTE_COMMAND,
            {"command": "dgemma.serverStats", "arguments": [{"probe": "yes"}]},
        ),
    ],
    ids=["unknown-document", "position-outside", "malformed-params", "empty-rewrite", "bad-command-args",
         "bad-stats-args"],
)
async def test_bad_requests_get_an_error_and_the_server_keeps_serving(client, method, params):
    open_document(client, "file:///tmp/errors.py", "x = 1\n")
    with pytest.raises(JsonRpcException) as error:
        await within(send_raw(client, method, params))
    assert error.value.code == -32602 and error.value.message  # InvalidParams, with a reason
    assert (await status(client))["state"] != "error"  # still serving


async def test_shown_and_accepted_completions_are_counted_for_stats(client: LanguageClient):
    path = stats_path()
    before = summarize(path)
    uri = "file:///tmp/stats.py"
    text = "def twice(x):\n    return \n"
    open_document(client, uri, text)
    result = await complete(client, uri, position_of(text, text.index("return ") + 7, ENCODING))
    client.protocol.notify("dgemma/didShowCompletion", {"item": {"insertText": "x * 2"}})
    client.protocol.notify("dgemma/didPartiallyAcceptCompletion", {"item": {"insertText": "x * 2"}, "acceptedLength": 2})
    assert (await status(client))["state"] != "error"  # a round trip: both notifications were handled
    after = summarize(path)
    assert after.answered == before.answered + (1 if result.items else 0)
    assert (after.shown, after.accepted) == (before.shown + 1, before.accepted + 1)
    assert after.latency_ms is not None
    # `dgemma-lsp stats` reads the same file.
    done = subprocess.run([sys.executable, "-m", "dgemma_lsp.server.cli", "stats", "--json"],
                          capture_output=True, text=True, check=True, timeout=60)
    assert json.loads(done.stdout)["accepted"] == after.accepted


async def test_the_answer_made_from_the_last_draft_is_the_finished_result(client: LanguageClient):
    """With drafts on, the newest draft is finished on the worker as the answer it would make, and
    used when the result is that text; with drafts off the result is finished after it came. The
    same request (same seed, same text) gets the same items either way."""
    text = FIB.read_text().replace("return \n", "return fib(n - 1) + \n")
    position = position_of(text, text.index("+ \n") + 2, ENCODING)

    async def answers_from_drafts() -> int:
        stats = await within(client.workspace_execute_command_async(
            lsp.ExecuteCommandParams(command="dgemma.serverStats", arguments=[])))
        return plain(stats)["answersFromDrafts"]

    before = await answers_from_drafts()
    open_document(client, "file:///tmp/answer-from-draft.py", text)
    from_draft = await complete(client, "file:///tmp/answer-from-draft.py", position)
    assert await answers_from_drafts() == before + 1  # the tiny model's result is its last draft

    # Closed, or the second prompt would show the first document as a similar open file (docs/context.md).
    client.text_document_did_close(lsp.DidCloseTextDocumentParams(
        text_document=lsp.TextDocumentIdentifier(uri="file:///tmp/answer-from-draft.py")))
    client.workspace_did_change_configuration(lsp.DidChangeConfigurationParams(settings={"dgemma": {"drafts": False}}))
    try:
        open_document(client, "file:///tmp/answer-from-result.py", text)
        from_result = await complete(client, "file:///tmp/answer-from-result.py", position)
        assert await answers_from_drafts() == before + 1
    finally:
        client.workspace_did_change_configuration(lsp.DidChangeConfigurationParams(settings={"dgemma": {"drafts": True}}))
    assert from_draft.items
    assert [(i.insert_text, i.range) for i in from_draft.items] == [(i.insert_text, i.range) for i in from_result.items]
