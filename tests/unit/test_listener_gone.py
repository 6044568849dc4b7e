"""A listener whose event loop has closed is no fault of whoever tells it.

Every teller in sasflow copies its listeners under a lock and tells them after it:
the waiters of a task (signals.py), the schedulers to wake, the store's watchers
(memory and SQLite). One of them may leave, and its loop close, in between: CI saw
a PostgreSQL notice of a task's end reach a waiter whose `asyncio.run` had just
ended, and the listening thread died of `Event loop is closed`. Each case below
holds a listener registered on a loop that is then closed, the widest form of that
window, beside a listener on a live loop: the teller goes on, and the live one is
told.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import pytest

from sasflow.loop_calls import tell
from sasflow.model import Task, TaskState
from sasflow.scheduler import Scheduler
from sasflow.signals import InProcessSignals, Waiter
from sasflow.store import open_store
from sasflow.store.memory import MemoryStore
from sasflow.store.sqlite import SQLiteStore
from support.stores import new_task

WAIT = 30.0


@pytest.fixture
def gone() -> Iterator[asyncio.AbstractEventLoop]:
    """A loop to register on, closed by the test while the registrations stand."""
    loop = asyncio.new_event_loop()
    yield loop
    if not loop.is_closed():
        loop.close()


@pytest.fixture
def live() -> Iterator[asyncio.AbstractEventLoop]:
    """A loop running in its own thread, as a listener's would be."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join()
    loop.close()


def on(loop: asyncio.AbstractEventLoop, make: Callable[[], Any]) -> Any:
    """`make()`'s awaitable run on the live `loop`, its result returned here."""
    return asyncio.run_coroutine_threadsafe(make(), loop).result(WAIT)


def test_tell_runs_the_callback_on_an_open_loop_and_says_false_of_a_closed_one(
        live: asyncio.AbstractEventLoop, gone: asyncio.AbstractEventLoop) -> None:
    told = threading.Event()
    assert tell(live, told.set)
    assert told.wait(WAIT)
    gone.close()
    assert tell(gone, told.set) is False


def test_tell_from_the_loops_own_thread_runs_on_its_next_turn() -> None:
    async def main() -> list[str]:
        order: list[str] = []
        assert tell(asyncio.get_running_loop(), order.append, "told")
        order.append("teller went on")
        await asyncio.sleep(0)
        return order

    assert asyncio.run(main()) == ["teller went on", "told"]


class Waiting:
    """Waiters registered from their loops and left registered (a loop may close
    under one); the registrations are kept here, for a registration dropped would
    be finalized on its loop and the waiter removed."""

    def __init__(self, signals: InProcessSignals) -> None:
        self._signals = signals
        self._kept: list[Any] = []

    def on(self, loop: asyncio.AbstractEventLoop, task_id: str) -> Waiter:
        registration = self._signals.waiting(task_id)
        self._kept.append(registration)

        async def register() -> Waiter:
            waiter: Waiter = await registration.__aenter__()
            return waiter
        if loop.is_running():
            waiter: Waiter = on(loop, register)
            return waiter
        return loop.run_until_complete(register())


def told_on(loop: asyncio.AbstractEventLoop, waiter: Waiter) -> None:
    """The live waiter's event is set, as seen on its own loop."""
    async def wait() -> None:
        await asyncio.wait_for(waiter.event.wait(), WAIT)
    on(loop, wait)


@pytest.mark.parametrize("teller", ["finished", "let_go", "handed over", "dropped"])
def test_every_way_of_telling_a_task_waiter_passes_over_one_whose_loop_closed(
        teller: str, gone: asyncio.AbstractEventLoop,
        live: asyncio.AbstractEventLoop) -> None:
    signals = InProcessSignals(now=lambda: 0.0)
    signals.driving("t-1")
    waiting = Waiting(signals)
    left, staying = waiting.on(gone, "t-1"), waiting.on(live, "t-1")
    gone.close()
    if teller == "finished":  # a notice from the store's thread (PostgreSQL, SQLite)
        threading.Thread(target=signals.finished, args=("t-1",)).start()
    elif teller == "let_go":
        signals.let_go("t-1")
    else:
        handover = signals.ending("t-1")
        if teller == "handed over":
            handover.written(Task(task_id="t-1", workflow="order", input={},
                                  state=TaskState.PROCESSED))
        else:
            handover.dropped()
    told_on(live, staying)
    assert not left.event.is_set()


class _Woken:
    def __init__(self) -> None:
        self.times = threading.Event()

    def wake(self) -> None:
        self.times.set()


def test_waking_the_schedulers_passes_over_one_whose_loop_closed(
        gone: asyncio.AbstractEventLoop, live: asyncio.AbstractEventLoop) -> None:
    signals = InProcessSignals(now=lambda: 0.0)
    left, staying = _Woken(), _Woken()

    standing: list[Any] = []

    async def serve(scheduler: _Woken) -> None:  # entered, and left standing
        standing.append(signals.scheduler(cast(Scheduler, scheduler)))
        standing[-1].__enter__()

    gone.run_until_complete(serve(left))
    on(live, lambda: serve(staying))
    gone.close()
    signals.wake_schedulers()
    assert staying.times.wait(WAIT)
    assert not left.times.is_set()


def _watch_on(loop: asyncio.AbstractEventLoop, store: Any,
              woken: threading.Event) -> None:
    """`store.watch` started on `loop` and left watching (the loop not run again)."""
    async def start() -> None:
        loop.create_task(store.watch(lambda at: woken.set()))
        await asyncio.sleep(0)  # the watch registers before its first wait
    loop.run_until_complete(start())


def test_a_memory_store_submission_passes_over_a_watcher_whose_loop_closed(
        gone: asyncio.AbstractEventLoop, live: asyncio.AbstractEventLoop) -> None:
    store = MemoryStore()
    left, staying = threading.Event(), threading.Event()
    _watch_on(gone, store, left)
    watching = asyncio.run_coroutine_threadsafe(
        store.watch(lambda at: staying.set()), live)
    gone.close()
    # the live watch registers on its first turn; until then a submission would
    # wake nobody: submit until it hears
    n = 0
    while not staying.is_set():
        n += 1
        assert store.submit_now(new_task(f"t-{n}"))  # from this thread: no loop here
        staying.wait(0.05)
    watching.cancel()
    assert not left.is_set()


def test_a_sqlite_wake_between_processes_passes_over_a_watcher_whose_loop_closed(
        tmp_path: Path, gone: asyncio.AbstractEventLoop, live: asyncio.AbstractEventLoop,
        caplog: pytest.LogCaptureFixture) -> None:
    """The live watch also looks every quarter second by itself: what shows the
    wake-up path whole is that no listener of it failed (the channel logs each
    failure, and one failing stopped the others of that wake-up from hearing)."""
    url = f"sqlite:///{tmp_path / 'tasks.db'}"
    listening = open_store(url)
    other_process = open_store(url)
    assert isinstance(listening, SQLiteStore) and isinstance(other_process, SQLiteStore)
    left, staying = threading.Event(), threading.Event()
    try:
        _watch_on(gone, listening, left)
        gone.close()
        watching = asyncio.run_coroutine_threadsafe(
            listening.watch(lambda at: staying.set()), live)
        n = 0
        while not staying.is_set():  # (as above: until the live watch registered)
            n += 1
            assert asyncio.run(other_process.submit(new_task(f"t-{n}")))
            staying.wait(0.05)
        watching.cancel()
        assert not left.is_set()
        assert "a wake-up listener failed" not in caplog.text
    finally:
        listening.close_sync()
        other_process.close_sync()
