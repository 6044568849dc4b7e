"""RabbitMQ queues (extra ``rabbitmq``): requests and replies between processes and hosts.

Built on aio-pika: the maintained asyncio client for RabbitMQ, typed, with
robust connections (``connect_robust`` reconnects after a broker restart and
re-declares channels, queues and consumers), publisher confirms and manual
acks, the three things at-least-once delivery here rests on.

- Queues are durable and declared on first use, by publishers and consumers
  alike, so either side may start first.
- Messages are persistent and sent on a channel with publisher confirms:
  ``publish`` returns only once the broker has taken the message. They are
  ``mandatory``, so a message to a queue that vanished is not dropped silently:
  the queue is declared again and the message resent.
- Publishes to sasflow's own queues (requests, replies) that wait together go
  as one bundle (amqp_bundle.py): one message, one confirm, one delivery, one
  ack for many, which is what lets a scheduler and its agents exchange
  thousands of messages a second. An application's status queue gets plain
  messages, one per status.
- Each ``consume`` has its own channel with ``basic.qos(prefetch)`` and runs at
  most ``prefetch`` handlers at once. It acks a message (or a bundle) once every
  handler returned, and nacks it with requeue when a plain message's handler
  raises; a bundle is acked after its failed messages were published again on
  their own, so they come back without their neighbours. A consumer that stops,
  or a process that dies, leaves its unacked messages (whole bundles) to the
  broker, which redelivers them to another consumer.

URL: ``amqp://user:password@host:5672/vhost``, with aio-pika's query options
(``heartbeat``, ``reconnect_interval``: 1 s here unless given) and one of ours,
``queue_expires=SECONDS``: the broker deletes queues unused for that long
(x-expires), for short-lived reply queues and test runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import aio_pika
import aiormq
import msgspec
from aio_pika.abc import (
    AbstractChannel,
    AbstractIncomingMessage,
    AbstractQueue,
    AbstractRobustConnection,
)
from pamqp.common import FieldTable

from sasflow.errors import ConfigurationError, TransportError
from sasflow.redact import redact
from sasflow.transport.amqp_bundle import BUNDLE_TYPE, Bundler, decode_bundle
from sasflow.transport.base import DEFAULT_MAX_MESSAGE_BYTES, Handler, carries_bundles

__all__ = ["AmqpTransport"]

log = logging.getLogger("sasflow.transport.amqp")

# How long publish keeps trying while the connection is being restored.
_PUBLISH_PATIENCE = 15.0
# Seconds between reconnection attempts, unless the URL sets reconnect_interval.
_RECONNECT_INTERVAL = 1.0
# Bounds the clean-up of a stopping consumer, so a dead broker cannot hang a shutdown.
_STOP_TIMEOUT = 5.0

# What a lost connection or channel raises; publish waits for the reconnect and retries.
_CONNECTION_ERRORS = (aiormq.exceptions.AMQPConnectionError,
                      aiormq.exceptions.ChannelInvalidStateError,
                      aiormq.exceptions.ChannelClosed, ConnectionError)


class AmqpTransport:
    """The RabbitMQ transport; connects on first use (``open_transport`` is not async)."""

    shared = True

    def __init__(self, url: str, *, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> None:
        self.url, self._arguments = _split_url(url)
        self.max_message_bytes = max_message_bytes
        self._opening: asyncio.Task[tuple[AbstractRobustConnection, AbstractChannel]] | None
        self._opening = None
        self._declared: set[str] = set()  # queues the publishing channel has declared
        self._consumed: dict[str, int] = {}
        self._bundler = Bundler(self._send, max_bytes=max_message_bytes)
        self._closed = False

    async def _connect(self) -> tuple[AbstractRobustConnection, AbstractChannel]:
        """The connection and its publishing channel, opened once for every caller."""
        if self._closed:
            raise TransportError("the RabbitMQ transport is closed")
        if self._opening is None:
            self._opening = asyncio.create_task(self._open())
            self._opening.add_done_callback(_retrieve)
        opening = self._opening
        try:
            # shielded: a caller cancelled mid-connect must not cancel the connection
            # attempt, which aio-pika would then keep retrying in the background
            return await asyncio.shield(opening)
        except TransportError:
            if self._opening is opening:
                self._opening = None  # the next caller tries again
            raise

    async def _open(self) -> tuple[AbstractRobustConnection, AbstractChannel]:
        try:
            connection = await aio_pika.connect_robust(self.url)
            publisher = await connection.channel(publisher_confirms=True, on_return_raises=True)
        except (aiormq.exceptions.AMQPError, OSError) as error:
            raise TransportError(
                f"cannot connect to RabbitMQ at {redact(self.url)}: {error}") from error
        return connection, publisher

    async def ping(self) -> None:
        await self._connect()

    async def _declare(self, channel: AbstractChannel, queue: str) -> AbstractQueue:
        return await channel.declare_queue(queue, durable=True, arguments=self._arguments)

    async def publish(self, queue: str, body: bytes) -> None:
        if len(body) > self.max_message_bytes:
            raise TransportError(
                f"message of {len(body)} bytes to {queue} is over the limit of"
                f" {self.max_message_bytes} bytes")
        if carries_bundles(queue):
            await self._bundler.publish(queue, body)
        else:
            await self._send(queue, body, False)

    async def _send(self, queue: str, body: bytes, bundle: bool) -> None:
        """One AMQP message, returning once the broker confirmed it."""
        message = aio_pika.Message(body, delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                                   content_type=BUNDLE_TYPE if bundle else None)
        give_up = time.monotonic() + _PUBLISH_PATIENCE
        pause = 0.05
        redeclared = False
        while True:
            _, channel = await self._connect()
            try:
                if queue not in self._declared:
                    await self._declare(channel, queue)
                    self._declared.add(queue)
                # returns once the broker confirmed (publisher confirms)
                await channel.default_exchange.publish(message, routing_key=queue,
                                                       mandatory=True)
                return
            except aiormq.exceptions.PublishError:
                # returned unroutable: the queue was deleted since we declared it
                if redeclared:
                    raise TransportError(f"RabbitMQ cannot route a message to {queue}") from None
                self._declared.discard(queue)
                redeclared = True
            except aiormq.exceptions.DeliveryError as error:
                raise TransportError(f"RabbitMQ refused a message to {queue}: {error}") from error
            except _CONNECTION_ERRORS as error:
                if self._closed or time.monotonic() + pause > give_up:
                    raise TransportError(
                        f"cannot publish to {queue}: RabbitMQ unreachable ({error!r})"
                    ) from error
                # a robust connection is reconnecting: wait and send again (at least once)
                log.info("publish to %s failed (%r); retrying", queue, error)
                await asyncio.sleep(pause)
                pause = min(pause * 2, 1.0)

    async def consume(self, queue: str, handler: Handler, *, prefetch: int) -> None:
        # counted from the start, so has_consumer is true as soon as consuming begins
        self._consumed[queue] = self._consumed.get(queue, 0) + 1
        running: set[asyncio.Task[object]] = set()
        # bundles hold several messages each: `prefetch` bounds the handlers running
        slots = asyncio.Semaphore(max(1, prefetch))
        channel: AbstractChannel | None = None
        try:
            connection, _ = await self._connect()
            channel = await connection.channel(publisher_confirms=False)
            await channel.set_qos(prefetch_count=max(1, prefetch))
            declared = await self._declare(channel, queue)

            async def handle(body: bytes) -> bool:
                async with slots:
                    try:
                        await handler(body)
                    except Exception:
                        log.warning("handler for %s failed; the message will be redelivered",
                                    queue, exc_info=True)
                        return False
                    return True

            async def on_message(message: AbstractIncomingMessage) -> None:
                task = asyncio.current_task()
                assert task is not None
                running.add(task)
                try:
                    if message.content_type != BUNDLE_TYPE:
                        handled = await handle(message.body)
                    else:
                        handled = await self._handle_bundle(queue, message.body, handle)
                    if handled:
                        await message.ack()
                    else:
                        await message.nack(requeue=True)
                except _CONNECTION_ERRORS as error:
                    # the channel is gone: the broker redelivers the unacked message
                    log.info("could not settle a message of %s: %r", queue, error)
                finally:
                    running.discard(task)

            tag = await declared.consume(on_message, no_ack=False)
            try:
                await asyncio.Future()  # consume until cancelled
            finally:
                with contextlib.suppress(Exception):
                    async with asyncio.timeout(_STOP_TIMEOUT):
                        await declared.cancel(tag)
        except (aiormq.exceptions.AMQPError, *_CONNECTION_ERRORS) as error:
            raise TransportError(f"cannot consume {queue}: {error!r}") from error
        finally:
            self._consumed[queue] -= 1
            for task in list(running):
                task.cancel()
            if running:
                await asyncio.gather(*running, return_exceptions=True)
            if channel is not None:
                # unacked messages (in flight or prefetched) go back to the queue
                with contextlib.suppress(Exception):
                    async with asyncio.timeout(_STOP_TIMEOUT):
                        await channel.close()

    async def _handle_bundle(self, queue: str, payload: bytes,
                             handle: Callable[[bytes], Awaitable[bool]]) -> bool:
        """Handle each message of a bundle; True once all are handled or sent again."""
        try:
            bodies = decode_bundle(payload)
        except msgspec.DecodeError as error:  # redelivering it would not help
            log.error("dropping a malformed bundle from %s: %s", queue, error)
            return True
        handled = await asyncio.gather(*(handle(body) for body in bodies))
        failed = [body for body, ok in zip(bodies, handled, strict=True) if not ok]
        if not failed:
            return True
        # only the messages whose handler raised come again, not their neighbours
        try:
            await asyncio.gather(*(self.publish(queue, body) for body in failed))
        except TransportError:
            return False  # the whole bundle comes again
        return True

    def has_consumer(self, queue: str) -> bool:
        return self._consumed.get(queue, 0) > 0

    async def close(self) -> None:
        self._closed = True
        await self._bundler.close()
        opening, self._opening = self._opening, None
        if opening is None:
            return
        with contextlib.suppress(Exception):
            connection, _ = await asyncio.shield(opening)
            await connection.close()


def _retrieve(task: asyncio.Task[tuple[AbstractRobustConnection, AbstractChannel]]) -> None:
    """Mark a failed connection attempt's error as seen: its callers got it already."""
    if not task.cancelled():
        task.exception()


def _split_url(url: str) -> tuple[str, FieldTable]:
    """The URL for aio-pika, and the queue arguments our own query parameters ask for."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    arguments: FieldTable = {}
    rest = []
    for key, value in query:
        if key == "queue_expires":
            try:
                arguments["x-expires"] = int(float(value) * 1000)
            except ValueError:
                raise ConfigurationError(
                    f"queue_expires must be a number of seconds, got {value!r}") from None
        else:
            rest.append((key, value))
    if not any(key == "reconnect_interval" for key, _ in rest):
        # aio-pika waits 5 s between attempts; a restarted broker is back sooner than that
        rest.append(("reconnect_interval", str(_RECONNECT_INTERVAL)))
    return urlunsplit(parts._replace(query=urlencode(rest))), arguments

