"""ChangeHistory: what no change touched since a revision, asked in any order."""

from __future__ import annotations

import random

from dgemma_lsp.engine.syntax.history import ChangeHistory


def _naive(changes, revision, length):
    head = tail = length
    for rev, start, tail_len in changes:
        if rev > revision:
            head, tail = min(head, start), min(tail, tail_len)
    return head, tail


def test_answers_equal_a_scan_of_every_change_whatever_the_order_of_questions():
    rng = random.Random(7)
    history, changes, text, revision = ChangeHistory(capacity=64), [], "x" * 200, 0
    history.reset(revision)
    for _ in range(300):
        start = rng.randrange(len(text) + 1)
        end = min(len(text), start + rng.randrange(4))
        new = "y" * rng.randrange(4)
        tail_len = len(text) - end
        text = text[:start] + new + text[end:]
        revision += 1
        history.record(revision, start, tail_len)
        changes = (changes + [(revision, start, tail_len)])[-64:]
        oldest_known = changes[0][0] - 1 if len(changes) == 64 else 0
        # A cache asks newest first (one walk for the series), then at random (walks restart).
        asked = list(range(revision, max(-1, revision - 80), -1)) + [rng.randrange(revision + 1) for _ in range(5)]
        for r in asked:
            expected = None if r < oldest_known else _naive(changes, r, len(text))
            assert history.unchanged_since(r, len(text)) == expected, (r, revision)


def test_a_whole_text_replacement_forgets_what_came_before():
    history = ChangeHistory()
    history.record(1, 5, 10)
    history.reset(2)
    assert history.unchanged_since(1, 20) is None
    assert history.unchanged_since(2, 20) == (20, 20)
    history.record(3, 4, 6)
    assert history.unchanged_since(2, 20) == (4, 6)
    copy = history.copy()
    history.record(4, 0, 0)
    assert copy.unchanged_since(2, 20) == (4, 6)  # a snapshot keeps its own history
