"""A simulated broker: named queues with acks, and seeded message faults (SPEC R6).

It behaves as a broker does towards the processes of a simulation (each runs
under its own gate, sasflow.testing.gate):

- a message is handed to one consumer at a time and acked when its handler
  returns; a handler that raises gets it again after the delivery policy's
  backoff, until the policy gives up on it: it is then a dead letter (R3), as
  on the in-process transport (a malformed message at once);
- when an instance crashes, the messages its consumers held unacked go back
  to their queues (the broker saw the connection drop); when one is paused
  longer than `unacked_timeout`, the same happens (its heartbeat timed out),
  and its late acks are then void;
- a crashed or paused instance publishes nothing and takes nothing.

A `fault(queue)` hook may decide, per published message, to drop it, to
duplicate it, to delay it, or to put it at the head of its queue (reordered);
with no hook it is a plain in-order queue, and it passes the transport
contract suite as such.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from sasflow.testing.gate import Gate, current_gate
from sasflow.transport.base import DEFAULT_MAX_MESSAGE_BYTES, Handler, refuse_oversized
from sasflow.transport.dead_letter import (
    DEFAULT_POLICY,
    DeadLetter,
    DeliveryPolicy,
    ListBox,
    MalformedMessage,
    letter_for,
    log_dead_letter,
)

__all__ = ["Delivery", "SimTransport"]

log = logging.getLogger("sasflow.testing.transport")


@dataclass(frozen=True, slots=True)
class Delivery:
    """What the fault hook decides for one message: when each copy arrives."""

    delays: tuple[float, ...] = (0.0,)  # () drops it; two entries duplicate it
    to_front: bool = False  # overtakes what is queued already


_PLAIN = Delivery()


@dataclass(slots=True)
class _Message:
    id: int
    body: bytes
    failures: int = 0  # failed deliveries so far
    first_seen: float = 0.0


@dataclass(slots=True)
class _Queue:
    messages: collections.deque[_Message] = field(default_factory=collections.deque)
    waiters: collections.deque[asyncio.Future[None]] = field(default_factory=collections.deque)
    consumers: int = 0

    def put(self, message: _Message, *, front: bool = False) -> None:
        if front:
            self.messages.appendleft(message)
        else:
            self.messages.append(message)
        while self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                break

    async def get(self) -> _Message:
        while not self.messages:
            waiter = asyncio.get_running_loop().create_future()
            self.waiters.append(waiter)
            try:
                await waiter
            except asyncio.CancelledError:
                # a wake-up meant for us goes to the next waiter
                if waiter.done() and not waiter.cancelled() and self.messages:
                    self._wake_next()
                raise
        return self.messages.popleft()

    def _wake_next(self) -> None:
        while self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return


def _handled(task: asyncio.Task[None]) -> None:
    """A handler that ended by its instance's end (Halted) has nothing to report."""
    if not task.cancelled():
        task.exception()


