"""The RabbitMQ transport's consumers: one channel each, acks once handled.

Each ``consume`` has its own channel with ``basic.qos(prefetch)`` and runs at
most ``prefetch`` handlers at once, whatever the bundles (amqp_bundle.py) hold.
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
import contextlib
import itertools
import logging
import time
from typing import TYPE_CHECKING

import aiormq
import aiormq.abc
import msgspec
from aio_pika.abc import AbstractRobustChannel
from aiormq.abc import DeliveredMessage

from sasflow.errors import TransportError
from sasflow.transport.amqp_bundle import BUNDLE_TYPE, decode_bundle
from sasflow.transport.amqp_connection import (
    CONNECTION_ERRORS,
    REFUSALS,
    STOP_TIMEOUT,
    backoff,
    being_cancelled,
    close_quietly,
)
from sasflow.transport.amqp_dead_letters import (
    DELIVERIES,
    FIRST_SEEN,
    number,
)
from sasflow.transport.base import Handler, ImmediateHandler
from sasflow.transport.dead_letter import MalformedMessage, letter_for, log_dead_letter

if TYPE_CHECKING:
    from sasflow.transport.amqp import AmqpTransport

__all__ = ["AmqpConsumer"]

log = logging.getLogger("sasflow.transport.amqp")


class AmqpConsumer:
    """One ``consume`` of a queue: its channel, its running handlers, and how each
    message is settled. Publishes through its transport (a failed message sent
    again, or to the dead letters)."""

    def __init__(self, transport: AmqpTransport, queue: str, handler: Handler, *,
                 prefetch: int, consumed: dict[str, int]) -> None:
        self.transport, self.queue, self.handler = transport, queue, handler
        self.prefetch = max(1, prefetch)
        self.consumed = consumed  # consumers running in this process, by queue
        self.running: set[asyncio.Task[object]] = set()
        # messages handled, being settled (dead-lettered, sent again, acked): finished
        # even if the consumer stops meanwhile (`_settle`)
        self.settling: set[asyncio.Future[None]] = set()
        # bundles hold several messages each: `prefetch` bounds the handlers running
        self.slots = asyncio.Semaphore(self.prefetch)
        self.channel: AbstractRobustChannel | None = None

    async def run(self) -> None:
        """Consume until cancelled. After a lost connection or channel, or a consumer
        the broker cancelled (its queue deleted), it consumes again (R2)."""
        queue = self.queue
        # counted from the start: a consumer counts as soon as consuming begins
        self.consumed[queue] = self.consumed.get(queue, 0) + 1
        try:
            while True:
                underlay, tag, ended = await self._set_up()
                try:
                    await ended  # the channel closed, or the broker cancelled the consumer
                finally:
                    if not ended.done():  # stopped: take the consumer off, if still there
                        with contextlib.suppress(Exception):
                            async with asyncio.timeout(STOP_TIMEOUT):
                                await underlay.basic_cancel(tag)
                log.info("the consumer of %s ended (its channel closed, or the broker"
                         " cancelled it); consuming again", queue)
        except (aiormq.exceptions.AMQPError, *CONNECTION_ERRORS) as error:
            raise TransportError(f"cannot consume {queue}: {error!r}") from error
        finally:
            self.consumed[queue] -= 1
            for task in list(self.running):
                task.cancel()
            if self.running:
                await asyncio.gather(*self.running, return_exceptions=True)
            if self.settling:  # on this channel, which must stay open for their acks
                _, late = await asyncio.wait(self.settling, timeout=STOP_TIMEOUT)
                for settle in late:  # (a redelivery's backoff): the broker takes it back
                    settle.cancel()
            # unacked messages (in flight or prefetched) go back to the queue
            await self._drop_channel()

    async def _set_up(self) -> tuple[aiormq.abc.AbstractChannel, str, asyncio.Future[None]]:
        """The consumer on a channel of its own with its prefetch, the queue declared;
        with the future that ends when the consumer or its channel goes. Tried until it
        works (R2), but for a queue the broker refuses as declared: no retry helps.

        The consumer is aiormq's own, under aio-pika's channel: aio-pika's wraps each
        delivery in a message object and a second task, a seventh of a delivery's CPU
        (153-163 µs a delivery against 132-139, bench/amqp_consume_cost.py).
        aio-pika restores a robust channel after a lost connection (its prefetch,
        its queue), but knows nothing of this consumer: this loop waits for the
        channel to be back and consumes on it again."""
        for attempt in itertools.count(1):
            try:
                if self.channel is None:
                    connection, _ = await self.transport._link.connect()
                    self.channel = await connection.channel(publisher_confirms=False)
                    await self.channel.set_qos(prefetch_count=self.prefetch)
                else:
                    await self.channel.ready()  # (restored: at once if it never went)
                # declared again each time: a queue deleted under its consumer comes back
                await self.transport._declare(self.channel, self.queue)
                underlay = await self.channel.get_underlay_channel()
                ended = _ended_when(underlay)
                consuming = await underlay.basic_consume(self.queue, self._on_message,
                                                         no_ack=False)
                assert consuming.consumer_tag is not None
                return underlay, consuming.consumer_tag, ended
            except REFUSALS:
                raise  # the broker refuses this queue as declared: no retry helps
            except (*CONNECTION_ERRORS, TimeoutError, asyncio.CancelledError) as error:
                if isinstance(error, asyncio.CancelledError) and being_cancelled():
                    raise
                # the connection went while the consumer was being set up (aiormq
                # cancels what waited on it): it is reconnecting, so set up again (R2)
                if self.channel is not None and self.channel.is_closed:
                    await self._drop_channel()  # closed for good: a new one
                self.transport._link.outage.failed(error)
                await asyncio.sleep(backoff(attempt))
        raise AssertionError("unreachable")

    async def _drop_channel(self) -> None:
        if self.channel is not None:
            channel, self.channel = self.channel, None
            await close_quietly(channel)

    async def _handle(self, body: bytes) -> Exception | None:
        """The handler's error, if it raised (bounded by the slots)."""
        if isinstance(self.handler, ImmediateHandler):
            return self._handle_now(self.handler, body)
        async with self.slots:
            try:
                await self.handler(body)
            except Exception as error:
                log.debug("handler for %s raised", self.queue, exc_info=True)
                return error
            return None

    async def _on_message(self, message: DeliveredMessage) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.running.add(task)
        try:
            # failed deliveries before this one; a redelivery by the broker
            # means a consumer died holding it: one more
            properties = message.header.properties
            headers = properties.headers or {}
            before = int(number(headers.get(DELIVERIES))) + bool(message.redelivered)
            first_seen = float(number(headers.get(FIRST_SEEN)))
            if properties.content_type != BUNDLE_TYPE:
                failed = [(message.body, await self._handle(message.body))]
            else:
                failed = await self._handle_bundle(message.body)
        finally:
            self.running.discard(task)
        failures = [(body, error) for body, error in failed if error is not None]
        if not failures:
            if isinstance(self.handler, ImmediateHandler):
                # what the handler set going (a scheduler's driver, woken by its reply,
                # writing the step's transition) takes its turn of the loop before the
                # ack's frame takes the socket: the ack waits, the task's path does not
                await asyncio.sleep(0)
            await self._settle(message, failures, before, first_seen)  # the ack alone
            return
        # A failure is settled whatever comes. A consumer stopped while a dead letter
        # was on its way lost the letter's log line and acked nothing (so the message
        # came back, to be dead-lettered twice); it now waits for what it settles.
        settle = asyncio.ensure_future(self._settle(message, failures, before, first_seen))
        self.settling.add(settle)
        settle.add_done_callback(self.settling.discard)
        await asyncio.shield(settle)

    async def _settle(self, message: DeliveredMessage,
                      failures: list[tuple[bytes, Exception]], before: int,
                      first_seen: float) -> None:
        try:
            settled = await asyncio.gather(*(
                self._after_failure(body, before + 1, first_seen, error)
                for body, error in failures)) if failures else []
            # on the channel that delivered it: a delivery tag means nothing on another
            tag = message.delivery_tag
            assert tag is not None
            if all(settled):
                await message.channel.basic_ack(tag)
            else:  # could not be sent again: the broker keeps the whole message
                await message.channel.basic_nack(tag, requeue=True)
        except CONNECTION_ERRORS as error:
            # the channel is gone: the broker redelivers the unacked message
            log.info("could not settle a message of %s: %r", self.queue, error)

    async def _handle_bundle(self, payload: bytes) -> list[tuple[bytes, Exception | None]]:
        """Handle each message of a bundle; each body with its handler's error, if any."""
        try:
            bodies = decode_bundle(payload)
        except msgspec.DecodeError as error:  # the bundle itself is the dead letter
            return [(payload, MalformedMessage(f"not a bundle: {error}"))]
        if isinstance(self.handler, ImmediateHandler):  # one by one, with no task each
            handler = self.handler
            return [(body, self._handle_now(handler, body)) for body in bodies]
        errors = await asyncio.gather(*(self._handle(body) for body in bodies))
        return list(zip(bodies, errors, strict=True))

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


def _ended_when(channel: aiormq.abc.AbstractChannel) -> asyncio.Future[None]:
    """A future that ends when `channel` (aiormq's) closes, or when the broker cancels a
    consumer on it (its queue was deleted): either way, nothing more comes."""
    ended: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    closing = channel.closing  # an observer of its own: cancelled, it only stops observing

    def end(*_: object) -> None:
        if not ended.done():
            ended.set_result(None)

    def forget(_: asyncio.Future[None]) -> None:
        # a consumer set up again on the same channel watches it anew: nothing piles up
        channel.on_consumer_cancel_callbacks.discard(end)
        closing.cancel()

    closing.add_done_callback(end)
    channel.on_consumer_cancel_callbacks.add(end)
    ended.add_done_callback(forget)
    return ended
