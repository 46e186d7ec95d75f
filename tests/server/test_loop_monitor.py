"""The loop monitor behind `bench latency`'s loopStallMs: it sees a blocked loop and cleans up after itself.

Its figures are read from a clock the test moves: "a handler holds the loop for 60 ms" is the
loop blocked while the clock moves 60 ms, so every figure is exact, whatever the machine's load.
"""

from __future__ import annotations

import asyncio
import threading

from manual_clock import ManualClock

from dgemma_lsp.server.loop_monitor import LoopMonitor, TimedEventLoop

HANG_GUARD_S = 60.0
"""Only for a thread that should end or act at once: a hang fails instead of stalling the run."""


def _monitor_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "dgemma-loop-monitor"]


def _join_monitor_threads() -> None:
    for thread in _monitor_threads():
        thread.join(HANG_GUARD_S)


def _hold_the_loop_with_a_probe_waiting(clock: ManualClock, seconds: float) -> None:
    """On the loop: block it while `seconds` pass on `clock`, with a probe callback posted before
    and waiting behind the block. The probe reads the clock once per callback it posts, and the
    loop once per callback it runs (nothing else reads it on a plain loop): equal counts mean
    none is in flight, and the probe posts the next one at once."""
    (probe,) = _monitor_threads()
    posted = clock.reads_by(probe.ident)
    if posted == clock.reads_by(threading.get_ident()):
        assert clock.wait_for_read(probe.ident, after=posted, timeout=HANG_GUARD_S)
    clock.advance(seconds)


async def _until_the_probe_ran(clock: ManualClock) -> None:
    (probe,) = _monitor_threads()
    while clock.reads_by(threading.get_ident()) < clock.reads_by(probe.ident):
        await asyncio.sleep(0)


def test_a_callback_that_blocks_the_loop_is_measured():
    clock = ManualClock()

    async def main() -> tuple[float, float]:
        monitor = LoopMonitor(clock=clock)
        monitor.start()
        monitor.take()
        _hold_the_loop_with_a_probe_waiting(clock, 0.06)  # a handler that holds the loop for 60 ms
        await _until_the_probe_ran(clock)  # the callback that waited behind it runs
        blocked = monitor.take()
        _hold_the_loop_with_a_probe_waiting(clock, 0.0)  # one more probe, nothing blocking it
        await _until_the_probe_ran(clock)
        after = monitor.take()
        monitor.stop()
        return blocked, after

    blocked, after = asyncio.run(main())
    assert blocked == 60.0
    assert after == 0.0  # take() starts over


def test_a_busy_pass_is_timed_on_the_timed_loop_and_only_there():
    clock = ManualClock()

    def advance_while_the_loop_waits(loop_thread: int, reads_before: int) -> None:
        # The loop's next read of the clock is its selector being entered: the pass is over.
        assert clock.wait_for_read(loop_thread, after=reads_before, timeout=HANG_GUARD_S)
        clock.advance(0.02)  # 20 ms pass while the loop waits in its selector for this thread

    async def main() -> tuple[float | None, float | None, float | None]:
        monitor = LoopMonitor(clock=clock)
        monitor.start()
        await asyncio.sleep(0)
        monitor.take_busy()
        clock.advance(0.03)  # our code holding the loop for 30 ms in one pass
        await asyncio.sleep(0)
        busy = monitor.take_busy()
        loop_thread = threading.get_ident()
        await asyncio.to_thread(advance_while_the_loop_waits, loop_thread, clock.reads_by(loop_thread))
        idle = monitor.take_busy()
        monitor.stop()
        return busy, idle, monitor.take_busy()

    with asyncio.Runner(loop_factory=lambda: TimedEventLoop(clock)) as runner:
        busy, idle, stopped = runner.run(main())
    assert busy == 30.0
    assert idle == 0.0  # the 20 ms spent waiting in the selector do not count
    assert stopped is None  # nothing watched once stopped
    assert asyncio.run(main())[0] is None  # another loop has no busy figure, and says so


def test_on_the_servers_loop_real_hand_offs_are_timed_without_a_thread_of_its_own():
    """On `TimedEventLoop` the monitor starts no probe: a callback posted from another thread times
    its wait, also where no pass of the loop saw it (the loop's thread waking up late); with
    `probe=True` the probing thread runs as well."""
    clock = ManualClock()

    def post(loop: asyncio.AbstractEventLoop, loop_thread: int, reads_before: int, arrived: asyncio.Event) -> None:
        # Once the loop waits in its selector (its next read of the clock), post; 50 ms pass
        # between the post and the loop's thread running it, outside any pass of the loop.
        assert clock.wait_for_read(loop_thread, after=reads_before, timeout=HANG_GUARD_S)
        clock.advance_after_next_read(0.05)  # the next read is the post's own time stamp
        loop.call_soon_threadsafe(arrived.set)

    async def main(probe: bool) -> tuple[bool, float, float, float | None]:
        monitor = LoopMonitor(probe=probe, clock=clock)
        monitor.start()
        probing = bool(_monitor_threads())
        await asyncio.sleep(0)
        idle = monitor.take()  # nothing posted, nothing held the loop
        monitor.take_busy()
        arrived = asyncio.Event()
        loop_thread = threading.get_ident()
        poster = threading.Thread(
            target=post, args=(asyncio.get_running_loop(), loop_thread, clock.reads_by(loop_thread), arrived)
        )
        poster.start()
        await arrived.wait()
        poster.join(HANG_GUARD_S)
        stall, busy = monitor.take(), monitor.take_busy()
        monitor.stop()
        return probing, idle, stall, busy

    _join_monitor_threads()
    with asyncio.Runner(loop_factory=lambda: TimedEventLoop(clock)) as runner:
        probing, idle, stall, busy = runner.run(main(probe=False))
    assert not probing  # no thread: the server's own traffic is timed
    assert idle == 0.0
    assert stall == 50.0 and busy == 0.0  # the hand-off saw it; no pass did
    with asyncio.Runner(loop_factory=lambda: TimedEventLoop(clock)) as runner:
        probing, _, stall, _ = runner.run(main(probe=True))
    assert probing and stall == 50.0


def test_stop_ends_the_monitor_thread_and_a_closed_loop_ends_it_too():
    _join_monitor_threads()

    async def stopped() -> bool:
        monitor = LoopMonitor()
        monitor.start()
        running = monitor.running
        await asyncio.sleep(0)
        monitor.stop()
        return running and not monitor.running

    assert asyncio.run(stopped())
    _join_monitor_threads()
    assert not _monitor_threads()

    async def left_running() -> None:
        LoopMonitor().start()
        await asyncio.sleep(0)

    asyncio.run(left_running())  # never stopped: the closed loop refuses its next callback
    _join_monitor_threads()
    assert not _monitor_threads()

    clock = ManualClock()

    async def start_only() -> None:
        LoopMonitor(clock=clock).start()

    loop = asyncio.new_event_loop()
    loop.run_until_complete(start_only())
    (probe,) = _monitor_threads()
    # The loop does not run: the probe's first callback waits in it, never run.
    assert clock.wait_for_read(probe.ident, after=0, timeout=HANG_GUARD_S)
    loop.close()  # closed with that callback in flight
    _join_monitor_threads()
    assert not _monitor_threads()
