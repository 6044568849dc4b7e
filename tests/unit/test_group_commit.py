"""Group commit (store/pg_commit.py): how writes are gathered into batches, in-process.

The batch writer is a fake that records every batch it is given and can be held
open (a batch "in flight"), made to refuse single writes, or made to fail whole.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

import pytest

from sasflow.store.postgres.commit import GroupCommit

HANG_GUARD = 60  # seconds: only a hang fails on it, never a slow machine


@dataclass(frozen=True)
class W:
    task_id: str
    label: str = ""


class Writer:
    """A batch writer: records batches, answers ``task_id:label`` for each write."""

    def __init__(self) -> None:
        self.batches: list[list[W]] = []
        self.gate = asyncio.Event()  # a batch stays in flight until this is set
        self.gate.set()
        self.started = asyncio.Event()  # set when a batch is taken
        self.active = 0
        self.most_active = 0
        self.refuse: set[str] = set()  # these task ids get an exception of their own
        self.fail_batches: set[int] = set()  # these batches (by number) fail whole
        self.pause = 0.0

    async def __call__(self, batch: Sequence[W]) -> list[str | Exception]:
        number = len(self.batches)
        self.batches.append(list(batch))
        self.active += 1
        self.most_active = max(self.most_active, self.active)
        self.started.set()
        try:
            await self.gate.wait()
            await asyncio.sleep(self.pause)
            if number in self.fail_batches:
                raise RuntimeError(f"batch {number} failed")
            return [ValueError(f"refused {w.task_id}") if w.task_id in self.refuse
                    else f"{w.task_id}:{w.label}" for w in batch]
        finally:
            self.active -= 1

    def ids(self) -> list[list[str]]:
        return [[w.task_id for w in batch] for batch in self.batches]

    def labels(self) -> list[list[str]]:
        return [[f"{w.task_id}{w.label}" for w in batch] for batch in self.batches]

    async def hold_first(self, commit: GroupCommit[W, str], task_id: str = "first"
                         ) -> asyncio.Task[str]:
        """Put one batch in flight and keep it there until `gate` is set."""
        self.gate.clear()
        self.started.clear()
        held = asyncio.create_task(commit(W(task_id)))
        async with asyncio.timeout(HANG_GUARD):
            await self.started.wait()
        return held


def start(commit: GroupCommit[W, str], *writes: W) -> list[asyncio.Task[str]]:
    return [asyncio.create_task(commit(w)) for w in writes]


async def settle() -> None:
    """Let every task that can run do so (callers enqueue, flushers take)."""
    for _ in range(5):
        await asyncio.sleep(0)


async def test_a_lone_write_goes_at_once_in_a_batch_of_its_own() -> None:
    writer = Writer()
    commit: GroupCommit[W, str] = GroupCommit(writer)
    async with asyncio.timeout(HANG_GUARD):
        assert await commit(W("t1", "x")) == "t1:x"
    assert writer.ids() == [["t1"]]


async def test_writes_arriving_while_a_batch_is_in_flight_share_the_next_one() -> None:
    writer = Writer()
    commit: GroupCommit[W, str] = GroupCommit(writer, in_flight=2)
    held = await writer.hold_first(commit)
    later = start(commit, W("c"), W("a"), W("d"), W("b"))
    await settle()
    # the second flusher took the four writes together and is in flight too
    assert writer.ids() == [["first"], ["a", "b", "c", "d"]]
    writer.gate.set()
    async with asyncio.timeout(HANG_GUARD):
        results = await asyncio.gather(held, *later)
    assert results == ["first:", "c:", "a:", "d:", "b:"]
    assert writer.ids() == [["first"], ["a", "b", "c", "d"]]


async def test_with_one_transaction_in_flight_the_rest_wait_and_go_together() -> None:
    writer = Writer()
    commit: GroupCommit[W, str] = GroupCommit(writer, in_flight=1)
    held = await writer.hold_first(commit)
    later = start(commit, *(W(f"t{n}") for n in range(10)))
    await settle()
    assert writer.ids() == [["first"]]  # nothing else starts while the first is in flight
    writer.gate.set()
    async with asyncio.timeout(HANG_GUARD):
        await asyncio.gather(held, *later)
    assert writer.ids() == [["first"], [f"t{n}" for n in range(10)]]


async def test_never_more_than_in_flight_batches_at_once() -> None:
    writer = Writer()
    writer.pause = 0.005
    commit: GroupCommit[W, str] = GroupCommit(writer, in_flight=3, max_batch=2)

    async def trickle(n: int) -> str:
        await asyncio.sleep(0.001 * (n % 7))  # arriving while batches are in flight
        return await commit(W(f"t{n:02}"))

    async with asyncio.timeout(HANG_GUARD):
        results = await asyncio.gather(*(trickle(n) for n in range(40)))
    assert results == [f"t{n:02}:" for n in range(40)]
    assert writer.most_active == 3  # reached, and never passed
    written = sorted(task for batch in writer.ids() for task in batch)
    assert written == [f"t{n:02}" for n in range(40)]  # each exactly once
    assert all(1 <= len(batch) <= 2 for batch in writer.batches)


async def test_a_batch_holds_one_write_per_task_sorted_and_the_rest_follow_in_order() -> None:
    writer = Writer()
    commit: GroupCommit[W, str] = GroupCommit(writer, in_flight=1)
    held = await writer.hold_first(commit, "zz")
    later = start(commit, W("c", "1"), W("a", "1"), W("c", "2"), W("b", "1"), W("a", "2"),
                  W("c", "3"))
    await settle()
    writer.gate.set()
    async with asyncio.timeout(HANG_GUARD):
        results = await asyncio.gather(held, *later)
    assert results == ["zz:", "c:1", "a:1", "c:2", "b:1", "a:2", "c:3"]
    assert writer.labels() == [["zz"], ["a1", "b1", "c1"], ["a2", "c2"], ["c3"]]
    for batch in writer.ids():
        assert batch == sorted(set(batch))


async def test_a_second_write_for_a_task_goes_in_a_later_batch_after_the_first() -> None:
    writer = Writer()
    commit: GroupCommit[W, str] = GroupCommit(writer, in_flight=1)
    held = await writer.hold_first(commit, "t1")
    second = start(commit, W("t1", "again"), W("t2"))
    await settle()
    writer.gate.set()
    async with asyncio.timeout(HANG_GUARD):
        assert await asyncio.gather(held, *second) == ["t1:", "t1:again", "t2:"]
    assert writer.labels() == [["t1"], ["t1again", "t2"]]


async def test_two_waiting_writes_for_one_task_are_taken_in_the_order_they_came() -> None:
    writer = Writer()
    commit: GroupCommit[W, str] = GroupCommit(writer, in_flight=4)
    writes = start(commit, W("t1", "a"), W("t2"), W("t1", "b"), W("t1", "c"))
    async with asyncio.timeout(HANG_GUARD):
        assert await asyncio.gather(*writes) == ["t1:a", "t2:", "t1:b", "t1:c"]
    assert writer.labels()[0] == ["t1a", "t2"]
    assert [w for batch in writer.labels() for w in batch if w.startswith("t1")] == [
        "t1a", "t1b", "t1c"]
    assert all(len({w.task_id for w in b}) == len(b) for b in writer.batches)


async def test_an_exception_for_one_write_goes_to_that_caller_only() -> None:
    writer = Writer()
    writer.refuse = {"b"}
    commit: GroupCommit[W, str] = GroupCommit(writer, in_flight=1)
    held = await writer.hold_first(commit)
    later = start(commit, W("a"), W("b"), W("c"))
    await settle()
    writer.gate.set()
    async with asyncio.timeout(HANG_GUARD):
        results = await asyncio.gather(held, *later, return_exceptions=True)
    assert results[0] == "first:" and results[1] == "a:" and results[3] == "c:"
    assert isinstance(results[2], ValueError) and str(results[2]) == "refused b"
    assert writer.ids() == [["first"], ["a", "b", "c"]]


async def test_a_failed_batch_fails_all_its_callers_and_the_next_batch_still_works() -> None:
    writer = Writer()
    writer.fail_batches = {1}
    commit: GroupCommit[W, str] = GroupCommit(writer, in_flight=1)
    held = await writer.hold_first(commit)
    doomed = start(commit, W("a"), W("b"))
    await settle()
    writer.gate.set()
    async with asyncio.timeout(HANG_GUARD):
        assert await held == "first:"
        while len(writer.batches) < 2:
            await asyncio.sleep(0)
    # batch 1 (a, b) was taken: what comes now goes in batch 2
    after = start(commit, W("c"), W("a", "again"))
    async with asyncio.timeout(HANG_GUARD):
        failed = await asyncio.gather(*doomed, return_exceptions=True)
        assert await asyncio.gather(*after) == ["c:", "a:again"]
    assert [type(e) for e in failed] == [RuntimeError, RuntimeError]
    assert failed[0] is failed[1] and str(failed[0]) == "batch 1 failed"
    assert writer.ids() == [["first"], ["a", "b"], ["a", "c"]]
    async with asyncio.timeout(HANG_GUARD):
        assert await commit(W("d")) == "d:"  # the group commit keeps working


async def test_a_caller_cancelled_before_its_batch_is_taken_is_not_written() -> None:
    writer = Writer()
    commit: GroupCommit[W, str] = GroupCommit(writer, in_flight=1)
    held = await writer.hold_first(commit)
    gone, kept = start(commit, W("a"), W("b"))
    await settle()
    gone.cancel()
    await settle()
    writer.gate.set()
    async with asyncio.timeout(HANG_GUARD):
        assert list(await asyncio.gather(held, kept)) == ["first:", "b:"]
    with pytest.raises(asyncio.CancelledError):
        await gone
    assert writer.ids() == [["first"], ["b"]]


async def test_a_write_enqueued_as_a_future_goes_with_the_awaited_ones() -> None:
    """`enqueue` (what a store on the group commit's own loop uses, with no coroutine
    between the caller and its write) queues like a call: its result in its future."""
    writer = Writer()
    commit: GroupCommit[W, str] = GroupCommit(writer, in_flight=1)
    held = await writer.hold_first(commit)
    awaited = start(commit, W("a"))
    enqueued = commit.enqueue(W("b", "queued"))
    await settle()
    writer.gate.set()
    async with asyncio.timeout(HANG_GUARD):
        assert list(await asyncio.gather(held, *awaited, enqueued)) == [
            "first:", "a:", "b:queued"]
    assert writer.ids() == [["first"], ["a", "b"]]
