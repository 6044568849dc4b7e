"""Calls from other loops into one loop (loop_calls.py): each
runs in the home loop, in its caller's context, its answer or error to its caller
alone; those that arrive together go on one wake-up; a cancelled caller cancels its
call; a closed home loop is an error, not a wait."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import threading
from collections.abc import Iterator

import pytest

from sasflow import loop_calls
from sasflow.background_loop import BackgroundLoop
from sasflow.loop_calls import LoopCalls

WAIT = 60.0
_who: contextvars.ContextVar[str] = contextvars.ContextVar("who", default="nobody")


@pytest.fixture
def home() -> Iterator[BackgroundLoop]:
    loop = BackgroundLoop()
    yield loop
    loop.close()


def calls_of(home: BackgroundLoop) -> LoopCalls:
    return LoopCalls(home.loop)


def test_calls_run_in_the_home_loop_each_answered_to_its_caller(home: BackgroundLoop) -> None:
    calls = calls_of(home)

    async def where(n: int) -> tuple[int, asyncio.AbstractEventLoop, str]:
        if n == 3:
            raise ValueError(f"call {n} refused")
        return n, asyncio.get_running_loop(), _who.get()

    async def caller() -> list[object]:
        async def one(n: int) -> object:
            _who.set(f"caller {n}")  # each call runs in a copy of its caller's context
            return await calls(lambda: where(n))
        return await asyncio.gather(*(one(n) for n in range(6)), return_exceptions=True)

    answers = asyncio.run(caller())
    assert isinstance(answers[3], ValueError) and str(answers[3]) == "call 3 refused"
    assert answers[:3] + answers[4:] == [(n, home.loop, f"caller {n}") for n in (0, 1, 2, 4, 5)]


def test_calls_that_arrive_while_the_home_loop_is_busy_go_on_one_wake_up(
        home: BackgroundLoop, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = calls_of(home)
    deliveries: list[int] = []
    deliver = loop_calls._Mailbox._deliver

    def counted(box: loop_calls._Mailbox) -> None:
        if box is calls._inbox:
            deliveries.append(len(box._items))
        deliver(box)

    monkeypatch.setattr(loop_calls._Mailbox, "_deliver", counted)
    busy, release = threading.Event(), threading.Event()

    def hold_the_loop() -> None:
        busy.set()
        assert release.wait(WAIT)

    home.loop.call_soon_threadsafe(hold_the_loop)
    assert busy.wait(WAIT)

    async def double(n: int) -> int:
        return 2 * n

    async def caller() -> list[int]:
        pending = [asyncio.ensure_future(calls(functools.partial(double, n)))
                   for n in range(50)]
        await asyncio.sleep(0)  # every call posted while the home loop is held
        release.set()
        return list(await asyncio.gather(*pending))

    assert asyncio.run(caller()) == [2 * n for n in range(50)]
    assert deliveries == [50]


def test_a_cancelled_caller_cancels_its_call_in_the_home_loop(home: BackgroundLoop) -> None:
    calls = calls_of(home)
    running, cancelled = threading.Event(), threading.Event()

    async def forever() -> None:
        running.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    async def caller() -> None:
        call = asyncio.ensure_future(calls(forever))
        await asyncio.to_thread(running.wait, WAIT)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call

    asyncio.run(caller())
    assert cancelled.wait(WAIT)


def test_a_call_into_a_closed_home_loop_is_an_error(home: BackgroundLoop) -> None:
    calls = calls_of(home)
    home.close()

    async def nothing() -> None:
        raise AssertionError("never run")

    async def caller() -> None:
        with pytest.raises(RuntimeError):
            await calls(nothing)
        # and the next call is refused too, not left waiting behind the first
        with pytest.raises(RuntimeError):
            await calls(nothing)

    asyncio.run(caller())


def test_a_call_made_to_outlive_its_caller_runs_to_its_end(home: BackgroundLoop) -> None:
    """`outlive_caller`: the caller cancelled, and its loop closed, before the home loop
    took the call, the call still runs, and to its end."""
    calls = calls_of(home)
    busy, release, ended = threading.Event(), threading.Event(), threading.Event()

    def hold_the_loop() -> None:
        busy.set()
        assert release.wait(WAIT)

    async def write() -> None:
        await asyncio.sleep(0)
        ended.set()

    home.loop.call_soon_threadsafe(hold_the_loop)
    assert busy.wait(WAIT)

    async def caller() -> None:
        call = asyncio.ensure_future(calls(write, outlive_caller=True))
        await asyncio.sleep(0)  # posted while the home loop is held
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call

    asyncio.run(caller())  # the caller's loop is closed now
    release.set()
    assert ended.wait(WAIT)


def test_a_call_that_begins_a_future_is_answered_by_it_and_cancelled_through_it(
        home: BackgroundLoop) -> None:
    """A call whose `make` begins the work itself and gives its future (as a submission
    begins its write) is answered by that future, with no task around it: the future
    is what a cancelled caller cancels. One that raises as it begins is its caller's
    error."""
    calls = calls_of(home)
    begun: list[asyncio.Future[str]] = []
    inside_a_task: list[bool] = []
    each_begun = [threading.Event(), threading.Event()]
    second_ended = threading.Event()

    def begin() -> asyncio.Future[str]:
        inside_a_task.append(asyncio.current_task() is not None)
        future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        begun.append(future)
        if len(begun) == 2:
            future.add_done_callback(lambda _: second_ended.set())
        each_begun[len(begun) - 1].set()
        return future

    def refuse() -> asyncio.Future[str]:
        raise ValueError("refused as it began")

    async def caller() -> None:
        answered = asyncio.ensure_future(calls(begin))
        assert await asyncio.to_thread(each_begun[0].wait, WAIT)
        home.loop.call_soon_threadsafe(begun[0].set_result, "written")
        assert await answered == "written"
        cancelled = asyncio.ensure_future(calls(begin))
        assert await asyncio.to_thread(each_begun[1].wait, WAIT)
        cancelled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        with pytest.raises(ValueError, match="refused as it began"):
            await calls(refuse)

    asyncio.run(caller())
    assert inside_a_task == [False, False]
    assert second_ended.wait(WAIT) and begun[1].cancelled()
