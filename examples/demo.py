"""`make demo`: one inline completion and one rewrite through `dgemma-lsp --stdio --model tiny`.

A real LSP client (pygls') starts the server as a subprocess, opens examples/fib.py,
asks for an inline completion after `return ` with drafts on, and prints every draft
and the final items with timings; then asks again (answered from the cache) and runs
"Rewrite selection" through codeAction + codeAction/resolve. The tiny model has random
weights: its text is noise, the protocol and the timings are the point.
Usage: python examples/demo.py [--model tiny] [--steps 8]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

from lsprotocol import types as lsp
from pygls.lsp.client import LanguageClient

EXAMPLE = Path(__file__).resolve().parent / "fib.py"


def say(line: str) -> None:
    """The demo's output is its point: it goes to stdout (the server's logs go to stderr)."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def show(text: str, width: int = 72) -> str:
    shown = repr(text)
    return shown if len(shown) <= width else shown[: width - 3] + "..."


def field(value, name):
    """Untyped JSON objects arrive as namedtuples (pygls); typed ones as attrs classes."""
    return value[name] if isinstance(value, dict) else getattr(value, name)


class DemoClient(LanguageClient):
    def __init__(self) -> None:
        super().__init__("dgemma-demo", "0")
        self.started = time.perf_counter()
        self.ready = asyncio.Event()

    def stamp(self) -> str:
        return f"[{(time.perf_counter() - self.started) * 1000:8.1f} ms]"


def build_client() -> DemoClient:
    client = DemoClient()

    @client.feature("dgemma/draft")
    def on_draft(ls: DemoClient, params) -> None:
        say(f"{ls.stamp()} draft step {field(params, 'step'):>2}: {show(field(params, 'text'))}")

    @client.feature("dgemma/status")
    def on_status(ls: DemoClient, params) -> None:
        state = field(params, "state")
        latency = field(params, "lastLatencyMs")
        extra = f", last request {latency:.1f} ms" if latency is not None else ""
        message = field(params, "message")
        say(f"{ls.stamp()} status: {state} ({field(params, 'model')} on {field(params, 'device') or '?'}{extra})"
              + (f": {message}" if message else ""))
        if state in ("ready", "error"):
            ls.ready.set()

    @client.feature(lsp.WINDOW_WORK_DONE_PROGRESS_CREATE)
    def on_progress_create(ls: DemoClient, params) -> None:
        return None

    @client.feature(lsp.PROGRESS)
    def on_progress(ls: DemoClient, params) -> None:
        value = params.value
        say(f"{ls.stamp()} progress {field(value, 'kind')}: "
              f"{getattr(value, 'message', None) or (value.get('message') if isinstance(value, dict) else '')}")

    @client.feature(lsp.WINDOW_SHOW_MESSAGE)
    def on_message(ls: DemoClient, params: lsp.ShowMessageParams) -> None:
        say(f"{ls.stamp()} message: {params.message}")

    return client


async def demo(model: str, steps: int) -> int:
    client = build_client()
    command = [sys.executable, "-m", "dgemma_lsp.server.cli", "--stdio", "--model", model, "--engine", "inprocess"]
    say(f"starting: {' '.join(command[2:])}")
    await client.start_io(*command)
    caps = lsp.ClientCapabilities(
        window=lsp.WindowClientCapabilities(work_done_progress=True),
        general=lsp.GeneralClientCapabilities(position_encodings=["utf-16"]),
        text_document=lsp.TextDocumentClientCapabilities(
            code_action=lsp.CodeActionClientCapabilities(
                resolve_support=lsp.ClientCodeActionResolveOptions(properties=["edit"])
            )
        ),
    )
    options = {"drafts": True, "status": True, "steps": steps, "maxTokens": 32, "seed": 0, "maxCandidates": 2}
    await client.initialize_async(
        lsp.InitializeParams(capabilities=caps, initialization_options=options, process_id=None)
    )
    client.initialized(lsp.InitializedParams())
    await asyncio.wait_for(client.ready.wait(), 300)

    text = EXAMPLE.read_text()
    uri = EXAMPLE.as_uri()
    client.text_document_did_open(
        lsp.DidOpenTextDocumentParams(text_document=lsp.TextDocumentItem(uri=uri, language_id="python", version=1, text=text))
    )
    line_no = next(i for i, line in enumerate(text.splitlines()) if line.strip() == "return")
    line = text.splitlines()[line_no]
    position = lsp.Position(line=line_no, character=len(line))
    say(f"\n--- inline completion at {EXAMPLE.name}:{line_no + 1}:{len(line) + 1} (after {line.strip()!r}), Invoked")
    params = lsp.InlineCompletionParams(
        text_document=lsp.TextDocumentIdentifier(uri=uri),
        position=position,
        context=lsp.InlineCompletionContext(trigger_kind=lsp.InlineCompletionTriggerKind.Invoked),
    )
    for attempt in ("first request", "same request again (cache)"):
        started = time.perf_counter()
        result = await client.text_document_inline_completion_async(params)
        elapsed = (time.perf_counter() - started) * 1000
        say(f"{client.stamp()} {attempt}: {len(result.items)} item(s) in {elapsed:.1f} ms")
        for item in result.items:
            say(f"             insertText {show(item.insert_text)} range {item.range}")

    start_line = next(i for i, line in enumerate(text.splitlines()) if line.strip().startswith("if n < 2"))
    selection = lsp.Range(start=lsp.Position(line=start_line, character=0), end=lsp.Position(line=line_no, character=0))
    say(f"\n--- rewrite selection, lines {start_line + 1}-{line_no}: codeAction, then codeAction/resolve")
    actions = await client.text_document_code_action_async(lsp.CodeActionParams(
        text_document=lsp.TextDocumentIdentifier(uri=uri), range=selection, context=lsp.CodeActionContext(diagnostics=[])
    ))
    for action in actions:
        say(f"{client.stamp()} action: {action.title!r} kind={action.kind} edit={'yes' if action.edit else 'not yet'}")
        started = time.perf_counter()
        resolved = await client.code_action_resolve_async(action)
        elapsed = (time.perf_counter() - started) * 1000
        for edit in resolved.edit.changes[uri]:
            say(f"{client.stamp()} resolved in {elapsed:.1f} ms: replace {edit.range.start.line}:{edit.range.start.character}"
                  f"-{edit.range.end.line}:{edit.range.end.character} with {show(edit.new_text)}")

    await client.shutdown_async(None)
    client.exit(None)
    await client.stop()
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()
    return asyncio.run(demo(args.model, args.steps))


if __name__ == "__main__":
    sys.exit(main())
