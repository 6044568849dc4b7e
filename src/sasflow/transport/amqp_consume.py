"""The RabbitMQ transport's consumers: one connection each, acks once handled.

Each ``consume`` has a connection of its own (amqp_wire_consume.py) with
``basic.qos(prefetch)`` and runs at most ``prefetch`` handlers at once, whatever
the bundles (amqp_bundle.py) hold. An immediate handler (a scheduler's replies)
runs as its message is read, with no task; any other in a task of its own.
It acks a message (or a bundle) once every handler returned. A consumer that
stops, or a process that dies, leaves its unacked messages (whole bundles) to
the broker, which redelivers them to another consumer.

A message whose handler raised is never requeued at once (a requeued message
comes straight back: the hot loop of R3). After the delivery policy's backoff
it is published again on its own, carrying its count of failed deliveries, and
only then acked; at the policy's bound, or at once for a body its handler
cannot decode, it goes to the dead letters instead (amqp_dead_letters.py). A
message the broker redelivers (its consumer died holding it) counts one
delivery more.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from typing import TYPE_CHECKING

import msgspec
from pamqp.commands import Basic

from sasflow.errors import TransportError
from sasflow.transport.amqp_bundle import BUNDLE_TYPE, decode_bundle
from sasflow.transport.amqp_connection import CONNECT_TIMEOUT, STOP_TIMEOUT, backoff
from sasflow.transport.amqp_dead_letters import (
    DELIVERIES,
    FIRST_SEEN,
    number,
)
from sasflow.transport.amqp_wire import ChannelRefused, open_wire
from sasflow.transport.amqp_wire_consume import ConsumingWire
from sasflow.transport.base import Handler, ImmediateHandler
from sasflow.transport.dead_letter import MalformedMessage, letter_for, log_dead_letter

if TYPE_CHECKING:
    from sasflow.transport.amqp import AmqpTransport

__all__ = ["AmqpConsumer"]

log = logging.getLogger("sasflow.transport.amqp")

# A failed message: its body and its handler's error.
Failure = tuple[bytes, Exception]


class AmqpConsumer:
    """One ``consume`` of a queue: its connection, its running handlers, and how each
    message is settled. Publishes through its transport (a failed message sent
    again, or to the dead letters)."""

    def __init__(self, transport: AmqpTransport, queue: str, handler: Handler, *,
                 prefetch: int, consumed: dict[str, int]) -> None:
        self.transport, self.queue, self.handler = transport, queue, handler
        self.immediate = handler if isinstance(handler, ImmediateHandler) else None
        self.prefetch = max(1, prefetch)
        self.consumed = consumed  # consumers running in this process, by queue
        self.running: set[asyncio.Task[None]] = set()
        # messages handled, being settled (dead-lettered, sent again, acked): finished
        # even if the consumer stops meanwhile (`_settle`)
        self.settling: set[asyncio.Future[None]] = set()
        # bundles hold several messages each: `prefetch` bounds the handlers running
        self.slots = asyncio.Semaphore(self.prefetch)

    async def run(self) -> None:
        """Consume until cancelled. After a lost connection, or a consumer the broker
        cancelled (its queue deleted), it consumes again (R2)."""
        queue, outage = self.queue, self.transport.outage
        # counted from the start: a consumer counts as soon as consuming begins
        self.consumed[queue] = self.consumed.get(queue, 0) + 1
        wire: ConsumingWire | None = None
        try:
            while True:
                wire = await self._set_up()
                await asyncio.shield(wire.ended)  # lost, or the broker cancelled the consumer
                log.info("the consumer of %s ended (%s); consuming again", queue, wire.lost)
        except ChannelRefused as error:
            raise TransportError(f"cannot consume {queue}: RabbitMQ refuses it: {error}"
                                 ) from error
        finally:
            self.consumed[queue] -= 1
            outage.left(self)
            if wire is not None:
                wire.stop()
            for task in list(self.running):
                task.cancel()
            if self.running:
                await asyncio.gather(*self.running, return_exceptions=True)
            if self.settling:  # on this connection, which must stay open for their acks
                _, late = await asyncio.wait(self.settling, timeout=STOP_TIMEOUT)
                for settle in late:  # (a redelivery's backoff): the broker takes it back
                    settle.cancel()
            if wire is not None:  # unacked messages (in flight or prefetched) go back
                await wire.close()

    async def _set_up(self) -> ConsumingWire:
        """The consumer on a connection of its own, with its prefetch, the queue
        declared. Tried until it works (R2), but for a queue the broker refuses as
        declared: no retry helps."""
        transport, outage = self.transport, self.transport.outage
        for attempt in itertools.count(1):
            try:
                wire = await open_wire(transport.address,
                                       lambda: ConsumingWire(transport.address, self._delivered),
                                       within=CONNECT_TIMEOUT)
                try:
                    await wire.consume(self.queue, arguments=transport.queue_arguments,
                                       prefetch=self.prefetch)
                except BaseException:
                    wire.abort()
                    raise
            except ConnectionError as error:
                outage.failed(error, by=self)
                await asyncio.sleep(backoff(attempt))
                continue
            outage.recovered(by=self)
            return wire
        raise AssertionError("unreachable")

    def _delivered(self, wire: ConsumingWire, tag: int, redelivered: bool,
                   properties: Basic.Properties, body: bytes) -> None:
        """A delivery, whole: an immediate handler's at once, any other's in a task."""
        if self.immediate is None:
            task = asyncio.ensure_future(
                self._handle_delivery(wire, tag, redelivered, properties, body))
            self.running.add(task)
            task.add_done_callback(self.running.discard)
            return
        if properties.content_type != BUNDLE_TYPE:
            error = self._handle_now(self.immediate, body)
            failures = [] if error is None else [(body, error)]
        else:
            failures = [(each, error) for each, error in self._handle_bundle_now(body)
                        if error is not None]
        if not failures:
            # written at the loop's next turn: what the handler set going (a
            # scheduler's driver, woken by its reply, writing the step's transition)
            # takes this turn first, so the ack's write is not on the task's path
            wire.ack(tag)
            return
        self._settle_failures(wire, tag, redelivered, properties, failures)

    async def _handle_delivery(self, wire: ConsumingWire, tag: int, redelivered: bool,
                               properties: Basic.Properties, body: bytes) -> None:
        if properties.content_type != BUNDLE_TYPE:
            failed = [(body, await self._handle(body))]
        else:
            failed = await self._handle_bundle(body)
        failures = [(each, error) for each, error in failed if error is not None]
        if not failures:
            wire.ack(tag)
            return
        # A failure is settled whatever comes. A consumer stopped while a dead letter
        # was on its way lost the letter's log line and acked nothing (so the message
        # came back, to be dead-lettered twice); it now waits for what it settles.
        await asyncio.shield(self._settle_failures(wire, tag, redelivered, properties,
                                                   failures))

    def _settle_failures(self, wire: ConsumingWire, tag: int, redelivered: bool,
                         properties: Basic.Properties, failures: list[Failure]
                         ) -> asyncio.Future[None]:
        # failed deliveries before this one; a redelivery by the broker means a
        # consumer died holding it: one more
        headers = properties.headers or {}
        before = int(number(headers.get(DELIVERIES))) + bool(redelivered)
        first_seen = float(number(headers.get(FIRST_SEEN)))
        settle = asyncio.ensure_future(self._settle(wire, tag, failures, before, first_seen))
        self.settling.add(settle)
        settle.add_done_callback(self.settling.discard)
        return settle

    async def _settle(self, wire: ConsumingWire, tag: int, failures: list[Failure],
                      before: int, first_seen: float) -> None:
        settled = await asyncio.gather(*(
            self._after_failure(body, before + 1, first_seen, error)
            for body, error in failures))
        # on the connection that delivered it: a delivery tag means nothing on another
        if not (wire.ack(tag) if all(settled) else wire.nack(tag)):
            # the connection is gone: the broker delivers the unacked message again
            log.info("could not settle a message of %s: %s", self.queue, wire.lost)

    async def _handle(self, body: bytes) -> Exception | None:
        """The handler's error, if it raised (bounded by the slots)."""
        async with self.slots:
            try:
                await self.handler(body)
            except Exception as error:
                log.debug("handler for %s raised", self.queue, exc_info=True)
                return error
            return None

    async def _handle_bundle(self, payload: bytes) -> list[tuple[bytes, Exception | None]]:
        """Handle each message of a bundle; each body with its handler's error, if any."""
        bodies = _unbundled(payload)
        if isinstance(bodies, MalformedMessage):  # the bundle itself is the dead letter
            return [(payload, bodies)]
        errors = await asyncio.gather(*(self._handle(body) for body in bodies))
        return list(zip(bodies, errors, strict=True))

    def _handle_bundle_now(self, payload: bytes) -> list[tuple[bytes, Exception | None]]:
        """`_handle_bundle` for an immediate handler: one by one, with no task each."""
        assert self.immediate is not None
        bodies = _unbundled(payload)
        if isinstance(bodies, MalformedMessage):
            return [(payload, bodies)]
        return [(body, self._handle_now(self.immediate, body)) for body in bodies]

    def _handle_now(self, handler: ImmediateHandler, body: bytes) -> Exception | None:
        """The error of a handler that never waits, if it raised (it takes no slot)."""
        try:
            handler.now(body)
        except Exception as error:
            log.debug("handler for %s raised", self.queue, exc_info=True)
            return error
        return None

    async def _after_failure(self, body: bytes, deliveries: int, first_seen: float,
                             error: Exception) -> bool:
        """Send a message that failed its `deliveries`-th delivery again after the backoff,
        or to the dead letters (R3). True once it is safely on its way."""
        queue, policy = self.queue, self.transport.policy
        first_seen = first_seen or time.time()
        try:
            if isinstance(error, MalformedMessage) or policy.exhausted(deliveries):
                letter = letter_for(queue, body, error, deliveries=deliveries,
                                    first_seen=first_seen)
                await self.transport.keep_dead_letter(letter)
                log_dead_letter(log, letter)
            else:
                # held (unacked) meanwhile, so a crash now loses nothing
                await asyncio.sleep(policy.delay(deliveries))
                await self.transport._send(queue, body, False, {DELIVERIES: deliveries,
                                                                FIRST_SEEN: first_seen})
        except TransportError as failure:
            log.info("could not send a failed message of %s on: %s", queue, failure)
            # it comes straight back when nacked: the pause keeps that from spinning
            await asyncio.sleep(policy.delay(deliveries))
            return False
        return True


def _unbundled(payload: bytes) -> list[bytes] | MalformedMessage:
    """A bundle's messages, or why it is none."""
    try:
        return decode_bundle(payload)
    except msgspec.DecodeError as error:
        return MalformedMessage(f"not a bundle: {error}")
