"""In-process queues: the embedded default transport (no broker to run).

Queues live in this process only, so a request reaches an agent of the same
process; that is what the embedded mode wants (each worker process runs its own
scheduler and agents over the shared SQLite store). A handler that raises has
its message put back after a backoff, as a broker would redeliver it, until
the delivery policy gives up on it; it is then a dead letter (R3,
dead_letter.py). Dead letters must outlive the process that found them, so
they go to the box the application opens for them (its state store); a
transport used on its own keeps them in memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Coroutine
from typing import Any

from sasflow.transport.base import (
    DEFAULT_MAX_MESSAGE_BYTES,
    Handler,
    ImmediateHandler,
    refuse_oversized,
)
from sasflow.transport.dead_letter import (
    DEFAULT_POLICY,
    BoxOpener,
    DeadLetter,
    DeadLetterBox,
    DeliveryPolicy,
    ListBox,
    MalformedMessage,
    describe,
    letter_for,
    log_dead_letter,
)

__all__ = ["MemoryTransport"]

log = logging.getLogger("sasflow.transport.memory")


class _Message:
    """A body with what its failed deliveries so far tell."""

    __slots__ = ("body", "failures", "first_seen")

    def __init__(self, body: bytes) -> None:
        self.body = body
        self.failures = 0
        self.first_seen = 0.0


class MemoryTransport:
    shared = False

    def __init__(self, *, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
                 policy: DeliveryPolicy = DEFAULT_POLICY,
                 dead_letter_box: BoxOpener | None = None) -> None:
        self.max_message_bytes = max_message_bytes
        self.policy = policy
        self._queues: dict[str, asyncio.Queue[_Message]] = {}
        self._consumed: dict[str, int] = {}  # consumers running in this process, by queue
        self._open_box = dead_letter_box
        self._box: DeadLetterBox | None = None if dead_letter_box else ListBox()
        self.stranded = ListBox()  # dead letters the box could not take (the store was down)
        self._timers: set[asyncio.TimerHandle] = set()

    def _queue(self, name: str) -> asyncio.Queue[_Message]:
        q = self._queues.get(name)
        if q is None:
            q = self._queues[name] = asyncio.Queue()
        return q

    @property
    def box(self) -> DeadLetterBox:
        """Where this transport's dead letters are kept (opened on first use)."""
        if self._box is None:
            assert self._open_box is not None
            self._box = self._open_box()
        return self._box

    async def publish(self, queue: str, body: bytes) -> None:
        refuse_oversized(queue, body, self.max_message_bytes)
        self._queue(queue).put_nowait(_Message(body))

    def check_queue(self, queue: str) -> None:
        """Any name will do for an in-process queue."""

    async def keep_dead_letter(self, letter: DeadLetter) -> None:
        await self._keep(letter)

    async def consume(self, queue: str, handler: Handler, *, prefetch: int) -> None:
        q = self._queue(queue)
        running: set[asyncio.Task[None]] = set()
        self._consumed[queue] = self._consumed.get(queue, 0) + 1
        loop = asyncio.get_running_loop()

        def put_back_later(message: _Message) -> None:
            def put_back() -> None:
                self._timers.discard(timer)
                q.put_nowait(message)
            # the slot is free meanwhile: a failing message holds up no other
            timer = loop.call_later(self.policy.delay(message.failures), put_back)
            self._timers.add(timer)

        async def failed(message: _Message, error: Exception) -> None:
            message.failures += 1
            message.first_seen = message.first_seen or time.time()
            if isinstance(error, MalformedMessage) or self.policy.exhausted(message.failures):
                await self._dead_letter(queue, message, error)
            else:
                log.debug("handler for %s raised; delivering again", queue, exc_info=error)
                put_back_later(message)

        def start(work: Coroutine[Any, Any, None]) -> None:
            task = loop.create_task(work)
            running.add(task)
            task.add_done_callback(running.discard)

        # The consumer's handlers: each takes the next message once done with its
        # last, so at most `prefetch` run at once, and no task is made a message
        # (its creation, context, weak reference and done callback were 6% of the
        # in-process roles' samples, and a task alive while its step runs is walked
        # by every young collection; docs/benchmarks.md). There are as many as the
        # messages have needed at once, and one waiting for the next: when the last
        # waiting one takes a message, another starts (up to `prefetch`).
        limit, handlers, waiting = max(1, prefetch), 0, 0
        broken: asyncio.Future[None] = loop.create_future()

        def add_handler() -> None:
            nonlocal handlers
            handlers += 1
            task = loop.create_task(handle_in_turn())
            running.add(task)
            task.add_done_callback(handler_ended)

        def handler_ended(task: asyncio.Task[None]) -> None:
            running.discard(task)
            if not task.cancelled() and not broken.done():
                # (only what no handler catches, SystemExit and the like): the consumer
                # ends with it, rather than quietly run one handler short
                broken.set_exception(task.exception() or RuntimeError("a handler ended"))

        async def handle_in_turn() -> None:
            nonlocal waiting
            while True:
                waiting += 1
                message = await q.get()
                waiting -= 1
                if not waiting and handlers < limit:
                    add_handler()  # to wait for the next message
                try:
                    await handler(message.body)
                except asyncio.CancelledError:
                    q.put_nowait(message)  # not acked: redeliver, this delivery not counted
                    raise
                except Exception as error:
                    try:
                        await failed(message, error)
                    except Exception:  # its failure's handling failed: one message
                        # lost and said, not the consumer (one bad message stops nothing)
                        log.exception("could not handle the failure of a message on %s",
                                      queue)

        try:
            if isinstance(handler, ImmediateHandler):
                # done when it returns: run here, each message as it is read, no slot
                # and no task (only a failure's handling, which may wait, gets one)
                now = handler.now
                while True:
                    message = await q.get()
                    try:
                        now(message.body)
                    except Exception as error:
                        start(failed(message, error))
            else:
                add_handler()
                await broken  # until cancelled
        finally:
            self._consumed[queue] -= 1
            for task in list(running):
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.gather(*running, return_exceptions=True)

    async def _dead_letter(self, queue: str, message: _Message, error: Exception) -> None:
        letter = letter_for(queue, message.body, error, deliveries=message.failures,
                            first_seen=message.first_seen)
        await self._keep(letter)
        log_dead_letter(log, letter)

    async def _keep(self, letter: DeadLetter) -> None:
        try:
            await self.box.add_dead_letter(letter)
        except Exception as failure:
            # the store is down: kept here (and in the log) rather than retried hot
            log.warning("could not keep dead letter %s (%s); kept in this process only",
                        letter.id, describe(failure))
            await self.stranded.add_dead_letter(letter)

    async def dead_letters(self, *, limit: int = 100) -> list[DeadLetter]:
        return await self.box.dead_letters(limit=limit)

    async def dead_letter(self, letter_id: str) -> DeadLetter | None:
        return await self.box.dead_letter(letter_id)

    async def purge_dead_letters(self) -> int:
        return await self.box.purge_dead_letters()

    async def ping(self) -> None:
        """In-process queues are always there."""

    async def close(self) -> None:
        for timer in self._timers:
            timer.cancel()
        self._timers.clear()
        self._queues.clear()
