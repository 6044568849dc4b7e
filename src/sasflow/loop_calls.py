"""Calls from other event loops into one loop, handed over in batches.

Two places call into a loop of another thread. A web application's loop that
submits while the roles run in a background thread calls into the PostgreSQL
pool's home loop (store/postgres/connections.py), and a task it submits claimed
is written and handed over on its scheduler's loop (client.py). One
`run_coroutine_threadsafe` a call costs four thread wake-ups (there: the loop's
self-pipe; back: the caller's), two chained futures and a task, and each wake-up
waits for the GIL: on the 2-core machine a submission from another loop took
2.3-2.6 times the CPU of one made in the home loop. Here the calls that arrive
while the loop has not yet taken the last ones go with them, on one wake-up
(45-48 of them with 256 submissions in flight); their answers go back to each
calling loop the same way. A submission from another loop then takes 1.3 times
the CPU of one made in the home loop (docs/benchmarks.md, bench/loop_submit.py).

Each call runs in a copy of its caller's context (as `call_soon_threadsafe` would
run it). A caller cancelled while its call runs cancels that call, unless the call
must outlive its caller (`outlive_caller`: a submission's write and hand-over).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

__all__ = ["LoopCalls", "into", "tell"]

_T = TypeVar("_T")
_V = TypeVar("_V")


def _of_loop(by_loop: dict[asyncio.AbstractEventLoop, _V], loop: asyncio.AbstractEventLoop,
             make: Callable[[], _V]) -> _V:
    """`by_loop[loop]`, made on first use, when the loops that have closed are
    forgotten (the caller holds the lock that guards `by_loop`)."""
    found = by_loop.get(loop)
    if found is None:
        for closed in [known for known in by_loop if known.is_closed()]:
            del by_loop[closed]
        found = by_loop[loop] = make()
    return found


def tell(loop: asyncio.AbstractEventLoop, callback: Callable[..., object], *args: Any) -> bool:
    """`callback(*args)` soon on `loop`, from any thread; from the loop's own thread
    without waking it through its self-pipe (a write, an extra turn and a read).

    False if the loop has closed: whoever listened there has gone, and has nothing
    left to be told. A thread that tells its listeners copies them under a lock and
    tells them after it, so one of them may leave, and its loop close, in between
    (a PostgreSQL notice of a task's end came to a waiter whose `asyncio.run` had
    just ended): that is no fault of the teller's.
    """
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    try:
        if running is loop:
            loop.call_soon(callback, *args)
        else:
            loop.call_soon_threadsafe(callback, *args)
    except RuntimeError:
        if not loop.is_closed():
            raise
        return False
    return True


_into: dict[asyncio.AbstractEventLoop, LoopCalls] = {}
_into_lock = threading.Lock()


def into(loop: asyncio.AbstractEventLoop) -> LoopCalls:
    """The process's calls into `loop`: one mailbox a loop, whoever calls (the
    PostgreSQL pool's home and a scheduler's loop are often the same one)."""
    with _into_lock:
        return _of_loop(_into, loop, lambda: LoopCalls(loop))


class _Call:
    __slots__ = ("caller", "context", "future", "make", "outlive_caller", "task")

    def __init__(self, make: Callable[[], Awaitable[Any]], caller: asyncio.AbstractEventLoop,
                 future: asyncio.Future[Any], outlive_caller: bool) -> None:
        self.make = make
        self.outlive_caller = outlive_caller
        self.caller = caller
        self.future = future  # the caller's, in the caller's loop
        self.context = contextvars.copy_context()
        self.task: asyncio.Future[Any] | None = None  # in the home loop, once started


class _Mailbox:
    """Items for one loop, taken all at once by one callback scheduled there."""

    def __init__(self, loop: asyncio.AbstractEventLoop, take: Callable[[list[Any]], None],
                 undeliverable: Callable[[list[Any], RuntimeError], None]) -> None:
        self._loop = loop
        self._take = take
        self._undeliverable = undeliverable
        self._lock = threading.Lock()
        self._items: list[Any] = []

    def post(self, item: Any) -> None:
        """Add `item`; the loop is woken only by the first item of a batch (the items
        posted meanwhile ride on that wake-up)."""
        with self._lock:
            self._items.append(item)
            if len(self._items) > 1:
                return
        try:
            self._loop.call_soon_threadsafe(self._deliver)
        except RuntimeError as closed:  # the loop is closed: none of them will be taken
            with self._lock:
                items, self._items = self._items, []
            self._undeliverable(items, closed)

    def _deliver(self) -> None:
        with self._lock:
            items, self._items = self._items, []
        self._take(items)


class LoopCalls:
    """Runs calls from any loop in `home`, a batch of them on each wake-up."""

    def __init__(self, home: asyncio.AbstractEventLoop) -> None:
        self._home = home
        self._inbox = _Mailbox(home, self._start, _fail)
        self._lock = threading.Lock()
        self._outboxes: dict[asyncio.AbstractEventLoop, _Mailbox] = {}  # by calling loop

    async def __call__(self, make: Callable[[], Awaitable[_T]], *,
                       outlive_caller: bool = False) -> _T:
        """The result of `make()`, called in the home loop: a coroutine (run as a task
        there) or a future of that loop; `outlive_caller`: it runs to its end there even
        if this caller is cancelled, or its loop closes, before."""
        caller = asyncio.get_running_loop()
        answer: asyncio.Future[_T] = caller.create_future()
        call = _Call(make, caller, answer, outlive_caller)
        self._inbox.post(call)
        try:
            return await answer
        except asyncio.CancelledError:
            if not outlive_caller:
                tell(self._home, _cancel, call)  # (False: the home loop is closed)
            raise

    # ------------------------------------------------------------ in the home loop
    def _start(self, calls: list[_Call]) -> None:
        for call in calls:
            # (read across threads: a hint; _cancel is sure)
            if call.future.cancelled() and not call.outlive_caller:
                continue
            call.task = self._begin(call)
            call.task.add_done_callback(functools.partial(self._answer, call))

    def _begin(self, call: _Call) -> asyncio.Future[Any]:
        """What `call.make()` gives, begun in the call's context: a coroutine as a task;
        a future (what a call began itself) as it is, with no task around it."""
        try:
            begun = call.context.run(call.make)
        except Exception as error:  # raised as it began: the caller's, as from a task
            failed = self._home.create_future()
            failed.set_exception(error)
            return failed
        if asyncio.iscoroutine(begun):
            return self._home.create_task(begun, context=call.context)
        return asyncio.ensure_future(begun, loop=self._home)

    def _answer(self, call: _Call, done: asyncio.Future[Any]) -> None:
        with self._lock:
            outbox = _of_loop(self._outboxes, call.caller,
                              lambda: _Mailbox(call.caller, _settle, _drop))
        outbox.post(call)


def _cancel(call: _Call) -> None:
    if call.task is not None:
        call.task.cancel()


def _fail(calls: list[_Call], error: RuntimeError) -> None:
    """The home loop is closed: each caller gets the error, in its loop."""
    for call in calls:
        tell(call.caller, _fail_one, call.future, error)  # (False: nobody waits)


def _fail_one(future: asyncio.Future[Any], error: RuntimeError) -> None:
    if not future.done():
        future.set_exception(error)


def _drop(calls: list[_Call], error: RuntimeError) -> None:
    """The caller's loop is closed: nobody waits for these answers."""


def _settle(calls: list[_Call]) -> None:
    """In the caller's loop: each call's answer to its caller."""
    for call in calls:
        task, future = call.task, call.future
        assert task is not None
        if future.done():
            continue
        if task.cancelled():
            future.cancel()
        elif (error := task.exception()) is not None:
            future.set_exception(error)
        else:
            future.set_result(task.result())
