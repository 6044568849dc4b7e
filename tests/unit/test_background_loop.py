"""The blocking facade's loop (background_loop.py): one answer per call, given by
the coroutine's end or, when promised, earlier by whoever makes the work durable."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Iterator

import pytest

from sasflow.background_loop import BackgroundLoop, answer_early, take_early_answer


@pytest.fixture
def background() -> Iterator[BackgroundLoop]:
    loop = BackgroundLoop()
    yield loop
    loop.close()


def test_a_call_returns_what_the_coroutine_returns(background: BackgroundLoop) -> None:
    async def double(n: int) -> int:
        await asyncio.sleep(0)
        return 2 * n

    assert background.call(double(21)) == 42


def test_a_call_raises_what_the_coroutine_raised(background: BackgroundLoop) -> None:
    async def fail() -> None:
        raise KeyError("missing")

    with pytest.raises(KeyError, match="missing"):
        background.call(fail())


def test_a_cancelled_coroutine_is_a_cancelled_call(background: BackgroundLoop) -> None:
    async def cancelled() -> None:
        asyncio.current_task().cancel()  # type: ignore[union-attr]
        await asyncio.sleep(1)

    with pytest.raises(concurrent.futures.CancelledError):
        background.call(cancelled())


def test_a_promised_answer_reaches_the_caller_before_the_coroutine_ends(
        background: BackgroundLoop) -> None:
    """The thread that makes the work durable answers; the coroutine ends after."""
    finish = threading.Event()
    ended = threading.Event()

    async def submit() -> str:
        answer_early("task-1")
        give = take_early_answer()
        assert give is not None and take_early_answer() is None  # given at most once
        threading.Thread(target=give).start()  # as the SQLite writer does, after a commit
        await asyncio.to_thread(finish.wait)
        ended.set()
        return "task-1"

    assert background.call(submit(), early=True) == "task-1"
    assert not ended.is_set()
    finish.set()


def test_only_the_coroutine_called_may_answer_early(background: BackgroundLoop) -> None:
    """A coroutine that submits among other work returns its own result, not the
    id the submission promised."""
    async def submit(n: int) -> str:
        answer_early(f"task-{n}")
        give = take_early_answer()
        if give is not None:
            give()
        await asyncio.sleep(0)
        return f"task-{n}"

    async def submit_all() -> list[str]:
        return [await submit(n) for n in range(3)]

    assert background.call(submit_all()) == ["task-0", "task-1", "task-2"]


def test_without_a_blocking_caller_nothing_is_promised(background: BackgroundLoop) -> None:
    async def submit() -> bool:
        answer_early("task-1")
        return take_early_answer() is None

    async def inside_another_coroutine() -> bool:
        return await submit()

    assert asyncio.run(inside_another_coroutine())


def test_a_blocking_call_inside_an_event_loop_is_refused(background: BackgroundLoop) -> None:
    async def quick() -> int:
        return 1

    async def caller() -> None:
        background.call(quick())

    with pytest.raises(RuntimeError, match="async twin"):
        asyncio.run(caller())
