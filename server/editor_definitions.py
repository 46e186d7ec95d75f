"""The `dgemma/definitions` request: definitions from the editor's other language servers, asked in the background.

A client that answers it says so in its capabilities, `experimental.dgemmaDefinitions: true`
(our VS Code extension and Neovim plugin do); any other client never gets the request. Then,
when an inline completion is asked for on a line whose surroundings changed, the server asks
the editor, without waiting for the answer:

    dgemma/definitions  {textDocument: {uri}, positions: [Position, ...], maxLines: N}
    answer: [[{uri, range, text}, ...] | null, ...]   one entry per position, in order:
            a list of definitions ([] when there is none), or null when not known (yet)

`positions` are names used near the cursor, outside the cursor's line (engine/crossfile/editor.py),
in the session's position encoding; the editor runs its definition providers at each (the
other language servers, never dgemma-lsp itself) and sends, per definition, its location and the
text of `maxLines` lines from the location's first line (the editor has the files, open or not).
The server reads `range.start.line` and `text` only.

Off the keystroke's path: on the event loop a keystroke costs a comparison of the text around the
cursor's line with the previous one; when it changed, the names are parsed on the syntax worker,
ahead of the prompt that reads them, and the question goes out from the loop. Nothing waits for
the answer. It is remembered per document and name (`invoice.total`) and used by every prompt
whose lines around the cursor use that name, the first such prompt after the answer arrives
included; a name is asked again after REFRESH_S, one
the editor did not know (null: its language server was still starting) after RETRY_S.
One request is in flight at a time; newer questions wait behind it, the newest per document
only. An error, garbage or no answer within TIMEOUT_S costs one log line and nothing else
(the completion never depended on it; a late answer is still used); after MAX_FAILURES in a row
the server stops asking for the session. Knows the request's JSON shapes, the documents' line
index and the syntax worker; the choice of names and of what the prompt shows is engine/crossfile/editor.py's.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from dgemma_lsp.engine.crossfile.editor import (
    DEFINITION_LINES,
    LINES_AFTER,
    LINES_BEFORE,
    EditorDefinition,
    NearName,
    header_of,
    names_near,
)

from .positions import LineIndex, code_units
from .workspace import uri_to_path

log = logging.getLogger(__name__)

CAPABILITY = "dgemmaDefinitions"
"""The client's `capabilities.experimental` key that says it answers METHOD."""
METHOD = "dgemma/definitions"
TIMEOUT_S = 2.0
"""An answer later than this counts as a failure (and is still used if it comes)."""
MAX_FAILURES = 3
"""Failures in a row after which the server stops asking (a client that advertised but cannot answer)."""
REFRESH_S = 30.0
"""A name's remembered answer is asked for again after this long (the other file may have changed)."""
RETRY_S = 2.0
"""Names of the question the editor did not know yet are asked again after this long."""
MAX_REMEMBERED = 2048
"""(document, name) answers remembered, least recently asked forgotten first."""
MAX_DEFINITIONS = 4
"""Definitions kept per name (an overloaded name: the first few)."""
MAX_TEXT_CHARS = 4000
"""A longer `text` in an answer is garbage."""


def client_supports(experimental: Any) -> bool:
    """Whether the client's `capabilities.experimental` says it answers METHOD."""
    if hasattr(experimental, "_asdict"):
        experimental = experimental._asdict()
    return isinstance(experimental, dict) and experimental.get(CAPABILITY) is True


class GarbageError(ValueError):
    """An answer that is not what METHOD returns."""