class SimTransport:
    """In-process queues that act like a broker towards simulated instances."""

    shared = False  # status messages are read from the store's outbox, not relayed

    def __init__(self, *, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
                 fault: Callable[[str], Delivery] | None = None,
                 unacked_timeout: float = 30.0,
                 policy: DeliveryPolicy = DEFAULT_POLICY) -> None:
        self.max_message_bytes = max_message_bytes
        self.fault = fault
        self.policy = policy
        self.box = ListBox()  # the dead letters
        self.unacked_timeout = unacked_timeout
        self._queues: dict[str, _Queue] = {}
        self._ids = itertools.count(1)
        # per gate (None: outside any instance), the messages its consumers hold unacked
        self._unacked: dict[Gate | None, dict[int, tuple[str, _Message]]] = {}
        self.published = 0
        self.delivered = 0

    def _queue(self, name: str) -> _Queue:
        queue = self._queues.get(name)
        if queue is None:
            queue = self._queues[name] = _Queue()
        return queue

    async def publish(self, queue: str, body: bytes) -> None:
        refuse_oversized(queue, body, self.max_message_bytes)
        gate = current_gate.get()
        if gate is not None:
            await gate.passage("transport.publish")
        self.published += 1
        delivery = self.fault(queue) if self.fault is not None else _PLAIN
        target = self._queue(queue)
        loop = asyncio.get_running_loop()
        for delay in delivery.delays:
            message = _Message(next(self._ids), body)  # each copy acked on its own
            if delay <= 0:
                target.put(message, front=delivery.to_front)
            else:
                loop.call_later(delay, target.put, message)
        if gate is not None:
            await gate.passage("transport.publish.answer")

    async def consume(self, queue: str, handler: Handler, *, prefetch: int) -> None:
        gate = current_gate.get()
        source = self._queue(queue)
        slots = asyncio.Semaphore(max(1, prefetch))
        running: set[asyncio.Task[None]] = set()
        unacked = self._unacked.setdefault(gate, {})
        if gate is not None:
            gate.on_crash.append(lambda: self._give_back(gate))
            gate.on_pause.append(lambda: self._give_back_if_still_paused(gate))
        source.consumers += 1

        async def handle(message: _Message) -> None:
            try:
                await handler(message.body)
            except asyncio.CancelledError:
                self._nack(gate, queue, message)
                raise
            except Exception as error:
                if self._unacked.get(gate, {}).pop(message.id, None) is None:
                    return  # given back already (its consumer's process died meanwhile)
                message.failures += 1
                message.first_seen = message.first_seen or time.time()
                if isinstance(error, MalformedMessage) or self.policy.exhausted(
                        message.failures):
                    letter = letter_for(queue, message.body, error,
                                        deliveries=message.failures,
                                        first_seen=message.first_seen)
                    await self.box.add_dead_letter(letter)
                    log_dead_letter(log, letter)
                else:  # again after the backoff; the slot is free meanwhile
                    asyncio.get_running_loop().call_later(
                        self.policy.delay(message.failures), source.put, message)
            else:
                unacked.pop(message.id, None)  # acked (void if it was given back already)
            finally:
                slots.release()

        try:
            while True:
                await slots.acquire()
                message = await source.get()
                if gate is not None and (gate.crashed or gate.paused):
                    source.put(message, front=True)  # taken by a stopped process: not taken
                    await gate.check()
                    continue
                self.delivered += 1
                unacked[message.id] = (queue, message)
                task = asyncio.ensure_future(handle(message))
                running.add(task)
                task.add_done_callback(_handled)
                task.add_done_callback(running.discard)
        finally:
            source.consumers -= 1
            for task in list(running):
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.gather(*running, return_exceptions=True)

    def _nack(self, gate: Gate | None, queue: str, message: _Message) -> None:
        if self._unacked.get(gate, {}).pop(message.id, None) is not None:
            self._queue(queue).put(message, front=True)

    def _give_back(self, gate: Gate) -> None:
        """The broker lost the instance's connection: its unacked messages go back."""
        held = self._unacked.get(gate, {})
        for queue, message in sorted(held.values(), key=lambda item: item[1].id):
            self._queue(queue).put(message)
        held.clear()

    def _give_back_if_still_paused(self, gate: Gate) -> None:
        def check() -> None:
            if gate.paused:
                self._give_back(gate)

        asyncio.get_running_loop().call_later(self.unacked_timeout, check)

    def check_queue(self, queue: str) -> None:
        """Any name will do, as for the in-process queues it stands in for."""

    async def keep_dead_letter(self, letter: DeadLetter) -> None:
        await self.box.add_dead_letter(letter)

    async def dead_letters(self, *, limit: int = 100) -> list[DeadLetter]:
        return await self.box.dead_letters(limit=limit)

    async def dead_letter(self, letter_id: str) -> DeadLetter | None:
        return await self.box.dead_letter(letter_id)

    async def purge_dead_letters(self) -> int:
        return await self.box.purge_dead_letters()

    async def ping(self) -> None:
        """Always reachable."""

    async def close(self) -> None:
        self._queues.clear()
