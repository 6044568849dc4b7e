"""A private event loop in a background thread: the blocking methods' way into
the async core (STYLE: an async core with a thin sync facade, not two copies).

A blocking call waits for one answer, which the coroutine's ending gives. A
coroutine that knows its result before it ends may have it given earlier, from
another thread, by whoever learns first that the work is done (`answer_early`,
`take_early_answer`): a submission is answered by the SQLite writer's commit
itself, instead of by the loop once it gets round to resuming the coroutine, the
hop that cost a sequential submitter most of its time while the loop ran the
roles (docs/benchmarks.md).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import queue
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from sasflow import event_loops

__all__ = ["BackgroundLoop", "answer_early", "refuse_inside_a_loop", "take_early_answer"]

T = TypeVar("T")

# (True, result) or (False, error); only the first one put is read
_Answers = queue.SimpleQueue[tuple[bool, Any]]
# the blocking call the running coroutine answers, set in the context of its task
_caller: contextvars.ContextVar[_Answers | None] = contextvars.ContextVar(
    "sasflow_blocking_caller", default=None)
# the answer to give the caller once the work at hand is durable
_early: contextvars.ContextVar[Callable[[], None] | None] = contextvars.ContextVar(
    "sasflow_early_answer", default=None)


def refuse_inside_a_loop() -> None:
    """A blocking call made from a coroutine would stall its event loop: say so."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return
    raise RuntimeError("inside an event loop: use the async twin (await app.a...)")


def answer_early(result: Any) -> None:
    """The running coroutine will return `result` once the next write it awaits is
    durable: whoever makes it so may give the blocking caller that answer at once,
    with `take_early_answer`. Only if the blocking call was made for this very
    coroutine, saying so (`call(..., early=True)`): a coroutine that awaits it among
    other work returns something else. Otherwise nothing happens."""
    answers = _caller.get()
    if answers is not None:
        _early.set(lambda: answers.put((True, result)))


def take_early_answer() -> Callable[[], None] | None:
    """The early answer the running coroutine promised (`answer_early`), taken so
    that it is given at most once; call it, from any thread, once the write is
    durable. None if there is none."""
    give = _early.get()
    if give is not None:
        _early.set(None)
    return give


class BackgroundLoop:
    """An event loop started on first use, in a daemon thread, until `close`."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = event_loops.new_event_loop()  # uvloop's where installed
                ready = threading.Event()

                def serve() -> None:
                    asyncio.set_event_loop(loop)
                    loop.call_soon(ready.set)
                    loop.run_forever()

                self._thread = threading.Thread(target=serve, name="sasflow-loop",
                                                daemon=True)
                self._thread.start()
                ready.wait()
                self._loop = loop
            return self._loop

    @property
    def started(self) -> asyncio.AbstractEventLoop | None:
        """The loop, if it runs (without starting one)."""
        with self._lock:
            return self._loop

    def call(self, coro: Coroutine[Any, Any, T], *, early: bool = False) -> T:
        """Run `coro` on the background loop and wait for its result (sync callers only);
        `early`: `coro` may give its result before it ends (`answer_early`)."""
        try:
            refuse_inside_a_loop()
        except RuntimeError:
            coro.close()
            raise
        return self.run(coro, early=early)

    def run(self, coro: Coroutine[Any, Any, T], *, early: bool = False) -> T:
        """`call` for quick lifecycle steps, which may also come from another event loop."""
        # One callback and one queue rather than run_coroutine_threadsafe's two
        # chained futures: each of their hand-offs waited for a turn of a loop that
        # may be busy running the roles.
        answers: _Answers = queue.SimpleQueue()
        try:
            self.loop.call_soon_threadsafe(_start, coro, answers, early)
        except BaseException:
            coro.close()  # no loop (closed, or none could be made): it never ran
            raise
        ok, result = answers.get()
        if not ok:
            raise result
        return result  # type: ignore[no-any-return]

    def close(self) -> None:
        with self._lock:
            loop, thread, self._loop, self._thread = self._loop, self._thread, None, None
        if loop is not None and thread is not None:
            loop.call_soon_threadsafe(loop.stop)
            thread.join()
            loop.close()


def _start(coro: Coroutine[Any, Any, Any], answers: _Answers, early: bool) -> None:
    """On the loop: run `coro` as a task that answers `answers` when it ends (or,
    if `early`, when it says, see `answer_early`)."""
    context = contextvars.copy_context()
    context.run(_caller.set, answers if early else None)
    task = asyncio.get_running_loop().create_task(coro, context=context)
    task.add_done_callback(lambda done: answers.put(_outcome(done)))


def _outcome(task: asyncio.Task[Any]) -> tuple[bool, Any]:
    if task.cancelled():
        return False, concurrent.futures.CancelledError()
    error = task.exception()
    return (False, error) if error is not None else (True, task.result())
