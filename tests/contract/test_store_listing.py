"""The operator's reads of every store (SPEC U4): the task list's pages, the counts by
state, and an alert's acknowledgement. Run against every store, on its injected clock."""

from __future__ import annotations

import itertools

import msgspec

from sasflow.model import TaskState
from sasflow.store import Store
from sasflow.store.listing import TaskQuery, decode_cursor, encode_cursor
from support.stores import PLANS, Clock, claim_one, submitted

T = TaskState


async def _paged(store: Store, query: TaskQuery) -> list[list[str]]:
    """Every page of `query`, each going on from the cursor of the one before."""
    pages: list[list[str]] = []
    while True:
        page = await store.list_tasks(query)
        if page:
            pages.append([t.task_id for t in page])
        if len(page) < query.limit:
            return pages
        cursor = decode_cursor(encode_cursor(page[-1]))  # as a caller passes it back
        query = msgspec.structs.replace(query, after=cursor)


async def test_pages_follow_one_another_oldest_and_newest_first(store: Store,
                                                                 clock: Clock) -> None:
    """Keyset pages cover every task once, in order; tasks created in the same
    instant are told apart by their id."""
    for n in range(7):
        await submitted(store, f"t{n}")
        if n != 3:  # t3 and t4 share their created_at
            clock.advance(1)
    oldest = await _paged(store, TaskQuery(limit=3))
    assert oldest == [["t0", "t1", "t2"], ["t3", "t4", "t5"], ["t6"]]
    newest = await _paged(store, TaskQuery(limit=3, newest_first=True))
    assert newest == [["t6", "t5", "t4"], ["t3", "t2", "t1"], ["t0"]]


async def test_a_page_goes_on_where_it_was_whatever_is_submitted_meanwhile(
        store: Store, clock: Clock) -> None:
    """New tasks neither shift the next page nor show twice (an OFFSET would)."""
    await submitted(store, "a", "b", "c", "d")
    first = await store.list_tasks(TaskQuery(limit=2, newest_first=True))
    assert [t.task_id for t in first] == ["d", "c"]
    clock.advance(1)
    await submitted(store, "e", "f")
    rest = await store.list_tasks(TaskQuery(limit=10, newest_first=True,
                                            after=decode_cursor(encode_cursor(first[-1]))))
    assert [t.task_id for t in rest] == ["b", "a"]


async def test_pages_filter_by_state_workflow_and_creation_time(store: Store,
                                                                clock: Clock) -> None:
    start = clock.now
    for n, workflow in enumerate(["order", "slow", "order", "slow", "order"]):
        await submitted(store, f"t{n}", workflow=workflow)
        clock.advance(10)
    await claim_one(store, "s1", {"slow": PLANS["slow"]})  # t1 goes to processing
    ids = await _paged(store, TaskQuery(state=T.PENDING, workflow="slow", limit=5))
    assert ids == [["t3"]]
    ids = await _paged(store, TaskQuery(state=T.PENDING, limit=2, newest_first=True))
    assert ids == [["t4", "t3"], ["t2", "t0"]]
    ids = await _paged(store, TaskQuery(created_from=start + 10, created_to=start + 40,
                                        limit=2))
    assert ids == [["t1", "t2"], ["t3"]]
    ids = await _paged(store, TaskQuery(workflow="order", created_from=start + 20, limit=5,
                                        newest_first=True))
    assert ids == [["t4", "t2"]]
    assert await store.list_tasks(TaskQuery(state=T.ERROR)) == []


async def test_every_combination_of_filters_reads_the_same_tasks(store: Store,
                                                                 clock: Clock) -> None:
    """Each combination is a statement of its own: each must read what the filters say
    (the in-memory store's TaskQuery.matches is the reference)."""
    start = clock.now
    for n, workflow in enumerate(["order", "slow"] * 3):
        await submitted(store, f"t{n}", workflow=workflow)
        clock.advance(5)
    await claim_one(store, "s1", {"order": PLANS["order"]})
    every = await store.list_tasks(TaskQuery(limit=100))
    choices = {"state": (None, T.PENDING), "workflow": (None, "slow"),
               "created_from": (None, start + 5), "created_to": (None, start + 25),
               "after": (None, (every[2].created_at, every[2].task_id)),
               "newest_first": (False, True)}
    for values in itertools.product(*choices.values()):
        query = msgspec.convert({"limit": 100, **dict(zip(choices, values, strict=True))},
                                TaskQuery)
        expected = sorted((t for t in every if query.matches(t)),
                          key=lambda t: (t.created_at, t.task_id), reverse=query.newest_first)
        found = await store.list_tasks(query)
        assert [t.task_id for t in found] == [t.task_id for t in expected], query


async def test_counts_by_state(store: Store) -> None:
    assert await store.task_counts() == {}
    await submitted(store, "a", "b", "c")
    await claim_one(store, "s1")
    assert await store.task_counts() == {T.PENDING: 2, T.PROCESSING: 1}


async def test_an_alert_is_acknowledged_once_with_who_when_and_why(store: Store,
                                                                   clock: Clock) -> None:
    plan = PLANS["alerting"]
    await submitted(store, "a", workflow="alerting")
    task = await claim_one(store, "s1", {"alerting": plan})
    assert await store.apply(plan.reply(task, "s1", False, None, "declined", clock.now))
    [alert] = await store.alerts()
    assert alert.acknowledged_at is None
    clock.advance(5)
    acked = await store.acknowledge_alert(alert.id, by="operator:ann", why="card replaced")
    assert acked is not None
    assert (acked.acknowledged_at, acked.acknowledged_by, acked.acknowledged_why) == (
        clock.now, "operator:ann", "card replaced")
    clock.advance(5)
    again = await store.acknowledge_alert(alert.id, by="operator:bob", why="later")
    assert again == acked  # the first acknowledgement stands
    assert await store.alerts() == [acked]
    assert await store.acknowledge_alert(alert.id + 1000, by="x", why="y") is None
    assert await store.alert(alert.id + 1000) is None
