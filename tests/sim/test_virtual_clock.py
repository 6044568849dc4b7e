"""The virtual clock: waiting costs no time, and threads' real work stops the clock."""

from __future__ import annotations

import asyncio
import threading

from sasflow.testing.clock import VirtualClock, VirtualClockLoop


def test_timers_fire_in_order_at_their_virtual_times() -> None:
    """An hour of sleeps and timeouts passes at once, each timer at its own time."""
    loop = VirtualClockLoop()
    fired: list[tuple[str, float]] = []

    async def sleeper(name: str, seconds: float) -> None:
        await asyncio.sleep(seconds)
        fired.append((name, loop.time()))

    async def main() -> None:
        await asyncio.gather(sleeper("hour", 3600), sleeper("second", 1), sleeper("day", 86400))
        try:
            async with asyncio.timeout(300):
                await asyncio.Event().wait()
        except TimeoutError:
            fired.append(("timeout", loop.time()))

    try:
        loop.run_until_complete(main())
    finally:
        loop.close()
    assert fired == [("second", 1.0), ("hour", 3600.0), ("day", 86400.0),
                     ("timeout", 86700.0)]


def test_virtual_time_stands_still_while_a_thread_works() -> None:
    """A result computed in a thread is never late: the clock waits for it."""
    loop = VirtualClockLoop()
    release = threading.Event()

    def work() -> str:
        release.wait(timeout=60)
        return "done"

    async def main() -> tuple[str, float]:
        pending = loop.run_in_executor(None, work)
        loop.call_later(5.0, lambda: None)  # a timer that could tempt the clock on
        await asyncio.sleep(0)
        assert loop.threads_busy == 1
        release.set()
        return await pending, loop.time()

    try:
        result, at = loop.run_until_complete(main())
    finally:
        loop.close()
    assert (result, at) == ("done", 0.0)


def test_a_jump_moves_the_wall_clock_not_the_timers() -> None:
    """The store's clock jumps (an NTP step); what was due in 5 s is still due in 5 s."""
    loop = VirtualClockLoop()
    clock = VirtualClock(loop, 1_000.0)

    async def main() -> tuple[float, float]:
        before = clock()
        clock.jump(-30.0)
        await asyncio.sleep(5)
        return before, clock()

    try:
        before, after = loop.run_until_complete(main())
    finally:
        loop.close()
    assert (before, after, loop.time()) == (1_000.0, 975.0, 5.0)


def test_rounds_without_time_moving_are_a_hot_loop() -> None:
    """A task that yields forever without waiting is stopped with a clear error."""
    loop = VirtualClockLoop(step_limit=1_000)

    async def spin() -> None:
        while True:
            await asyncio.sleep(0)

    try:
        loop.run_until_complete(spin())
    except RuntimeError as error:
        assert "1000 rounds of the event loop without time moving" in str(error)
    else:
        raise AssertionError("the spinning task was not stopped")
    finally:
        for task in asyncio.all_tasks(loop):
            task.cancel()
        loop.run_until_complete(asyncio.sleep(0))
        loop.close()
