"""The RabbitMQ transport's connection: opened once, waited for, its outages logged.

One robust aio-pika connection per transport, with its channel: it declares
the publisher's queues, says whether RabbitMQ is there at all, and carries the
dead letters and the operator's verbs (the messages themselves travel on the
transport's own connections, amqp_wire.py). A patient caller waits for RabbitMQ for as long as it
takes (R2), the first connection included: aio-pika retries every
``reconnect_interval``, each attempt bounded by ``CONNECT_TIMEOUT``, and its
per-attempt log records go to the transport's Outage instead, which says it
once, then every 30 s. An operator's command is not patient: it fails at the
first refusal. Also here, what a lost connection raises and the helpers that
let a closing transport or a cancelled caller stop without waiting on a silent
broker.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import random
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import aio_pika
import aiormq
from aio_pika.abc import AbstractChannel, AbstractRobustConnection

from sasflow.errors import TransportError
from sasflow.outage import Outage
from sasflow.redact import redact

__all__ = ["CONNECTION_ERRORS", "CONNECT_TIMEOUT", "PERSISTENT", "REFUSALS", "STOP_TIMEOUT",
           "AmqpConnection", "backoff", "being_cancelled", "close_quietly"]

# Bounds each attempt to connect (TCP and AMQP handshakes).
CONNECT_TIMEOUT = 10.0
# Cap of the pause between attempts to open a connection cut during its handshake.
_RECONNECT_CAP = 5.0
# Bounds the clean-up of a stopping consumer, so a dead broker cannot hang a shutdown.
STOP_TIMEOUT = 5.0

# A message's delivery mode that has the broker write it to disk.
PERSISTENT = 2
# What a lost connection or channel raises; publish waits for the reconnect and retries.
CONNECTION_ERRORS = (aiormq.exceptions.AMQPConnectionError,
                     aiormq.exceptions.ChannelInvalidStateError,
                     aiormq.exceptions.ChannelClosed, ConnectionError)
# What the broker says of a queue or exchange itself (declared with other
# arguments, not permitted, missing): the same on every retry.
REFUSALS = (aiormq.exceptions.ChannelPreconditionFailed,
            aiormq.exceptions.ChannelAccessRefused, aiormq.exceptions.ChannelNotFoundEntity)


class AmqpConnection:
    """The connection and its publishing channel, opened on first use for every caller."""

    def __init__(self, url: str, outage: Outage) -> None:
        self.url, self.outage = url, outage
        self.opening: asyncio.Task[tuple[AbstractRobustConnection, AbstractChannel]] | None
        self.opening = None
        self.closed = False  # set by the transport as it closes: nothing opens any more

    def opened(self) -> tuple[AbstractRobustConnection, AbstractChannel] | None:
        """The connection and its publishing channel if they are open already: what
        `connect` would return, without a wait (or a timer to bound one)."""
        opening = self.opening
        if self.closed or opening is None or not opening.done() or opening.cancelled() \
                or opening.exception() is not None:
            return None
        return opening.result()

    async def connect(self, *, patient: bool = True
                      ) -> tuple[AbstractRobustConnection, AbstractChannel]:
        """The connection and its publishing channel, opened once for every caller.

        A `patient` caller (a consumer, a publish) waits for RabbitMQ for as long as
        it takes (R2): aio-pika retries every ``reconnect_interval``, and the
        transport's Outage logs it once, then every 30 s. Otherwise (an operator's
        command) the first refusal is a TransportError.
        """
        if self.closed:
            raise TransportError("the RabbitMQ transport is closed")
        if self.opening is None:
            self.opening = asyncio.create_task(self._open(patient=patient))
            self.opening.add_done_callback(_retrieve)
        opening = self.opening
        try:
            # shielded: a caller cancelled mid-connect must not cancel the connection
            # attempt that the other callers wait for
            return await asyncio.shield(opening)
        except TransportError:
            if self.opening is opening:
                self.opening = None  # the next caller tries again
            raise

    async def _open(self, *, patient: bool
                    ) -> tuple[AbstractRobustConnection, AbstractChannel]:
        for attempt in itertools.count(1):
            # fail_fast off: aio-pika keeps trying the first connection, as it does
            # every later one, instead of raising at the first refusal
            connection = aio_pika.RobustConnection(aio_pika.connection.make_url(
                _with_query(self.url, fail_fast="1" if not patient else "0")))
            _ATTEMPTS.watch(connection, self.outage)
            try:
                # bounds each attempt, the first and every reconnection: a broker that
                # accepts and never answers would hold one forever
                await connection.connect(timeout=CONNECT_TIMEOUT)
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
                self.outage.failed(error)
                await asyncio.sleep(backoff(attempt))
                continue
            except BaseException:
                _ATTEMPTS.forget(connection)
                await close_quietly(connection)
                raise
            self.outage.recovered()
            connection.close_callbacks.add(self._on_lost)
            connection.reconnect_callbacks.add(lambda _: self.outage.recovered())
            return connection, publisher
        raise AssertionError("unreachable")

    def _on_lost(self, _: object, error: BaseException | None) -> None:
        """The connection closed; unless by us, aio-pika is reconnecting (R2)."""
        if not self.closed and error is not None:
            self.outage.failed(TransportError("no answer within the heartbeat") if isinstance(
                error, asyncio.CancelledError) else error)  # aiormq's word for it

    async def close(self) -> None:
        """Stop waiting for RabbitMQ, or close the connection it opened."""
        self.closed = True
        opening, self.opening = self.opening, None
        if opening is None:
            return
        if not opening.done():  # still waiting for RabbitMQ: stop waiting
            opening.cancel()
            await asyncio.gather(opening, return_exceptions=True)
            return
        if not opening.cancelled() and opening.exception() is None:
            connection, _ = opening.result()
            _ATTEMPTS.forget(connection)
            await close_quietly(connection)


def _retrieve(task: asyncio.Task[tuple[AbstractRobustConnection, AbstractChannel]]) -> None:
    """Mark a failed connection attempt's error as seen: its callers got it already."""
    if not task.cancelled():
        task.exception()


