"""The loop monitor behind `bench latency`'s loopStallMs: it sees a blocked loop and cleans up after itself."""

from __future__ import annotations

import asyncio
import threading
import time

from dgemma_lsp.server.loop_monitor import LoopMonitor, TimedEventLoop


def _monitor_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "dgemma-loop-monitor"]


def _wait_until_gone(deadline_s: float = 5.0) -> None:
    deadline = time.monotonic() + deadline_s
    while _monitor_threads() and time.monotonic() < deadline:
        time.sleep(0.01)


def test_a_callback_that_blocks_the_loop_is_measured():
    async def main() -> tuple[float, float]:
        monitor = LoopMonitor()
        monitor.start()
        await asyncio.sleep(0.05)
        monitor.take()
        time.sleep(0.06)  # a handler that holds the loop for 60 ms
        await asyncio.sleep(0.02)  # the callback that waited behind it runs
        blocked = monitor.take()
        after = monitor.take()
        monitor.stop()
        return blocked, after

    blocked, after = asyncio.run(main())
    # Lower bounds only: the posting thread may start late on a busy machine, never early.
    assert blocked >= 30.0
    assert after < blocked  # take() starts over


def test_a_busy_pass_is_timed_on_the_timed_loop_and_only_there():
    async def main() -> tuple[float | None, float | None, float | None]:
        monitor = LoopMonitor()
        monitor.start()
        await asyncio.sleep(0.02)
        monitor.take_busy()
        time.sleep(0.03)  # our code holding the loop for 30 ms in one pass
        await asyncio.sleep(0.01)
        busy = monitor.take_busy()
        await asyncio.sleep(0.02)  # idle: the loop waits in its selector, which is not busy
        idle = monitor.take_busy()
        monitor.stop()
        return busy, idle, monitor.take_busy()

    with asyncio.Runner(loop_factory=TimedEventLoop) as runner:
        busy, idle, stopped = runner.run(main())
    assert busy is not None and busy >= 30.0
    assert idle is not None and idle < 15.0  # the 20 ms spent waiting in the selector do not count
    assert stopped is None  # nothing watched once stopped
    assert asyncio.run(main())[0] is None  # another loop has no busy figure, and says so


def test_on_the_servers_loop_real_hand_offs_are_timed_without_a_thread_of_its_own():
    """On `TimedEventLoop` the monitor starts no probe: a callback posted from another thread while
    the loop is blocked times its wait; with `probe=True` the probing thread runs as well."""

    def post(loop: asyncio.AbstractEventLoop, arrived: asyncio.Event) -> None:
        loop.call_soon_threadsafe(arrived.set)

    async def main(probe: bool) -> tuple[bool, float, float]:
        monitor = LoopMonitor(probe=probe)
        monitor.start()
        probing = bool(_monitor_threads())
        await asyncio.sleep(0.02)
        idle = monitor.take()  # nothing posted, nothing held the loop
        arrived = asyncio.Event()
        threading.Thread(target=post, args=(asyncio.get_running_loop(), arrived)).start()
        time.sleep(0.05)  # a handler holding the loop: the callback the thread posted waits behind it
        await arrived.wait()
        stall = monitor.take()
        monitor.stop()
        return probing, idle, stall

    _wait_until_gone()
    with asyncio.Runner(loop_factory=TimedEventLoop) as runner:
        probing, idle, stall = runner.run(main(probe=False))
    assert not probing  # no thread: the server's own traffic is timed
    assert idle < 15.0
    assert stall >= 30.0
    with asyncio.Runner(loop_factory=TimedEventLoop) as runner:
        probing, _, stall = runner.run(main(probe=True))
    assert probing and stall >= 30.0


def test_stop_ends_the_monitor_thread_and_a_closed_loop_ends_it_too():
    _wait_until_gone()

    async def stopped() -> bool:
        monitor = LoopMonitor()
        monitor.start()
        running = monitor.running
        await asyncio.sleep(0.01)
        monitor.stop()
        return running and not monitor.running

    assert asyncio.run(stopped())
    _wait_until_gone()
    assert not _monitor_threads()

    async def left_running() -> None:
        LoopMonitor().start()
        await asyncio.sleep(0.01)

    asyncio.run(left_running())  # never stopped: the closed loop refuses its next callback
    _wait_until_gone()
    assert not _monitor_threads()

    async def start_only() -> None:
        LoopMonitor().start()

    loop = asyncio.new_event_loop()
    loop.run_until_complete(start_only())
    time.sleep(0.02)  # the loop does not run: the monitor's callback waits in it, never run
    loop.close()  # closed with that callback in flight
    _wait_until_gone()
    assert not _monitor_threads()
