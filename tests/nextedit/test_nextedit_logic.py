"""The torch-free next-edit pipeline on true next edits: edit log, window, hunk picking, filters.

Each case is an edit a user makes and the edit that should follow it; the "model" answer is the
window with that following edit made (what a perfect model would write), so what is checked is
what the pipeline keeps of it: the window holds it, the hunk picked is it, narrowed to its
characters; and what it drops: reverts, a reproduced window.
"""

from __future__ import annotations

from dgemma_lsp.engine.nextedit.edits import EditLog
from dgemma_lsp.engine.nextedit.proposal import (
    ProposedEdit,
    edit_key,
    pick_proposal,
    reverts_last_edit,
)
from dgemma_lsp.engine.nextedit.window import edit_window
from dgemma_lsp.engine.syntax.document import SyntaxDocument

SOURCE = '''import os


def load(path, mode):
    """Read the file at path."""
    with open(path, mode) as handle:
        data = handle.read()
    if not data:
        raise ValueError(path)
    return data


def unrelated():
    return 42
'''


def type_over(log: EditLog, text: str, start: int, end: int, new: str) -> str:
    """Select [start, end) and type `new` one character at a time, as an editor sends it."""
    log.record(text, start, end, "")
    text = text[:start] + text[end:]
    for i, char in enumerate(new):
        log.record(text, start + i, start + i, char)
        text = text[: start + i] + char + text[start + i:]
    return text


def test_keystrokes_merge_into_one_edit_with_a_diff():
    log = EditLog()
    at = SOURCE.index("path, mode")
    text = type_over(log, SOURCE, at, at + 4, "filename")
    assert len(log.edits) == 1
    edit = log.last
    assert (text[edit.start:edit.end], edit.before) == ("filename", "path")
    diff = log.diffs(text, "load.py")
    assert diff == ("--- a/load.py\n+++ b/load.py\n@@ -4,1 +4,1 @@\n"
                    "-def load(path, mode):\n+def load(filename, mode):\n")


def test_an_edit_typed_back_disappears_and_others_shift():
    log = EditLog()
    text = type_over(log, SOURCE, SOURCE.index("42"), SOURCE.index("42") + 2, "43")
    first = SOURCE.index("import os")
    text = type_over(log, text, first, first, "# x\n")
    assert len(log.edits) == 2
    assert text[log.edits[0].start:log.edits[0].end] == "43"  # shifted by the later insert above it
    at = text.index("43")
    text = type_over(log, text, at, at + 2, "42")
    assert [text[e.start:e.end] for e in log.edits] == ["# x\n"]


def test_the_window_is_the_function_around_the_cursor_and_the_last_edit():
    log = EditLog()
    at = SOURCE.index("path, mode")
    text = type_over(log, SOURCE, at, at + 4, "filename")
    window = edit_window(SyntaxDocument(text, "python"), log.last.end, log.last.end, max_lines=30, min_lines=1)
    assert text[window.start:window.end] == text[text.index("def load"):text.index("\n\n\ndef unrelated")] + "\n"


def test_the_window_is_bounded_in_lines():
    body = "".join(f"    x{i} = {i}\n" for i in range(100))
    text = f"def big():\n{body}"
    cursor = text.index("x50")
    window = edit_window(SyntaxDocument(text, "python"), cursor, cursor, max_lines=10, min_lines=10)
    assert text[window.start:window.end].count("\n") == 10
    assert window.start <= cursor < window.end


def perfect_answer(text: str, window, old: str, new: str) -> str:
    """The window with every `old` replaced by `new` (the true next edit, everywhere at once)."""
    return text[window.start:window.end].replace(old, new)


def test_the_true_next_edit_is_the_hunk_nearest_the_last_edit_and_narrowed():
    log = EditLog()
    at = SOURCE.index("path, mode")
    text = type_over(log, SOURCE, at, at + 4, "filename")
    doc = SyntaxDocument(text, "python")
    window = edit_window(doc, log.last.end, log.last.end)
    answer = perfect_answer(text, window, "path", "filename")
    edit = pick_proposal(text, window.start, window.end, answer, log.last.end)
    # Three lines still say `path`; the nearest to the signature is the docstring's, then `open(path`.
    assert edit is not None and edit.text == "filename"
    assert text[edit.start:edit.end] == "path"
    assert text[: edit.start].endswith('"""Read the file at ')
    assert not reverts_last_edit(text, edit, log.last)
    # Accepting it and asking again walks to the next line that still needs it.
    log.record(text, edit.start, edit.end, edit.text)
    text = edit.apply(text)
    window2 = edit_window(SyntaxDocument(text, "python"), log.last.end, log.last.end)
    edit2 = pick_proposal(text, window2.start, window2.end, perfect_answer(text, window2, "path", "filename"),
                          log.last.end)
    assert edit2 is not None and text[: edit2.start].endswith("with open(") and edit2.text == "filename"


def test_a_reproduced_window_is_no_edit():
    text = SOURCE
    window = edit_window(SyntaxDocument(text, "python"), 40, 40)
    assert pick_proposal(text, window.start, window.end, text[window.start:window.end], 40) is None
    # The model stopping before the last line break, or adding trailing blanks, is still no edit.
    assert pick_proposal(text, window.start, window.end, text[window.start:window.end].rstrip() + "\n\n", 40) is None


def test_an_edit_undoing_the_last_edit_is_a_revert():
    log = EditLog()
    at = SOURCE.index("path, mode")
    text = type_over(log, SOURCE, at, at + 4, "filename")
    last = log.last
    undo = ProposedEdit(last.start, last.end, "path")
    assert reverts_last_edit(text, undo, last)
    # Deleting what the user just typed is one too; changing it further is not.
    assert reverts_last_edit(text, ProposedEdit(last.start, last.start + 4, ""), last)
    assert not reverts_last_edit(text, ProposedEdit(last.start, last.end, "file_name"), last)
    # A model answer that reverts is picked as the nearest hunk, so the filter is what drops it.
    window = edit_window(SyntaxDocument(text, "python"), last.end, last.end)
    answer = text[window.start:window.end].replace("filename, mode", "path, mode")
    picked = pick_proposal(text, window.start, window.end, answer, last.end)
    assert picked is not None and reverts_last_edit(text, picked, last)


def test_the_edit_key_survives_lines_moving():
    text = SOURCE
    edit = ProposedEdit(text.index("42"), text.index("42") + 2, "43")
    moved = "# a new first line\n" + text
    same = ProposedEdit(edit.start + 19, edit.end + 19, "43")
    assert edit_key(text, edit) == edit_key(moved, same) == ("    return 42", "    return 43")
