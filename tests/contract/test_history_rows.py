"""One history row a state change, on the SQL stores (schema 12 on PostgreSQL, 10 on
SQLite): the units a transition moves ride in its row (`units`), and the view
`history_entries` reads every row, of this release or of the one before, as the
entries it records. `Store.history` is what it was: an entry for the task, then
one for each unit it moved, in the order they were written.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from sasflow.store import Store, open_store
from support.backends import STORES, FakeClock
from support.stores import PLANS, applies, claim_one, submitted

SQL_STORES = ("postgres", "sqlite")


class Raw:
    """Plain SQL on the store's own database, beside the store."""

    def __init__(self, kind: str, url: str) -> None:
        self._kind, self._url = kind, url

    def rows(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        if self._kind == "sqlite":
            with contextlib.closing(sqlite3.connect(self._url.removeprefix("sqlite:///"))) as db:
                found = db.execute(sql, params).fetchall()
                db.commit()
                return found
        with psycopg.connect(self._url, autocommit=True) as conn:
            cursor = conn.execute(sql.replace("?", "%s"), params)
            return cursor.fetchall() if cursor.description else []


@pytest.fixture(params=SQL_STORES)
async def opened(request: pytest.FixtureRequest, tmp_path: Path,
                 clock: FakeClock) -> AsyncIterator[tuple[Store, Raw]]:
    url = STORES[request.param](tmp_path)
    store = open_store(url, clock=clock)
    await store.get("none")  # migrated
    try:
        yield store, Raw(request.param, url)
    finally:
        await store.close()


async def test_a_task_of_three_steps_writes_five_history_rows_and_reads_eleven_entries(
        opened: tuple[Store, Raw], clock: FakeClock) -> None:
    store, raw = opened
    plan = PLANS["order"]
    await submitted(store, "order-1")
    task = await claim_one(store, "s1")
    for _ in range(3):
        clock.advance(1)
        task = await applies(store, task, plan.reply(task, "s1", True, {"ok": 1}, None,
                                                     clock.now))
    assert task.state == "processed"
    assert raw.rows("SELECT COUNT(*) FROM history WHERE task_id = ?", "order-1") == [(5,)]
    entries = await store.history("order-1")
    assert [(e.step, e.phase, e.from_state, e.to_state) for e in entries] == [
        (None, None, None, "pending"),
        (None, None, "pending", "processing"),
        ("reserve", "do", "pending", "running"),
        (None, None, "processing", "processing"),
        ("reserve", "do", "running", "completed"),
        ("charge", "do", "pending", "running"),
        (None, None, "processing", "processing"),
        ("charge", "do", "running", "completed"),
        ("ship", "do", "pending", "running"),
        (None, None, "processing", "processed"),
        ("ship", "do", "running", "completed"),
    ]
    units = [e for e in entries if e.step is not None]
    assert all(e.why is None and e.actor == "s1" and e.epoch == 1 for e in units)
    # a unit's entry is its transition's: the same moment
    task_entries = [e for e in entries if e.step is None]
    assert {e.at for e in units} <= {e.at for e in task_entries}


async def test_rows_the_release_before_wrote_read_as_before_beside_new_ones(
        opened: tuple[Store, Raw], clock: FakeClock) -> None:
    """A unit's move in a row of its own (units NULL), as before schema 12, then a
    transition of this release: the entries in the order written."""
    store, raw = opened
    await submitted(store, "order-1")
    insert = ("INSERT INTO history (task_id, step, phase, at, actor, epoch, from_state,"
              " to_state, why) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)")
    raw.rows(insert, "order-1", None, None, clock.now, "old", 1, "pending", "processing",
             "claimed; reserve started")
    raw.rows(insert, "order-1", "reserve", "do", clock.now, "old", 1, "pending", "running",
             None)
    clock.advance(1)
    task = await claim_one(store, "s1")  # (the store's row never saw the old claim)
    entries = await store.history("order-1")
    assert [(e.actor, e.step, e.to_state) for e in entries] == [
        ("submit", None, "pending"),
        ("old", None, "processing"),
        ("old", "reserve", "running"),
        ("s1", None, "processing"),
        ("s1", "reserve", "running"),
    ]
    assert entries[1].why == "claimed; reserve started" and entries[2].why is None
    assert task.epoch == 1
