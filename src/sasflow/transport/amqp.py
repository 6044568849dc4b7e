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
  handler returned. A consumer that stops, or a process that dies, leaves its
  unacked messages (whole bundles) to the broker, which redelivers them to
  another consumer.
- A message whose handler raised is never requeued at once (a requeued message
  comes straight back: the hot loop of R3). After the delivery policy's backoff
  it is published again on its own, carrying its count of failed deliveries in
  the ``x-sasflow-deliveries`` header, and only then acked; once that count
  reaches the policy's bound (or at once, for a body its handler cannot
  decode) it goes to the ``sasflow.dead-letters`` exchange instead, and on to
  the durable queue of that name bound to it (docs/architecture.md says why
  the count is ours rather than the broker's). A message the broker
  redelivers (its consumer died holding it) counts one delivery more.

- A consumer or a publish waits for RabbitMQ for as long as it takes (R2), the
  first connection included: aio-pika retries every ``reconnect_interval``, each
  attempt bounded by ``_CONNECT_TIMEOUT``, and its per-attempt log records go to
  the transport's Outage instead, which says it once, then every 30 s. A
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
import contextlib
import itertools
import logging
import random
import time
from collections.abc import Awaitable, Callable
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import aio_pika
import aiormq
import msgspec
from aio_pika.abc import (
    AbstractChannel,
    AbstractExchange,
    AbstractIncomingMessage,
    AbstractQueue,
    AbstractRobustConnection,
)
from pamqp.common import FieldTable

from sasflow.errors import ConfigurationError, TransportError
from sasflow.outage import Outage
from sasflow.redact import redact, redact_text
from sasflow.transport.amqp_bundle import BUNDLE_TYPE, Bundler, decode_bundle
from sasflow.transport.base import DEFAULT_MAX_MESSAGE_BYTES, Handler, carries_bundles
from sasflow.transport.dead_letter import (
    DeadLetter,
    DeliveryPolicy,
    MalformedMessage,
    letter_for,
    log_dead_letter,
    split_policy,
)

__all__ = ["AmqpTransport"]

log = logging.getLogger("sasflow.transport.amqp")

# How long publish keeps trying while the connection is being restored.
_PUBLISH_PATIENCE = 15.0
# Seconds between reconnection attempts, unless the URL sets reconnect_interval.
_RECONNECT_INTERVAL = 1.0
# Bounds each attempt to connect (TCP and AMQP handshakes).
_CONNECT_TIMEOUT = 10.0
# Cap of the pause between attempts to open a connection cut during its handshake.
_RECONNECT_CAP = 5.0
# Bounds the clean-up of a stopping consumer, so a dead broker cannot hang a shutdown.
_STOP_TIMEOUT = 5.0

DEAD_LETTERS = "sasflow.dead-letters"
# Headers: failed deliveries so far and the first one's time (republished copies);
# a dead letter's queue, reason and when it was dead-lettered.
_DELIVERIES = "x-sasflow-deliveries"
_FIRST_SEEN = "x-sasflow-first-seen"
_QUEUE = "x-sasflow-queue"
_REASON = "x-sasflow-reason"
_DEAD_AT = "x-sasflow-dead-at"
# How long `dead_letters` waits for each message of the dead-letter queue.
_PEEK_TIMEOUT = 5.0

# What a lost connection or channel raises; publish waits for the reconnect and retries.
_CONNECTION_ERRORS = (aiormq.exceptions.AMQPConnectionError,
                      aiormq.exceptions.ChannelInvalidStateError,
                      aiormq.exceptions.ChannelClosed, ConnectionError)
# What the broker says of a queue or exchange itself (declared with other
# arguments, not permitted, missing): the same on every retry.
_REFUSALS = (aiormq.exceptions.ChannelPreconditionFailed,
             aiormq.exceptions.ChannelAccessRefused, aiormq.exceptions.ChannelNotFoundEntity)


class AmqpTransport:
    """The RabbitMQ transport; connects on first use (``open_transport`` is not async)."""

    shared = True

    def __init__(self, url: str, *, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> None:
        self.url, self._arguments, self.policy, self.dead_letter_queue = _split_url(url)
        self.max_message_bytes = max_message_bytes
        self._opening: asyncio.Task[tuple[AbstractRobustConnection, AbstractChannel]] | None
        self._opening = None
        self._declared: set[str] = set()  # queues the publishing channel has declared
        self._consumed: dict[str, int] = {}  # consumers running in this process, by queue
        self._bundler = Bundler(self._send, max_bytes=max_message_bytes)
        self._closed = False
        self._outage = Outage(log, f"RabbitMQ at {redact(self.url)}")

    async def _connect(self, *, patient: bool = True
                       ) -> tuple[AbstractRobustConnection, AbstractChannel]:
        """The connection and its publishing channel, opened once for every caller.

        A `patient` caller (a consumer, a publish) waits for RabbitMQ for as long as
        it takes (R2): aio-pika retries every ``reconnect_interval``, and the
        transport's Outage logs it once, then every 30 s. Otherwise (an operator's
        command) the first refusal is a TransportError.
        """
        if self._closed:
            raise TransportError("the RabbitMQ transport is closed")
        if self._opening is None:
            self._opening = asyncio.create_task(self._open(patient=patient))
            self._opening.add_done_callback(_retrieve)
        opening = self._opening
        try:
            # shielded: a caller cancelled mid-connect must not cancel the connection
            # attempt that the other callers wait for
            return await asyncio.shield(opening)
        except TransportError:
            if self._opening is opening:
                self._opening = None  # the next caller tries again
            raise

    async def _open(self, *, patient: bool
                    ) -> tuple[AbstractRobustConnection, AbstractChannel]:
        for attempt in itertools.count(1):
            # fail_fast off: aio-pika keeps trying the first connection, as it does
            # every later one, instead of raising at the first refusal
            connection = aio_pika.RobustConnection(aio_pika.connection.make_url(
                _with_query(self.url, fail_fast="1" if not patient else "0")))
            _ATTEMPTS.watch(connection, self._outage)
            try:
                # bounds each attempt, the first and every reconnection: a broker that
                # accepts and never answers would hold one forever
                await connection.connect(timeout=_CONNECT_TIMEOUT)
                publisher = await connection.channel(publisher_confirms=True,
                                                     on_return_raises=True)
            except (aiormq.exceptions.AMQPError, OSError) as error:
                _ATTEMPTS.forget(connection)
                with contextlib.suppress(Exception):
                    await connection.close()
                if not patient:
                    raise TransportError(f"cannot connect to RabbitMQ at {redact(self.url)}:"
                                         f" {error}") from error
                # cut during the handshake or the channel's opening: start over
                self._outage.failed(error)
                await asyncio.sleep(_backoff(attempt))
                continue
            except BaseException:
                _ATTEMPTS.forget(connection)
                await _close_quietly(connection)
                raise
            self._outage.recovered()
            connection.close_callbacks.add(self._on_lost)
            connection.reconnect_callbacks.add(lambda _: self._outage.recovered())
            return connection, publisher
        raise AssertionError("unreachable")

    def _on_lost(self, _: object, error: BaseException | None) -> None:
        """The connection closed; unless by us, aio-pika is reconnecting (R2)."""
        if not self._closed and error is not None:
            self._outage.failed(TransportError("no answer within the heartbeat") if isinstance(
                error, asyncio.CancelledError) else error)  # aiormq's word for it

    async def ping(self) -> None:
        """Open the connection, or fail at the first refusal (a health check)."""
        await self._connect(patient=False)

    async def _declare(self, channel: AbstractChannel, queue: str) -> AbstractQueue:
        return await channel.declare_queue(queue, durable=True, arguments=self._arguments)

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

    async def publish(self, queue: str, body: bytes) -> None:
        if len(body) > self.max_message_bytes:
            raise TransportError(
                f"message of {len(body)} bytes to {queue} is over the limit of"
                f" {self.max_message_bytes} bytes")
        if carries_bundles(queue):
            await self._bundler.publish(queue, body)
        else:
            await self._send(queue, body, False)

    async def _send(self, queue: str, body: bytes, bundle: bool,
                    headers: FieldTable | None = None) -> None:
        """One AMQP message, returning once the broker confirmed it."""
        message = aio_pika.Message(body, delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                                   content_type=BUNDLE_TYPE if bundle else None,
                                   headers=headers)
        await self._confirmed(queue, message, to_dead_letters=False)

    async def _confirmed(self, queue: str, message: aio_pika.Message, *,
                         to_dead_letters: bool) -> None:
        """Publish `message` to `queue` (or to the dead-letter exchange), once confirmed."""
        give_up = time.monotonic() + _PUBLISH_PATIENCE
        pause = 0.05
        redeclared = False
        while True:
            try:
                async with asyncio.timeout(max(0.0, give_up - time.monotonic())):
                    _, channel = await self._connect()
            except TimeoutError:
                last = self._outage.last
                why = redact_text(str(last)) if last is not None else "no answer"
                raise TransportError(
                    f"cannot publish to {queue}: RabbitMQ at {redact(self.url)} unreachable"
                    f" for {_PUBLISH_PATIENCE:g}s ({why})") from last
            try:
                if to_dead_letters:
                    exchange = await self._declare_dead_letters(channel)
                else:
                    if queue not in self._declared:
                        await self._declare(channel, queue)
                        self._declared.add(queue)
                    exchange = channel.default_exchange
                # returns once the broker confirmed (publisher confirms)
                await exchange.publish(message, routing_key=queue, mandatory=True)
                return
            except aiormq.exceptions.PublishError:
                # returned unroutable: the queue was deleted since we declared it
                if redeclared:
                    raise TransportError(f"RabbitMQ cannot route a message to {queue}") from None
                self._declared.discard(self.dead_letter_queue if to_dead_letters else queue)
                redeclared = True
            except aiormq.exceptions.DeliveryError as error:
                raise TransportError(f"RabbitMQ refused a message to {queue}: {error}") from error
            except (*_CONNECTION_ERRORS, asyncio.CancelledError) as error:
                if isinstance(error, asyncio.CancelledError) and _being_cancelled():
                    raise
                # else aiormq cancelled the confirm: it gave the connection up (heartbeats)
                if self._closed or time.monotonic() + pause > give_up:
                    raise TransportError(
                        f"cannot publish to {queue}: RabbitMQ unreachable ({error!r})"
                    ) from error
                # a robust connection is reconnecting (its Outage says so): wait and
                # send again (at least once)
                log.debug("publish to %s failed (%r); retrying", queue, error)
                await asyncio.sleep(pause)
                pause = min(pause * 2, 1.0)

    async def consume(self, queue: str, handler: Handler, *, prefetch: int) -> None:
        # counted from the start: a consumer counts as soon as consuming begins
        self._consumed[queue] = self._consumed.get(queue, 0) + 1
        running: set[asyncio.Task[object]] = set()
        # bundles hold several messages each: `prefetch` bounds the handlers running
        slots = asyncio.Semaphore(max(1, prefetch))
        channel: AbstractChannel | None = None
        try:
            async def handle(body: bytes) -> Exception | None:
                """The handler's error, if it raised (bounded by the slots)."""
                async with slots:
                    try:
                        await handler(body)
                    except Exception as error:
                        log.debug("handler for %s raised", queue, exc_info=True)
                        return error
                    return None

            async def on_message(message: AbstractIncomingMessage) -> None:
                task = asyncio.current_task()
                assert task is not None
                running.add(task)
                try:
                    # failed deliveries before this one; a redelivery by the broker
                    # means a consumer died holding it: one more
                    headers = message.headers or {}
                    before = int(_number(headers.get(_DELIVERIES))) + bool(message.redelivered)
                    first_seen = float(_number(headers.get(_FIRST_SEEN)))
                    if message.content_type != BUNDLE_TYPE:
                        failed = [(message.body, await handle(message.body))]
                    else:
                        failed = await self._handle_bundle(queue, message.body, handle)
                    settled = await asyncio.gather(*(
                        self._after_failure(queue, body, before + 1, first_seen, error)
                        for body, error in failed if error is not None))
                    if all(settled):
                        await message.ack()
                    else:  # could not be sent again: the broker keeps the whole message
                        await message.nack(requeue=True)
                except _CONNECTION_ERRORS as error:
                    # the channel is gone: the broker redelivers the unacked message
                    log.info("could not settle a message of %s: %r", queue, error)
                finally:
                    running.discard(task)

            for attempt in itertools.count(1):
                try:
                    connection, _ = await self._connect()
                    channel = await connection.channel(publisher_confirms=False)
                    await channel.set_qos(prefetch_count=max(1, prefetch))
                    declared = await self._declare(channel, queue)
                    tag = await declared.consume(on_message, no_ack=False)
                    break
                except _REFUSALS:
                    raise  # the broker refuses this queue as declared: no retry helps
                except (*_CONNECTION_ERRORS, TimeoutError, asyncio.CancelledError) as error:
                    if isinstance(error, asyncio.CancelledError) and _being_cancelled():
                        raise
                    # the connection went while the consumer was being set up (aiormq
                    # cancels what waited on it): it is reconnecting, so set up again (R2)
                    if channel is not None:
                        await _close_quietly(channel)
                        channel = None
                    self._outage.failed(error)
                    await asyncio.sleep(_backoff(attempt))
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
                             handle: Callable[[bytes], Awaitable[Exception | None]]
                             ) -> list[tuple[bytes, Exception | None]]:
        """Handle each message of a bundle; each body with its handler's error, if any."""
        try:
            bodies = decode_bundle(payload)
        except msgspec.DecodeError as error:  # the bundle itself is the dead letter
            return [(payload, MalformedMessage(f"not a bundle: {error}"))]
        errors = await asyncio.gather(*(handle(body) for body in bodies))
        return list(zip(bodies, errors, strict=True))

    async def _after_failure(self, queue: str, body: bytes, deliveries: int,
                             first_seen: float, error: Exception) -> bool:
        """Send a message that failed its `deliveries`-th delivery again after the backoff,
        or to the dead letters (R3). True once it is safely on its way."""
        first_seen = first_seen or time.time()
        try:
            if isinstance(error, MalformedMessage) or self.policy.exhausted(deliveries):
                letter = letter_for(queue, body, error, deliveries=deliveries,
                                    first_seen=first_seen)
                await self._confirmed(queue, _dead_letter_message(letter), to_dead_letters=True)
                log_dead_letter(log, letter)
            else:
                # held (unacked) meanwhile, so a crash now loses nothing
                await asyncio.sleep(self.policy.delay(deliveries))
                await self._send(queue, body, False, {_DELIVERIES: deliveries,
                                                      _FIRST_SEEN: first_seen})
        except TransportError as failure:
            log.info("could not send a failed message of %s on: %s", queue, failure)
            # it comes straight back when nacked: the pause keeps that from spinning
            await asyncio.sleep(self.policy.delay(deliveries))
            return False
        return True

    # ------------------------------------------------------------ dead letters (R3)
    async def dead_letters(self, *, limit: int = 100) -> list[DeadLetter]:
        return await self._peek(lambda letters: len(letters) >= limit)

    async def dead_letter(self, letter_id: str) -> DeadLetter | None:
        letters = await self._peek(lambda letters: letters[-1].id == letter_id)
        return letters[-1] if letters and letters[-1].id == letter_id else None

    async def _peek(self, enough: Callable[[list[DeadLetter]], bool]) -> list[DeadLetter]:
        """The dead-letter queue's messages from its head until `enough`, left in place:
        taken unacked and handed back, in order, when the channel closes."""
        connection, _ = await self._connect(patient=False)  # an operator's command
        letters: list[DeadLetter] = []
        try:
            async with connection.channel(publisher_confirms=False) as channel:
                await self._declare_dead_letters(channel)
                queue = await channel.get_queue(self.dead_letter_queue)
                while not letters or not enough(letters):
                    message = await queue.get(no_ack=False, fail=False, timeout=_PEEK_TIMEOUT)
                    if message is None:
                        break
                    letters.append(_letter_from(message))
        except (aiormq.exceptions.AMQPError, *_CONNECTION_ERRORS) as error:
            raise TransportError(f"cannot read the dead letters: {error!r}") from error
        return letters

    async def purge_dead_letters(self) -> int:
        connection, _ = await self._connect(patient=False)  # an operator's command
        try:
            async with connection.channel(publisher_confirms=False) as channel:
                await self._declare_dead_letters(channel)
                queue = await channel.get_queue(self.dead_letter_queue)
                purged = await queue.purge()
        except (aiormq.exceptions.AMQPError, *_CONNECTION_ERRORS) as error:
            raise TransportError(f"cannot purge the dead letters: {error!r}") from error
        return int(purged.message_count or 0)

    async def close(self) -> None:
        self._closed = True
        await self._bundler.close()
        opening, self._opening = self._opening, None
        if opening is None:
            return
        if not opening.done():  # still waiting for RabbitMQ: stop waiting
            opening.cancel()
            await asyncio.gather(opening, return_exceptions=True)
            return
        if not opening.cancelled() and opening.exception() is None:
            connection, _ = opening.result()
            _ATTEMPTS.forget(connection)
            await _close_quietly(connection)


def _retrieve(task: asyncio.Task[tuple[AbstractRobustConnection, AbstractChannel]]) -> None:
    """Mark a failed connection attempt's error as seen: its callers got it already."""
    if not task.cancelled():
        task.exception()


async def _close_quietly(connection: aio_pika.abc.AbstractConnection | AbstractChannel
                         ) -> None:
    """Close a connection or channel, within a bound: a silent broker cannot hold us."""
    with contextlib.suppress(Exception):
        async with asyncio.timeout(_STOP_TIMEOUT):
            await connection.close()


def _being_cancelled() -> bool:
    """Whether the running task was cancelled (not a library future it awaited)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def _backoff(attempt: int) -> float:
    """Capped, jittered pause before connecting again after a failed handshake."""
    return min(_RECONNECT_CAP, 0.1 * 2.0 ** (attempt - 1)) * (0.5 + random.random() / 2)


def _with_query(url: str, **options: str) -> str:
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query) if k not in options]
    return urlunsplit(parts._replace(query=urlencode([*query, *options.items()])))


class _ReconnectAttempts(logging.Filter):
    """aio-pika logs every reconnection attempt, once a second while RabbitMQ is down
    (and aiormq each refused socket with it): thousands of lines an hour. Each
    attempt of a connection this module opened goes to its transport's Outage
    instead, which says it once and then every 30 s (R2)."""

    def __init__(self) -> None:
        super().__init__()
        self._outages: dict[int, tuple[AbstractRobustConnection, Outage]] = {}
        self._installed = False

    def watch(self, connection: AbstractRobustConnection, outage: Outage) -> None:
        if not self._installed:
            self._installed = True
            for name in ("aio_pika.robust_connection", "aiormq.connection", "aio_pika.tools"):
                # first: the redacting filter (redact.guard_loggers) flattens the
                # record's arguments, and the connection is found by them
                logging.getLogger(name).filters.insert(0, self)
        self._outages[id(connection)] = (connection, outage)

    def forget(self, connection: AbstractRobustConnection) -> None:
        self._outages.pop(id(connection), None)

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name == "aio_pika.tools":
            # each robust channel failing to reopen on the closed connection, an error
            # line per channel per loss: the reconnection reopens them all
            return not (str(record.msg).startswith("Callback") and isinstance(
                record.args, tuple) and record.args and "RobustChannel._on_close" in repr(
                record.args[0]) and any(not c.connected.is_set()
                                         for c, _ in self._outages.values()))
        if record.name == "aiormq.connection":
            if not self._outages:
                return True
            if str(record.msg).startswith("Cancelling cause reader exited abnormally"):
                # a lost connection's traceback: the Outage names its cause in one line
                record.exc_info, record.exc_text = None, None
                return True
            # a refused socket, said again by the attempt's own record just after
            return not (str(record.msg).startswith("error when creating transport")
                        and any(not c.connected.is_set() for c, _ in self._outages.values()))
        if not isinstance(record.args, tuple) or not record.args:
            return True
        watched = self._outages.get(id(record.args[0]))
        if watched is None or watched[0] is not record.args[0]:
            return True
        outage = watched[1]
        message = str(record.msg)
        if message.startswith("Connection attempt to") and len(record.args) > 1:
            error = record.args[1]
            outage.failed(error if isinstance(error, BaseException) else
                          TransportError(str(error)))
            return False
        # "closed, reconnecting", said again for each failed attempt: the Outage
        # said it (the connection's close callback runs first)
        return not message.startswith("Connection to")


_ATTEMPTS = _ReconnectAttempts()


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


def _number(value: object) -> int | float:
    """A numeric header's value; 0 when absent or not a number (a foreign message)."""
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else 0


def _dead_letter_message(letter: DeadLetter) -> aio_pika.Message:
    return aio_pika.Message(
        letter.body, delivery_mode=aio_pika.DeliveryMode.PERSISTENT, message_id=letter.id,
        headers={_QUEUE: letter.queue, _REASON: letter.reason, _DELIVERIES: letter.deliveries,
                 _FIRST_SEEN: letter.first_seen, _DEAD_AT: letter.at})


def _letter_from(message: AbstractIncomingMessage) -> DeadLetter:
    """A dead letter as the dead-letter queue holds it (or any message an operator's
    policy routed there: what it lacks is left empty)."""
    headers = message.headers or {}
    at = float(_number(headers.get(_DEAD_AT)))
    return DeadLetter(id=message.message_id or f"tag-{message.delivery_tag}",
                      queue=str(headers.get(_QUEUE) or message.routing_key or ""),
                      reason=str(headers.get(_REASON) or "(dead-lettered by the broker)"),
                      deliveries=int(_number(headers.get(_DELIVERIES))),
                      first_seen=float(_number(headers.get(_FIRST_SEEN))) or at,
                      at=at, body=message.body)

