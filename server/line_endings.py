"""The document's own line ending, applied to every text the server sends into it.

The engine writes "\\n" (and a model may emit "\\r\\n" or a lone "\\r"). LSP counts a
lone "\\r" as a line break but editors keep it inside the line, so one lone "\\r" in
an answer makes the server's line numbers and the editor's disagree from then on
(a later suggestion lands left of the cursor, a rewrite's range is cut short). So
every answer, draft and rewrite is normalised here: each "\\r\\n", "\\r" and "\\n"
becomes the document's line ending, which is "\\r\\n" when the document's first line
break is one and "\\n" otherwise (a document of lone "\\r" breaks gets "\\n": no
editor we serve keeps such files, and a lone "\\r" is what must never be sent).
Knows nothing of LSP, positions or the engine.
"""

from __future__ import annotations

import re

_BREAK = re.compile(r"\r\n?|\n")


def line_ending(text: str) -> str:
    """The line ending a document uses: that of its first line break; "\\n" without one."""
    newline = text.find("\n")
    return "\r\n" if newline > 0 and text[newline - 1] == "\r" else "\n"


def with_line_ending(text: str, ending: str) -> str:
    """`text` with every line break ("\\r\\n", lone "\\r", "\\n") written as `ending`."""
    if "\r" not in text and (ending == "\n" or "\n" not in text):
        return text  # the common case costs one or two scans
    return _BREAK.sub(ending, text)