class EditorDefinitions:
    """The session's questions to the editor and its remembered answers."""

    def __init__(self, send: Callable[[str, dict], Any], post: Callable[[Callable[[], None]], None],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.send = send
        """(method, params) -> an asyncio future of the client's answer (pygls' `send_request_async`)."""
        self.post = post
        """Runs a job on the syntax worker (`SyntaxWorker.post`), in order with the prompts' jobs."""
        self.clock = clock
        self.enabled = False
        """Set at `initialize` from the client's capabilities; cleared after MAX_FAILURES."""
        self._current: dict[str, tuple[str, ...]] = {}
        """Per document: the names near the cursor of its latest completion, best first (written and read
        on the worker; the event loop only reads it)."""
        self._asked_at: dict[str, float] = {}
        """Per document: when its latest question went out (or was queued)."""
        self._around: dict[str, tuple[int, str, str]] = {}
        """Per document: the cursor's line and the text above and below it at its latest completion."""
        self._answers: OrderedDict[tuple[str, str], tuple[float, tuple[EditorDefinition, ...]]] = OrderedDict()
        """(uri, name) -> (when asked, its definitions); read by the syntax worker (`found`)."""
        self._waiting: OrderedDict[str, tuple[NearName, ...]] = OrderedDict()
        """Per document, the newest question not sent yet."""
        self._in_flight: int | None = None
        """The number of the request in flight, None when none."""
        self._sent = 0
        self._failures = 0

    # -- event loop side -----------------------------------------------------------------------

    def cursor(self, uri: str, language: str, lines: LineIndex, line: int, encoding: str) -> None:
        """A completion is asked for at `line`: note the names around it; ask the editor about new ones."""
        if not self.enabled:
            return
        first = max(0, line - LINES_BEFORE)
        last = min(lines.line_count - 1, line + LINES_AFTER)
        if last < first or line >= lines.line_count:
            return
        start, end = lines.offset(first, 0, "utf-32"), lines.line_end(last)
        here, here_end = lines.offset(line, 0, "utf-32"), lines.line_end(line)
        around = (line, lines.text[start:here], lines.text[here_end:end])
        now = self.clock()
        if self._around.get(uri) == around and not self._retry(uri, now):
            return  # typing on one line: the lines around it, so the question, are the same (no names parsed)
        self._around[uri] = around
        retry = self._retry(uri, now)
        text = lines.text[start:end]  # the lines are an immutable snapshot: the worker may read them later
        loop = asyncio.get_running_loop()
        # The names are parsed on the syntax worker (a few hundred microseconds, once per line): ahead
        # of this completion's prompt, which then reads them, and off the event loop.
        self.post(lambda: self._question(uri, language, text, first, line, encoding, now, retry, loop))

    def _question(self, uri: str, language: str, text: str, first: int, line: int, encoding: str, now: float,
                  retry: bool, loop: asyncio.AbstractEventLoop) -> None:
        """On the worker: the names around the cursor's line; those to ask about go to the event loop."""
        rows = text.split("\n")
        near = names_near([row.rstrip("\r") for row in rows], first, line, language)
        names = tuple(name.key for name in near)
        if self._current.get(uri) == names and not retry:
            return  # another line with the same names around it
        self._current[uri] = names  # read by `found`, on this thread
        wanted = []
        for name in near:
            answered = self._answers.get((uri, name.key))
            if answered is None or now - answered[0] > REFRESH_S:
                row = rows[name.line - first]
                wanted.append(NearName(name.key, name.line, code_units(row[:name.column], encoding)))
        if wanted:
            loop.call_soon_threadsafe(self._queue, uri, tuple(wanted), now)

    def _queue(self, uri: str, wanted: tuple[NearName, ...], now: float) -> None:
        self._asked_at[uri] = now
        self._waiting[uri] = wanted
        self._waiting.move_to_end(uri)
        self._ask_next()

    def _retry(self, uri: str, now: float) -> bool:
        """Whether the names of the document's question are due to be asked again: one still unanswered
        after RETRY_S, or one answered over REFRESH_S ago (an editor whose language server was still
        loading answers "no definition": the user typing on one line must not keep that for good)."""
        if now - self._asked_at.get(uri, now) < RETRY_S:
            return False
        for name in self._current.get(uri, ()):
            answered = self._answers.get((uri, name))
            if answered is None or now - answered[0] > REFRESH_S:
                return True
        return False

    def forget(self, uri: str) -> None:
        """The document closed."""
        self._around.pop(uri, None)
        self._current.pop(uri, None)
        self._asked_at.pop(uri, None)
        self._waiting.pop(uri, None)
        for key in [key for key in self._answers if key[0] == uri]:
            del self._answers[key]

    def _ask_next(self) -> None:
        if self._in_flight is not None or not self._waiting or not self.enabled:
            return
        uri, names = self._waiting.popitem(last=False)
        self._sent += 1
        number = self._in_flight = self._sent
        params = {"textDocument": {"uri": uri},
                  "positions": [{"line": name.line, "character": name.column} for name in names],
                  "maxLines": DEFINITION_LINES}
        try:
            future = self.send(METHOD, params)
        except Exception as error:  # the connection is closing
            log.info("%s not sent: %s", METHOD, error)
            self._in_flight = None
            return
        loop = asyncio.get_running_loop()
        timer = loop.call_later(TIMEOUT_S, self._timed_out, number)
        asked = self.clock()
        future.add_done_callback(lambda done: self._answered(number, uri, names, asked, done, timer))

    def _timed_out(self, number: int) -> None:
        if self._in_flight != number:
            return
        self._in_flight = None
        self._failed(f"no answer within {TIMEOUT_S:g} s (a later one is still used)")
        self._ask_next()

    def _answered(self, number: int, uri: str, names: tuple[NearName, ...], asked: float, done, timer) -> None:
        timer.cancel()
        if self._in_flight == number:
            self._in_flight = None
        try:
            if done.cancelled():
                raise GarbageError("the request was cancelled")
            answer = parse_answer(done.result(), len(names))
        except GarbageError as error:
            self._failed(f"unusable answer: {error}")
        except Exception as error:  # the client answered with an error
            self._failed(f"the editor answered with an error: {error}")
        else:
            self._failures = 0
            for name, definitions in zip(names, answer, strict=True):
                if definitions is None:
                    continue  # not known yet: asked again later
                self._answers[(uri, name.key)] = (asked, definitions)
                self._answers.move_to_end((uri, name.key))
            while len(self._answers) > MAX_REMEMBERED:
                self._answers.popitem(last=False)
            log.debug("%s: %d of %d names have definitions", METHOD, sum(1 for a in answer if a), len(names))
        self._ask_next()

    def _failed(self, why: str) -> None:
        self._failures += 1
        log.warning("%s: %s; the completions go on without the editor's definitions", METHOD, why)
        if self._failures >= MAX_FAILURES and self.enabled:
            self.enabled = False
            log.warning("%s: %d failures in a row, not asked again this session", METHOD, self._failures)

    # -- worker side ---------------------------------------------------------------------------

    def found(self, uri: str) -> list[tuple[str, tuple[EditorDefinition, ...]]]:
        """The answers for the names near the cursor of `uri`'s latest completion, best name first
        (those not answered yet are left out). Only dict reads: safe beside the event loop."""
        found = []
        for name in self._current.get(uri, ()):
            answered = self._answers.get((uri, name))
            if answered is not None and answered[1]:
                found.append((name, answered[1]))
        return found


def parse_answer(result: Any, count: int) -> list[tuple[EditorDefinition, ...] | None]:
    """The definitions per asked position (None: not known); GarbageError for anything but METHOD's answer."""
    result = _plain(result)
    if not isinstance(result, list) or len(result) != count:
        raise GarbageError(f"expected a list of {count} lists, got {_short(result)}")
    answer: list[tuple[EditorDefinition, ...] | None] = []
    for entry in result:
        if entry is None:
            answer.append(None)
            continue
        if not isinstance(entry, list):
            raise GarbageError(f"expected a list of definitions, got {_short(entry)}")
        definitions = []
        for item in entry:
            try:
                uri, text = item["uri"], item["text"]
                line = item["range"]["start"]["line"]
            except (TypeError, KeyError) as error:
                raise GarbageError(f"not a definition: {_short(item)}") from error
            if not (isinstance(uri, str) and isinstance(text, str) and isinstance(line, int)
                    and not isinstance(line, bool) and line >= 0 and len(text) <= MAX_TEXT_CHARS):
                raise GarbageError(f"not a definition: {_short(item)}")
            path = uri_to_path(uri)
            header = header_of(text)
            if path is None or not header or (line == 0 and item["range"]["start"].get("character") == 0):
                continue  # not a file on this machine, nothing to show, or a whole file (a module: `import x`)
            skipped = next((i for i, row in enumerate(text.split("\n")) if row.strip()), 0)  # blank lines header_of skips
            start = line + skipped
            definition = EditorDefinition(path, start, start + header.count("\n") + 1, header)
            if definition not in definitions:
                definitions.append(definition)
        answer.append(tuple(definitions[:MAX_DEFINITIONS]))
    return answer


def _plain(value: Any) -> Any:
    """pygls hands untyped JSON objects over as namedtuples: back to dicts and lists."""
    if hasattr(value, "_asdict"):
        return {k: _plain(v) for k, v in value._asdict().items()}
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:120] + "..."
