"""The recent-edit log of one document: keystrokes merged into edits, shown as unified diffs.

A next-edit proposal is conditioned on what the user just changed (Zeta, REFERENCE.md: recent
edits as unified diffs in the prompt). Editors send keystrokes; a log of keystrokes says little,
so a change that touches (or is adjacent to) an edit already logged is merged into it: typing a
word, or selecting a name and typing its replacement, is one edit. An edit that the user typed
back to what it was (undo, or retyping) disappears. Each edit keeps its span in the current text
and the text that span replaced, so later changes elsewhere only shift it.

The last edit also feeds the revert filter (proposal.py: a proposal that would undo it is
dropped) and anchors the edit window (window.py). Knows only str offsets; no trees, no LSP.
"""

from __future__ import annotations

from dataclasses import dataclass

CAPACITY = 8
"""Edits remembered per document; older ones fall off (the prompt shows a bounded tail anyway)."""
DIFF_CHARS = 2000
"""Upper bound on the diffs' text in the prompt (~500 tokens, Zeta's budget)."""


@dataclass
class RecentEdit:
    """The user replaced `before` with what is now text[start:end]."""

    start: int
    end: int
    before: str


class EditLog:
    """The last CAPACITY edits of one text, oldest first, kept in the current text's offsets."""

    def __init__(self, capacity: int = CAPACITY) -> None:
        self.capacity = capacity
        self.edits: list[RecentEdit] = []

    @property
    def last(self) -> RecentEdit | None:
        return self.edits[-1] if self.edits else None

    def reset(self) -> None:
        """The whole text was replaced: no edit is known any more."""
        self.edits.clear()

    def record(self, text: str, start: int, end: int, new_text: str) -> None:
        """`text` (before the change) had [start, end) replaced by `new_text`."""
        delta = len(new_text) - (end - start)
        touching = [e for e in self.edits if e.start <= end and e.end >= start]
        if not touching and start == end and not new_text:
            return
        lo = min([start, *(e.start for e in touching)])
        hi = max([end, *(e.end for e in touching)])
        # What [lo, hi) of `text` was before the touching edits: their `before` where they are.
        before, at = [], lo
        for edit in sorted(touching, key=lambda e: e.start):
            before.append(text[at:edit.start])
            before.append(edit.before)
            at = edit.end
        before.append(text[at:hi])
        merged = RecentEdit(lo, hi + delta, "".join(before))
        now = text[lo:start] + new_text + text[end:hi]
        kept = []
        for edit in self.edits:
            if any(edit is t for t in touching):
                continue
            if edit.start >= end:  # wholly after the change: shifted
                edit.start += delta
                edit.end += delta
            kept.append(edit)
        if now != merged.before:  # typed back to what it was: no edit left
            kept.append(merged)
        self.edits = kept[-self.capacity:]

    def undo_last(self, text: str) -> str | None:
        """`text` with the last edit undone; None when there is none."""
        last = self.last
        return None if last is None else text[: last.start] + last.before + text[last.end:]

    def diffs(self, text: str, path: str = "file", max_chars: int = DIFF_CHARS) -> str:
        """The edits as unified diffs of whole lines, oldest first, the newest that fit in `max_chars`.

        Line numbers are those of the current text (an older edit's old side is numbered as if
        the edits after it were already there): the model needs where, not a patch to apply.
        """
        hunks: list[str] = []
        used = 0
        for edit in reversed(self.edits):
            hunk = unified_hunk(text, edit)
            if not hunk:
                continue
            if used + len(hunk) > max_chars:
                break
            hunks.append(hunk)
            used += len(hunk)
        if not hunks:
            return ""
        return f"--- a/{path}\n+++ b/{path}\n" + "".join(reversed(hunks))


def unified_hunk(text: str, edit: RecentEdit) -> str:
    """One `@@` hunk: the whole lines the edit touched, before and now."""
    line_start = text.rfind("\n", 0, edit.start) + 1
    line_end = text.find("\n", edit.end)
    line_end = len(text) if line_end < 0 else line_end + 1
    new_lines = text[line_start:line_end].splitlines(keepends=True)
    old_lines = (text[line_start:edit.start] + edit.before + text[edit.end:line_end]).splitlines(keepends=True)
    first = text.count("\n", 0, line_start) + 1
    # Whole lines on both sides may agree at the edges (an edit that inserted a line break).
    while old_lines and new_lines and old_lines[0] == new_lines[0]:
        old_lines.pop(0)
        new_lines.pop(0)
        first += 1
    while old_lines and new_lines and old_lines[-1] == new_lines[-1]:
        old_lines.pop()
        new_lines.pop()
    if not old_lines and not new_lines:
        return ""
    body = "".join(f"-{_line(line)}" for line in old_lines) + "".join(f"+{_line(line)}" for line in new_lines)
    return f"@@ -{first},{len(old_lines)} +{first},{len(new_lines)} @@\n{body}"


def _line(line: str) -> str:
    return line if line.endswith("\n") else line + "\n"
