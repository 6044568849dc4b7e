"""A group-commit batch that mixes transitions and submissions on PostgreSQL is one
statement (postgres/queries.sql write_batch): each write's outcome is what it would
be written alone, and the whole batch commits together or not at all. Writes
past the batch's cap go in full batches, each write's outcome still its own.

Each test runs on a private schema of the local server (conftest STORES).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import psycopg
import pytest

from sasflow.errors import TaskConflictError
from sasflow.model import TaskState
from sasflow.store.postgres import PostgresStore
from sasflow.store.postgres.bulk import Claimed, Write, new_token, write_batch
from sasflow.store.postgres.commit import MAX_BATCH
from sasflow.store.rows import claimed_at_submission
from sasflow.transition import applied
from support.stores import (
    PLANS,
    Clock,
    StoreFactory,
    assert_stored_as_planned,
    fresh,
    new_task,
    submitted,
)

on_postgres = pytest.mark.parametrize("make_store", ["postgres"], indirect=True)


def postgres(make_store: StoreFactory, clock: Clock) -> PostgresStore:
    store = make_store(clock=clock)
    assert isinstance(store, PostgresStore)
    return store


async def history_of(store: PostgresStore, task_id: str) -> list[str]:
    return [entry.to_state for entry in await store.history(task_id) if entry.step is None]


@on_postgres
async def test_each_write_of_a_mixed_batch_has_the_outcome_it_has_alone(
        make_store: StoreFactory, clock: Clock) -> None:
    store = postgres(make_store, clock)
    await submitted(store, "moving", "fenced", "again", "other")
    now = store.now()
    moving = await fresh(store, "moving")
    claim = PLANS["order"].claim(moving, "w1", now)
    fenced = await fresh(store, "fenced")
    stale = PLANS["order"].cancel(fenced, now)
    assert await store.apply(PLANS["order"].claim(fenced, "w2", now))  # fenced moves on
    claimed_new = new_task("claimed-new")
    claimed_write, claimed_task = claimed_at_submission(PLANS["order"], claimed_new, "w1", now)
    batch: list[Write] = [
        claim,                                        # applies
        stale,                                        # its fence fails: nothing changes
        new_task("fresh"),                            # created, pending
        Claimed(claimed_new, claimed_write),          # created, already claimed
        new_task("again"),                            # the same task again: no-op
        new_task("other", input={"order": "changed"}),  # another task under that id
    ]
    async with await psycopg.AsyncConnection.connect(store.conninfo,
                                                      autocommit=True) as conn:
        outcomes = await write_batch(conn, batch, new_token(), now)
    assert outcomes[:5] == [True, False, True, True, False]
    assert isinstance(outcomes[5], TaskConflictError)

    assert (await fresh(store, "moving")).locked_by == "w1"
    assert (await fresh(store, "fenced")).locked_by == "w2"
    assert await history_of(store, "fenced") == ["pending", "processing"]
    created = await fresh(store, "fresh")
    assert created.state is TaskState.PENDING and created.locked_by is None
    assert [step.name for step in created.steps] == ["reserve", "charge", "ship"]
    assert_stored_as_planned(await fresh(store, "claimed-new"), claimed_task)
    assert (await fresh(store, "other")).input == {"order": "other"}  # left as it was


@on_postgres
async def test_a_mixed_batch_commits_together_or_not_at_all(
        make_store: StoreFactory, clock: Clock) -> None:
    store = postgres(make_store, clock)
    await submitted(store, "moving")
    now = store.now()
    claim = PLANS["order"].claim(await fresh(store, "moving"), "w1", now)
    async with await psycopg.AsyncConnection.connect(store.conninfo) as conn, (
            conn.transaction(force_rollback=True)):
        assert await write_batch(conn, [claim, new_task("fresh")], new_token(), now) == [
            True, True]
    assert (await fresh(store, "moving")).locked_by is None
    assert await store.get("fresh") is None


@on_postgres
async def test_writes_past_the_group_commits_cap_go_in_full_batches_each_as_alone(
        make_store: StoreFactory, clock: Clock) -> None:
    """More writes at once than a batch holds (commit.py MAX_BATCH): every one applies,
    as it would alone, in batches of at most the cap, the first of them full."""
    store = postgres(make_store, clock)
    ids = [f"t{n:04d}" for n in range(MAX_BATCH + 88)]
    await asyncio.gather(*(store.submit(new_task(task_id)) for task_id in ids))
    tasks = await asyncio.gather(*(fresh(store, task_id) for task_id in ids))
    now = store.now()
    claims = [PLANS["order"].claim(task, "w1", now) for task in tasks]
    assert store._commit is not None
    write = store._commit._write
    sizes: list[int] = []

    async def counted(batch: Sequence[Write]) -> list[bool | Exception]:
        sizes.append(len(batch))
        return await write(batch)

    store._commit._write = counted
    assert await asyncio.gather(*(store.apply(claim) for claim in claims)) == [True] * len(ids)
    assert max(sizes) == MAX_BATCH and sum(sizes) == len(ids)
    for task, claim in zip(tasks, claims, strict=True):
        assert_stored_as_planned(await fresh(store, task.task_id), applied(task, claim))
