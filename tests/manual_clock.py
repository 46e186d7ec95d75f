"""A clock that a test moves itself (imported as `manual_clock`): for code that takes `clock=`.

No test decides its verdict by the machine's clock: where code measures time (a quiet
window, a backoff, a parse budget, a loop stall), the test hands it this clock and says
how much time passed. Knows nothing of what reads it.
"""

from __future__ import annotations

import threading


class ManualClock:
    """Seconds that move only when `advance` is called, or by `tick` at every read."""

    def __init__(self, start: float = 1000.0, *, tick: float = 0.0) -> None:
        self._now = start
        self.tick = tick
        """Seconds each read moves the clock on (after returning): time as work done, where
        the work is the reading (a parse's progress callback reads the clock every few
        hundred bytes)."""
        self._changed = threading.Condition()
        self._reads: dict[int, int] = {}
        self._after_read: dict[int, float] = {}

    def __call__(self) -> float:
        with self._changed:
            now = self._now
            thread = threading.get_ident()
            self._now += self.tick + self._after_read.pop(thread, 0.0)
            self._reads[thread] = self._reads.get(thread, 0) + 1
            self._changed.notify_all()
        return now

    def advance_after_next_read(self, seconds: float) -> None:
        """Move the clock on by `seconds` right after the calling thread's next read: time that
        passes between that read and whatever the thread does next (a callback it posts waiting
        for the loop's thread to wake)."""
        with self._changed:
            self._after_read[threading.get_ident()] = seconds

    def advance(self, seconds: float) -> None:
        with self._changed:
            self._now += seconds

    def reads_by(self, thread: int) -> int:
        """How many times the thread with this ident (`threading.get_ident()`) read the clock."""
        with self._changed:
            return self._reads.get(thread, 0)

    def wait_for_read(self, thread: int, after: int, timeout: float = 60.0) -> bool:
        """Wait until that thread has read the clock more than `after` times; False on the timeout
        (a hang guard: the reading is what the test waits for, not a time)."""
        with self._changed:
            return self._changed.wait_for(lambda: self._reads.get(thread, 0) > after, timeout)
