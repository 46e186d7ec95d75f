"""From the model's rewrite of the edit window to at most one proposed edit, and its filters.

The model rewrites the whole window; the proposal is one hunk of the line diff between the
window and that answer, the hunk nearest the user's last edit (an answer may change several
places: Copilot's several edits are alternatives, not a sequence, and one at a time is what a
user can judge). The hunk is narrowed to the characters that differ, so a renamed argument is
proposed as that name, not as the whole line. An answer that reproduces the window (trailing
whitespace aside) is "no edit": a normal answer, not a failure.

Filters, applied by whoever shows the edit:
- `reverts_last_edit`: a proposal that undoes the user's last edit (the whole of it, or deletes
  what the user just typed) is dropped: the user made that change on purpose;
- `edit_key`: a position-free identity (the whole lines before and after), so a rejected edit is
  recognised again after unrelated lines moved it.

difflib is the standard library's; no diff package would change the result. Knows str offsets;
no trees, no LSP.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

from .edits import RecentEdit


@dataclass(frozen=True)
class ProposedEdit:
    """Replace text[start:end] of the document the proposal was made for with `text`."""

    start: int
    end: int
    text: str

    def apply(self, document: str) -> str:
        return document[: self.start] + self.text + document[self.end:]


def window_hunks(window_text: str, answer: str, window_start: int) -> list[ProposedEdit]:
    """Every changed block of whole lines (a block replacing as many lines line by line), in document offsets (empty when the answer reproduces the window)."""
    if window_text.endswith("\n") and not answer.endswith("\n"):
        answer += "\n"  # the model's answer stops at the last line's end or before it
    if answer.rstrip() == window_text.rstrip():
        return []
    old = window_text.splitlines(keepends=True)
    new = answer.splitlines(keepends=True)
    starts = [0]
    for line in old:
        starts.append(starts[-1] + len(line))
    hunks = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, old, new, autojunk=False).get_opcodes():
        if tag == "equal":
            continue
        if tag == "replace" and i2 - i1 == j2 - j1:
            # Line for line (a rename on consecutive lines): each line is a hunk of its own, so one
            # line's change can be proposed without its neighbour's.
            for offset in range(i2 - i1):
                i = i1 + offset
                hunks.append(ProposedEdit(window_start + starts[i], window_start + starts[i + 1], new[j1 + offset]))
        else:
            hunks.append(ProposedEdit(window_start + starts[i1], window_start + starts[i2], "".join(new[j1:j2])))
    return hunks


def narrow(document: str, edit: ProposedEdit) -> ProposedEdit | None:
    """The same edit, cut to the characters that change; None when nothing does."""
    old = document[edit.start:edit.end]
    new = edit.text
    head = 0
    while head < min(len(old), len(new)) and old[head] == new[head]:
        head += 1
    tail = 0
    while tail < min(len(old), len(new)) - head and old[len(old) - 1 - tail] == new[len(new) - 1 - tail]:
        tail += 1
    if head == len(old) == len(new):
        return None
    return ProposedEdit(edit.start + head, edit.end - tail, new[head: len(new) - tail])


def distance(edit: ProposedEdit, anchor: int) -> int:
    """Characters between the edit's span and `anchor` (0 when the span holds it)."""
    if edit.start <= anchor <= edit.end:
        return 0
    return edit.start - anchor if anchor < edit.start else anchor - edit.end


def pick_proposal(
    document: str, window_start: int, window_end: int, answer: str, anchor: int
) -> ProposedEdit | None:
    """The one edit to propose from `answer` (the model's rewrite of document[window_start:window_end]):
    the changed hunk nearest `anchor` (the user's last edit), narrowed; None for "no edit"."""
    hunks = window_hunks(document[window_start:window_end], answer, window_start)
    narrowed = [edit for edit in (narrow(document, hunk) for hunk in hunks) if edit is not None]
    if not narrowed:
        return None
    return min(narrowed, key=lambda edit: (distance(edit, anchor), edit.start))


def reverts_last_edit(document: str, edit: ProposedEdit, last: RecentEdit | None) -> bool:
    """Whether `edit` undoes the user's last edit: all of it (the text as before that edit), or
    by deleting what the user just typed (a pure deletion inside the span they typed)."""
    if last is None:
        return False
    undone = document[: last.start] + last.before + document[last.end:]
    if edit.apply(document) == undone:
        return True
    return not edit.text and edit.start < edit.end and last.start <= edit.start and edit.end <= last.end


def edit_key(document: str, edit: ProposedEdit) -> tuple[str, str]:
    """(the whole lines the edit touches, the same lines after it): the same edit, wherever it moved."""
    line_start = document.rfind("\n", 0, edit.start) + 1
    line_end = document.find("\n", edit.end)
    line_end = len(document) if line_end < 0 else line_end
    before = document[line_start:line_end]
    after = document[line_start:edit.start] + edit.text + document[edit.end:line_end]
    return before, after
