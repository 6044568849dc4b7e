"""A scheduler's waits for replies ended at their complete-by by one timer (deadlines.py):
never before their delay, in deadline order whatever order they were added in, a
discarded one never, and one whose delay has already passed at once; on both loops
sasflow runs on."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
import uvloop

from sasflow.deadlines import RESOLUTION, Deadlines

GUARD = 60.0  # a test that hangs fails here instead (not a bound on the delays)

Case = Callable[[], Coroutine[Any, Any, None]]


def run(case: Case, loop_kind: str) -> None:
    if loop_kind == "uvloop":
        uvloop.run(case())
    else:
        asyncio.run(case())


async def past_the_bucket_of(deadlines: Deadlines, delay: float) -> None:
    """Until a wait added now with `delay` would have been ended, and then some: a wait
    added three buckets later ends, so the timer has been past that bucket."""
    later: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    deadlines.add(delay + 3 * RESOLUTION, later)
    await asyncio.wait_for(later, GUARD)


def _note(ended: list[str], name: str, _: object) -> None:
    ended.append(name)


@pytest.fixture(params=["asyncio", "uvloop"])
def loop_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_a_wait_ends_with_none_not_before_its_delay(loop_kind: str) -> None:
    async def case() -> None:
        loop = asyncio.get_running_loop()
        deadlines = Deadlines(loop)
        future: asyncio.Future[str | None] = loop.create_future()
        began = loop.time()
        deadlines.add(0.05, future)
        assert await asyncio.wait_for(future, GUARD) is None
        assert loop.time() >= began + 0.05
    run(case, loop_kind)


def test_waits_end_in_deadline_order_whatever_order_they_were_added_in(loop_kind: str) -> None:
    async def case() -> None:
        loop = asyncio.get_running_loop()
        deadlines = Deadlines(loop)
        ended: list[str] = []
        futures: dict[str, asyncio.Future[None]] = {}
        for name, delay in (("late", 0.3), ("early", 0.02), ("middle", 0.1)):
            future: asyncio.Future[None] = loop.create_future()
            future.add_done_callback(functools.partial(_note, ended, name))
            deadlines.add(delay, future)
            futures[name] = future
        await asyncio.wait_for(futures["late"], GUARD)
        assert ended == ["early", "middle", "late"]
    run(case, loop_kind)


def test_an_earlier_wait_added_after_a_later_one_ends_at_its_own_deadline(
        loop_kind: str) -> None:
    async def case() -> None:
        loop = asyncio.get_running_loop()
        deadlines = Deadlines(loop)
        late: asyncio.Future[None] = loop.create_future()
        late_key = deadlines.add(3600.0, late)  # the timer is set for an hour from now
        early: asyncio.Future[str | None] = loop.create_future()
        deadlines.add(0.02, early)
        assert await asyncio.wait_for(early, GUARD) is None  # the timer was set earlier
        assert not late.done()
        deadlines.discard(late_key, late)
    run(case, loop_kind)


def test_a_discarded_wait_is_never_ended(loop_kind: str) -> None:
    async def case() -> None:
        loop = asyncio.get_running_loop()
        deadlines = Deadlines(loop)
        discarded: asyncio.Future[None] = loop.create_future()
        deadlines.discard(deadlines.add(0.01, discarded), discarded)
        await past_the_bucket_of(deadlines, 0.01)
        assert not discarded.done()
    run(case, loop_kind)


def test_a_wait_added_once_all_were_discarded_still_ends(loop_kind: str) -> None:
    async def case() -> None:
        loop = asyncio.get_running_loop()
        deadlines = Deadlines(loop)
        first: asyncio.Future[None] = loop.create_future()
        deadlines.discard(deadlines.add(10.0, first), first)  # its timer is let go
        second: asyncio.Future[str | None] = loop.create_future()
        deadlines.add(0.01, second)
        assert await asyncio.wait_for(second, GUARD) is None
        assert not first.done()
    run(case, loop_kind)


def test_a_wait_whose_deadline_passed_ends_on_the_loops_next_turns(loop_kind: str) -> None:
    async def case() -> None:
        loop = asyncio.get_running_loop()
        deadlines = Deadlines(loop)
        future: asyncio.Future[str | None] = loop.create_future()
        deadlines.add(-5.0, future)
        assert not future.done()  # never from within add: its caller has not waited yet
        await asyncio.wait_for(future, GUARD)
        assert future.result() is None
    run(case, loop_kind)


def test_a_wait_already_done_is_left_as_it_is(loop_kind: str) -> None:
    async def case() -> None:
        loop = asyncio.get_running_loop()
        deadlines = Deadlines(loop)
        replied: asyncio.Future[str | None] = loop.create_future()
        deadlines.add(0.01, replied)
        replied.set_result("reply")
        await past_the_bucket_of(deadlines, 0.01)
        assert replied.result() == "reply"
    run(case, loop_kind)
