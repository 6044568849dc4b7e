"""RabbitMQ queues (extra ``rabbitmq``): requests and replies between processes and hosts.

This module is the transport itself: its URL, its publishes, its operator's
verbs; its connection, its consumers and its dead letters have a module each
(amqp_connection.py, amqp_consume.py, amqp_dead_letters.py).

Built on aio-pika: the maintained asyncio client for RabbitMQ, typed, with
robust connections (``connect_robust`` reconnects after a broker restart and
re-declares channels and queues), publisher confirms and manual acks, the three
things at-least-once delivery here rests on. It declares the publisher's queues,
tells whether RabbitMQ is there at all, and carries the dead letters and the
operator's verbs. The messages of a task's path (requests, replies, statuses)
travel on connections of the transport's own instead (amqp_wire.py: pamqp's
frames over an `asyncio.Protocol`): one for the publisher
(amqp_wire_publish.py), one per consumer (amqp_wire_consume.py). Through aiormq,
a hop cost 2.3 times this layer's floor of CPU.

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
  most ``prefetch`` handlers at once (amqp_consume.py). It acks a message (or a
  bundle) once every handler returned. A consumer that stops, or a process that
  dies, leaves its unacked messages (whole bundles) to the broker, which
  redelivers them to another consumer.
- A message whose handler raised is never requeued at once (a requeued message
  comes straight back: the hot loop of R3). After the delivery policy's backoff
  it is published again on its own, carrying its count of failed deliveries in
  the ``x-sasflow-deliveries`` header, and only then acked; once that count
  reaches the policy's bound (or at once, for a body its handler cannot
  decode) it goes to the ``sasflow.dead-letters`` exchange instead, and on to
  the durable queue of that name bound to it (amqp_dead_letters.py;
  docs/architecture.md says why the count is ours rather than the broker's). A
  message the broker redelivers (its consumer died holding it) counts one
  delivery more.

- A consumer or a publish waits for RabbitMQ for as long as it takes (R2), the
  first connection included (amqp_connection.py): aio-pika retries every
  ``reconnect_interval``, each attempt bounded by ``CONNECT_TIMEOUT``, and its
  per-attempt log records go to the transport's Outage instead, which says it
  once, then every 30 s. A
  publish still gives up after its patience (its caller decides what next);
  ``ping`` and the dead-letter commands fail at the first refusal.

URL: ``amqp://user:password@host:5672/vhost``, with aio-pika's query options
(``heartbeat``, ``reconnect_interval``: 1 s here unless given) and ours:
``queue_expires=SECONDS``: the broker deletes queues unused for that long
(x-expires), for short-lived reply queues and test runs (never the dead-letter
queue); ``max_deliveries``, ``redelivery_backoff`` (dead_letter.py);
``dead_letters=NAME``: the dead-letter exchange and queue, default
``sasflow.dead-letters``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from urllib.parse import urlencode, urlsplit, urlunsplit

import aio_pika
import aiormq
from aio_pika.abc import AbstractChannel, AbstractExchange, AbstractQueue
from pamqp.commands import Basic
from pamqp.common import FieldTable

from sasflow.errors import ConfigurationError, MessageRefused, TransportError
from sasflow.outage import Outage
from sasflow.redact import redact, redact_text
from sasflow.transport.amqp_bundle import BUNDLE_TYPE, Bundler
from sasflow.transport.amqp_connection import (
    CONNECT_TIMEOUT,
    CONNECTION_ERRORS,
    PERSISTENT,
    REFUSALS,
    AmqpConnection,
    being_cancelled,
)
from sasflow.transport.amqp_consume import AmqpConsumer
from sasflow.transport.amqp_dead_letters import (
    DEAD_LETTERS,
    dead_letter_properties,
    peek,
    purge,
)
from sasflow.transport.amqp_wire import WireAddress
from sasflow.transport.amqp_wire_publish import MessageNacked, MessageReturned, WirePublisher
from sasflow.transport.base import (
    DEFAULT_MAX_MESSAGE_BYTES,
    Handler,
    carries_bundles,
    refuse_oversized,
)
from sasflow.transport.dead_letter import DeadLetter, DeliveryPolicy, split_policy

__all__ = ["AmqpTransport"]

log = logging.getLogger("sasflow.transport.amqp")

# How long publish keeps trying while the connection is being restored.
_PUBLISH_PATIENCE = 15.0
# Seconds between reconnection attempts, unless the URL sets reconnect_interval.
_RECONNECT_INTERVAL = 1.0
# AMQP carries a queue's name as a short string
_MAX_QUEUE_NAME_BYTES = 255
Properties = Basic.Properties


class AmqpTransport:
    """The RabbitMQ transport; connects on first use (``open_transport`` is not async)."""

    shared = True

    def __init__(self, url: str, *, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> None:
        self.url, self.queue_arguments, self.policy, self.dead_letter_queue = _split_url(url)
        # requests, replies and statuses go out on a connection of the transport's own,
        # and each consumer has one (amqp_wire.py); aio-pika declares for the
        # publisher, and takes the dead letters
        self.address = WireAddress(self.url)
        self._publisher = WirePublisher(self.address, connect_timeout=CONNECT_TIMEOUT)
        self.max_message_bytes = max_message_bytes
        self.outage = Outage(log, f"RabbitMQ at {redact(self.url)}")
        self._link = AmqpConnection(self.url, self.outage)
        self._declared: set[str] = set()  # queues the publishing channel has declared
        self._consumed: dict[str, int] = {}  # consumers running in this process, by queue
        self._bundler = Bundler(self._send, max_bytes=max_message_bytes)

    async def ping(self) -> None:
        """Open the connection, or fail at the first refusal (a health check)."""
        await self._link.connect(patient=False)

    async def _declare(self, channel: AbstractChannel, queue: str) -> AbstractQueue:
        return await channel.declare_queue(queue, durable=True, arguments=self.queue_arguments)

    async def _declare_dead_letters(self, channel: AbstractChannel) -> AbstractExchange:
        """The dead-letter exchange, with its durable queue bound, declared once per channel
        (both idempotent; never with queue_expires: dead letters wait for an operator)."""
        name = self.dead_letter_queue
        exchange = await channel.declare_exchange(name, aio_pika.ExchangeType.FANOUT,
                                                  durable=True)
        if name not in self._declared:
            queue = await channel.declare_queue(name, durable=True)
            await queue.bind(exchange)
            self._declared.add(name)
        return exchange

    def check_queue(self, queue: str) -> None:
        """RabbitMQ's rules for a queue's name: at most 255 bytes, and not its own
        ``amq.`` prefix (a declaration there is refused, and always will be)."""
        if len(queue.encode()) > _MAX_QUEUE_NAME_BYTES:
            raise MessageRefused(f"queue name {queue[:40]!r}... is longer than RabbitMQ's"
                                 f" {_MAX_QUEUE_NAME_BYTES} bytes")
        if queue.startswith("amq."):
            raise MessageRefused(f"queue name {queue!r}: names beginning 'amq.' are"
                                 " RabbitMQ's own")

    async def publish(self, queue: str, body: bytes) -> None:
        self._refuse(queue, body)
        if carries_bundles(queue):
            await self._bundler.post(queue, body)
        else:
            await self._send(queue, body, False)

    def publish_soon(self, queue: str, body: bytes) -> asyncio.Future[None]:
        """`publish`, started: the future ends once the broker confirmed the message.

        The broker confirms a persistent message once it is on disk or once every
        queue's consumer acked it, and an agent acks a request after its reply is
        confirmed in turn: a request's confirm comes after its reply. A scheduler
        therefore waits for the reply or for this future to fail, whichever comes
        first (scheduler.py), not for the confirm.
        """
        self._refuse(queue, body)
        if carries_bundles(queue):
            return self._bundler.post(queue, body)
        return asyncio.ensure_future(self._send(queue, body, False))

    def _refuse(self, queue: str, body: bytes) -> None:
        """MessageRefused, before anything is sent, for what RabbitMQ would never take."""
        self.check_queue(queue)
        refuse_oversized(queue, body, self.max_message_bytes)

    async def _send(self, queue: str, body: bytes, bundle: bool,
                    headers: FieldTable | None = None) -> None:
        """One AMQP message, returning once the broker confirmed it."""
        properties = Properties(delivery_mode=PERSISTENT,
                                content_type=BUNDLE_TYPE if bundle else None, headers=headers)
        await self._confirmed(queue, body, properties, to_dead_letters=False)

    async def _confirmed(self, queue: str, body: bytes, properties: Properties, *,
                         to_dead_letters: bool) -> None:
        """Publish a message to `queue` (or to the dead-letter exchange), once confirmed.
        `properties` are the message's own (the publisher writes its id into them).

        The queue is declared on aio-pika's connection, which also tells whether
        RabbitMQ is there at all (its Outage logs a wait). The message then goes out
        through the transport's own publisher (amqp_wire_publish.py), or, for a dead
        letter, with aiormq's own publish under aio-pika's channel."""
        give_up = time.monotonic() + _PUBLISH_PATIENCE
        pause = 0.05
        redeclared = False
        while True:
            try:
                opened = self._link.opened()  # (most publishes: no wait, so no timer)
                if opened is None:
                    async with asyncio.timeout(max(0.0, give_up - time.monotonic())):
                        opened = await self._link.connect()
                _, channel = opened
            except TimeoutError:
                last = self._link.outage.last
                why = redact_text(str(last)) if last is not None else "no answer"
                raise TransportError(
                    f"cannot publish to {queue}: RabbitMQ at {redact(self.url)} unreachable"
                    f" for {_PUBLISH_PATIENCE:g}s ({why})") from last
            try:
                if to_dead_letters:
                    exchange = (await self._declare_dead_letters(channel)).name
                else:
                    if queue not in self._declared:
                        await self._declare(channel, queue)
                        self._declared.add(queue)
                    exchange = ""  # the default exchange: routed by the queue's name
                if not to_dead_letters:
                    await self._publisher.publish(queue, body, properties)  # once confirmed
                    return
                underlay = await channel.get_underlay_channel()
                # returns once the broker confirmed (publisher confirms)
                await underlay.basic_publish(body, exchange=exchange, routing_key=queue,
                                             properties=properties, mandatory=True)
                return
            except (aiormq.exceptions.PublishError, MessageReturned):
                # returned unroutable: the queue was deleted since we declared it
                if redeclared:
                    raise TransportError(f"RabbitMQ cannot route a message to {queue}") from None
                self._declared.discard(self.dead_letter_queue if to_dead_letters else queue)
                redeclared = True
            except (aiormq.exceptions.DeliveryError, MessageNacked) as error:
                raise TransportError(f"RabbitMQ refused a message to {queue}: {error}") from error
            except REFUSALS as error:
                # what the broker says of the queue itself (not permitted, declared with
                # other arguments): the same on every retry, and not an outage
                raise MessageRefused(f"RabbitMQ refuses queue {queue}: {error}") from error
            except (*CONNECTION_ERRORS, asyncio.CancelledError) as error:
                if isinstance(error, asyncio.CancelledError) and being_cancelled():
                    raise
                # else aiormq cancelled the confirm: it gave the connection up (heartbeats)
                if self._link.closed or time.monotonic() + pause > give_up:
                    raise TransportError(
                        f"cannot publish to {queue}: RabbitMQ unreachable ({error!r})"
                    ) from error
                # a robust connection is reconnecting (its Outage says so): wait and
                # send again (at least once)
                log.debug("publish to %s failed (%r); retrying", queue, error)
                await asyncio.sleep(pause)
                pause = min(pause * 2, 1.0)


    async def consume(self, queue: str, handler: Handler, *, prefetch: int) -> None:
        await AmqpConsumer(self, queue, handler, prefetch=prefetch,
                           consumed=self._consumed).run()

    # ------------------------------------------------------------ dead letters (R3)
    async def keep_dead_letter(self, letter: DeadLetter) -> None:
        await self._confirmed(letter.queue, letter.body, dead_letter_properties(letter),
                              to_dead_letters=True)

    async def dead_letters(self, *, limit: int = 100) -> list[DeadLetter]:
        return await self._peek(lambda letters: len(letters) >= limit)

    async def dead_letter(self, letter_id: str) -> DeadLetter | None:
        letters = await self._peek(lambda letters: letters[-1].id == letter_id)
        return letters[-1] if letters and letters[-1].id == letter_id else None

    async def _peek(self, enough: Callable[[list[DeadLetter]], bool]) -> list[DeadLetter]:
        connection, _ = await self._link.connect(patient=False)  # an operator's command
        try:
            async with connection.channel(publisher_confirms=False) as channel:
                await self._declare_dead_letters(channel)
                return await peek(channel, self.dead_letter_queue, enough)
        except (aiormq.exceptions.AMQPError, *CONNECTION_ERRORS) as error:
            raise TransportError(f"cannot read the dead letters: {error!r}") from error

    async def purge_dead_letters(self) -> int:
        connection, _ = await self._link.connect(patient=False)  # an operator's command
        try:
            async with connection.channel(publisher_confirms=False) as channel:
                await self._declare_dead_letters(channel)
                return await purge(channel, self.dead_letter_queue)
        except (aiormq.exceptions.AMQPError, *CONNECTION_ERRORS) as error:
            raise TransportError(f"cannot purge the dead letters: {error!r}") from error

    async def close(self) -> None:
        self._link.closed = True  # first: nothing opens the connection again
        await self._bundler.close()
        await self._publisher.close()
        await self._link.close()


def _split_url(url: str) -> tuple[str, FieldTable, DeliveryPolicy, str]:
    """The URL for aio-pika; the queue arguments, delivery policy and dead-letter
    queue our own query parameters ask for."""
    parts = urlsplit(url)
    policy, query = split_policy(parts.query)
    arguments: FieldTable = {}
    dead_letters = DEAD_LETTERS
    rest = []
    for key, value in query:
        if key == "queue_expires":
            try:
                arguments["x-expires"] = int(float(value) * 1000)
            except ValueError:
                raise ConfigurationError(
                    f"queue_expires must be a number of seconds, got {value!r}") from None
        elif key == "dead_letters":
            dead_letters = value
        else:
            rest.append((key, value))
    if not any(key == "reconnect_interval" for key, _ in rest):
        # aio-pika waits 5 s between attempts; a restarted broker is back sooner than that
        rest.append(("reconnect_interval", str(_RECONNECT_INTERVAL)))
    return (urlunsplit(parts._replace(query=urlencode(rest))), arguments, policy,
            dead_letters)