async def close_quietly(connection: aio_pika.abc.AbstractConnection | AbstractChannel
                        ) -> None:
    """Close a connection or channel, within a bound: a silent broker cannot hold us."""
    with contextlib.suppress(Exception):
        async with asyncio.timeout(STOP_TIMEOUT):
            await connection.close()


def being_cancelled() -> bool:
    """Whether the running task was cancelled (not a library future it awaited)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def backoff(attempt: int) -> float:
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
        self.outages: dict[int, tuple[AbstractRobustConnection, Outage]] = {}
        self._installed = False

    def watch(self, connection: AbstractRobustConnection, outage: Outage) -> None:
        if not self._installed:
            self._installed = True
            for name in ("aio_pika.robust_connection", "aiormq.connection", "aio_pika.tools"):
                # first: the redacting filter (redact.guard_loggers) flattens the
                # record's arguments, and the connection is found by them
                logging.getLogger(name).filters.insert(0, self)
        self.outages[id(connection)] = (connection, outage)

    def forget(self, connection: AbstractRobustConnection) -> None:
        self.outages.pop(id(connection), None)

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name == "aio_pika.tools":
            # each robust channel failing to reopen on the closed connection, an error
            # line per channel per loss: the reconnection reopens them all
            return not (str(record.msg).startswith("Callback") and isinstance(
                record.args, tuple) and record.args and "RobustChannel._on_close" in repr(
                record.args[0]) and any(not c.connected.is_set()
                                         for c, _ in self.outages.values()))
        if record.name == "aiormq.connection":
            if not self.outages:
                return True
            if str(record.msg).startswith("Cancelling cause reader exited abnormally"):
                # a lost connection's traceback: the Outage names its cause in one line
                record.exc_info, record.exc_text = None, None
                return True
            # a refused socket, said again by the attempt's own record just after
            return not (str(record.msg).startswith("error when creating transport")
                        and any(not c.connected.is_set() for c, _ in self.outages.values()))
        if not isinstance(record.args, tuple) or not record.args:
            return True
        watched = self.outages.get(id(record.args[0]))
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
