"""The in-memory store's own behaviour (its verbs are in tests/contract/ with the others)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from sasflow.errors import ConfigurationError, StoreError
from sasflow.store import open_store
from sasflow.store.memory import MemoryStore
from sasflow.store.records import NewTask


def new_task(task_id: str) -> NewTask:
    return NewTask(task_id=task_id, workflow="order", input_json=b"{}",
                   steps=[("reserve", "inventory", f"key-{task_id}")])


async def test_stores_opened_on_one_name_share_their_tasks() -> None:
    """memory://NAME: two stores on one name are two hosts on one database; another
    name, or none, is a database of its own."""
    one, two = open_store("memory://shared-a"), open_store("memory://shared-a")
    other, private = open_store("memory://shared-b"), open_store("memory://")
    assert await one.submit(new_task("t-1"))
    assert (await two.get("t-1")) is not None
    assert await other.get("t-1") is None and await private.get("t-1") is None
    assert not await two.submit(new_task("t-1"))  # idempotent across them


def test_bad_memory_urls_are_refused_clearly() -> None:
    with pytest.raises(ConfigurationError, match="expected memory://NAME"):
        open_store("memory://name/path")
    with pytest.raises(StoreError, match="no memory store named 'never-opened'"):
        open_store("memory://never-opened", create=False)


async def test_joining_a_transaction_is_refused_with_nothing_written() -> None:
    store = MemoryStore()
    with pytest.raises(ConfigurationError, match="no transaction to join"):
        await store.submit(new_task("t-1"), connection=object())
    assert await store.get("t-1") is None


async def test_a_submission_from_another_thread_wakes_the_watchers() -> None:
    """The sync facade submits from the caller's thread: a watching scheduler hears of it
    on its own loop."""
    store = MemoryStore()
    heard = asyncio.Event()
    woken_in: list[int] = []

    def wake(at: float) -> None:
        woken_in.append(threading.get_ident())
        heard.set()

    watching = asyncio.create_task(store.watch(wake))
    await asyncio.sleep(0)
    thread = threading.Thread(target=store.submit_now, args=(new_task("t-1"),))
    thread.start()
    thread.join()
    async with asyncio.timeout(10):
        await heard.wait()
    watching.cancel()
    assert woken_in == [threading.get_ident()]


async def test_tasks_read_are_copies() -> None:
    """Changing a task read from the store changes nothing in it."""
    store = MemoryStore()
    await store.submit(new_task("t-1"))
    task = await store.get("t-1")
    assert task is not None
    task.steps[0].result = {"changed": True}
    task.failure_count = 99
    again = await store.get("t-1")
    assert again is not None and again.steps[0].result is None and again.failure_count == 0
