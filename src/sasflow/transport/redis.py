"""Redis Streams transport (extra ``redis``): ``redis://host:port/db`` or ``rediss://``.

Each queue is a stream with one consumer group (``sasflow``); every ``consume``
call is a consumer of that group with a name unique to the process and call.
A message is ``XADD``-ed, read with ``XREADGROUP``, and ``XACK``-ed (then
``XDEL``-ed, so streams stay short) only after its handler returned. A handler
that raises, or is cancelled, has its entry put back at once (re-added, then
acked, atomically in one script) so the next consumer gets it promptly. A
consumer that dies without acking leaves its entries pending; every consumer
periodically takes over entries idle longer than the visibility timeout with
``XAUTOCLAIM``, and keeps its own in-flight entries fresh with ``XCLAIM`` so a
slow handler is not mistaken for a dead one.

This module is the transport itself: its URL, its publishes, its operator's
verbs. Its parts have a module each:

- redis_connection.py: the connection pools, and a lost connection waited out;
- redis_batch.py: many concurrent publishes and acks in one round trip;
- redis_consume.py: a consumer, from its reads to what it hands back as it stops;
- redis_dead_letters.py: the count of failed deliveries and the dead letters (R3).

Under load (a scheduler driving hundreds of tasks at once) ``publish`` and the
acks are called concurrently hundreds of times. Sending each on its own pooled
connection would take hundreds of connections, and a bounded pool refuses the
rest ("Too many connections"). They are auto-pipelined instead
(``redis_batch.AutoPipeline``): commands waiting when a flush starts go to Redis
together in one pipeline, so one round trip and one connection serve many
commands, with at most two flushes in flight; acks of the same stream share one
``XACK``/``XDEL``. A connection lost mid-pipeline fails each waiting caller with a
lost-connection error, which is retried like any other. The pipelines and all
other commands share a ``BlockingConnectionPool``: bounded (``max_connections``,
default 16), it waits for a free connection (up to 10 s, then the connection
counts as lost) instead of failing at once, so no burst can exhaust it. Each
blocking ``XREADGROUP`` reader holds a connection of its own, from a separate
pool, so a reader never waits for, nor starves, the commands.

A handler that raises does not have its entry put back at once (it would come
straight back: the hot loop of R3). The entry stays pending, kept fresh, for
the delivery policy's backoff, and is then re-added carrying its count of
failed deliveries (and the first one's time) in the entry's own fields. Once
that count, plus the times Redis delivered the entry (XPENDING's count, which
grows each time a dead consumer's entry is taken over), reaches the policy's
bound, or at once for a body its handler cannot decode, the entry moves to the
dead-letter stream (``sasflow.dead-letters``) with its reason, in one script.

URL options (query string): ``prefix`` (key prefix, default none),
``visibility_timeout`` (seconds, default 30), ``maxlen`` (approximate stream cap),
``max_deliveries`` and ``redelivery_backoff`` (dead_letter.py), ``dead_letters``
(the dead-letter stream's name); redis-py's own (e.g. ``max_connections``) are
passed on to it.

redis-py is used because it is the maintained, official client and has asyncio
built in (``redis.asyncio``), with connection pools and TLS; no second library.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import socket
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import redis.asyncio as aioredis
from redis.exceptions import RedisError
from redis.typing import EncodableT, FieldT

from sasflow.errors import ConfigurationError, TransportError
from sasflow.outage import Outage
from sasflow.redact import redact
from sasflow.transport.base import DEFAULT_MAX_MESSAGE_BYTES, Handler, refuse_oversized
from sasflow.transport.dead_letter import DeadLetter, policy_from_query
from sasflow.transport.redis_batch import AutoPipeline
from sasflow.transport.redis_connection import MAX_CONNECTIONS as MAX_CONNECTIONS
from sasflow.transport.redis_connection import PATIENCE as PATIENCE
from sasflow.transport.redis_connection import POOL_TIMEOUT as POOL_TIMEOUT
from sasflow.transport.redis_connection import open_pools, retrying
from sasflow.transport.redis_consume import GROUP as GROUP
from sasflow.transport.redis_consume import LEAVE, REQUEUE, RETRY, StreamConsumer
from sasflow.transport.redis_dead_letters import BURY, PURGE, letter, text
from sasflow.transport.redis_dead_letters import DEAD_LETTERS as DEAD_LETTERS
from sasflow.transport.redis_dead_letters import DELIVERIES as DELIVERIES
from sasflow.transport.redis_dead_letters import FIELD as FIELD
from sasflow.transport.redis_dead_letters import FIRST_SEEN as FIRST_SEEN

__all__ = ["RedisTransport"]
# (GROUP, FIELD, MAX_CONNECTIONS and the other names imported `as` themselves are this
# module's from before its parts had modules of their own: still importable from here.)

log = logging.getLogger(__name__)

_T = TypeVar("_T")


def _options(url: str) -> tuple[str, dict[str, str]]:
    """Split sasflow's own query options from the URL redis-py understands."""
    parts = urlsplit(url)
    ours, theirs = {}, []
    for key, value in parse_qsl(parts.query):
        if key in ("prefix", "visibility_timeout", "maxlen", "max_deliveries",
                   "redelivery_backoff", "dead_letters"):
            ours[key] = value
        else:
            theirs.append((key, value))
    return urlunsplit(parts._replace(query=urlencode(theirs))), ours


class RedisTransport:
    shared = True

    def __init__(self, url: str, *, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
                 visibility_timeout: float | None = None, prefix: str | None = None,
                 maxlen: int | None = None, block_seconds: float = 1.0) -> None:
        redis_url, options = _options(url)
        try:
            self.visibility_timeout = float(
                visibility_timeout if visibility_timeout is not None
                else options.get("visibility_timeout", 30.0))
            self.maxlen = maxlen if maxlen is not None else (
                int(options["maxlen"]) if "maxlen" in options else None)
        except ValueError as exc:
            raise ConfigurationError(
                f"bad option in transport URL {redact(url)!r}: {exc}") from exc
        self.prefix = prefix if prefix is not None else options.get("prefix", "")
        self.policy = policy_from_query(options)
        self.dead_letter_key = self._key(options.get("dead_letters", DEAD_LETTERS))
        self.max_message_bytes = max_message_bytes
        self.block_seconds = block_seconds
        pool, self._readers = open_pools(redis_url, block_seconds)
        self._redis: aioredis.Redis = aioredis.Redis.from_pool(pool)
        self._batch = AutoPipeline(pool)
        self._requeue = self._redis.register_script(REQUEUE)
        self._retry = self._redis.register_script(RETRY)
        self._bury = self._redis.register_script(BURY)
        self._purge = self._redis.register_script(PURGE)
        self._leave = self._redis.register_script(LEAVE)
        self._instance = f"{socket.gethostname()}.{os.getpid()}.{uuid.uuid4().hex[:8]}"
        self._calls = itertools.count(1)
        self._consumed: dict[str, int] = {}  # consumers running in this process, by queue
        # one for every consumer: a restart is a few lines, not a few per queue
        self._outage = Outage(log, f"Redis at {redact(redis_url)}")

    def _key(self, queue: str) -> str:
        return self.prefix + queue

    async def _retrying(self, op: Callable[[], Awaitable[_T]], what: str,
                        patience: float = PATIENCE) -> _T:
        """Run `op`, retrying a lost connection for up to `patience` seconds
        (redis_connection.retrying)."""
        return await retrying(op, what, patience)

    async def publish(self, queue: str, body: bytes) -> None:
        refuse_oversized(queue, body, self.max_message_bytes)
        key = self._key(queue)

        try:
            await self._retrying(lambda: self._batch.xadd(key, FIELD, body, self.maxlen),
                                 f"publishing to {queue}")
        except RedisError as exc:
            raise TransportError(f"cannot publish to {queue}: {exc}") from exc

    def check_queue(self, queue: str) -> None:
        """Any name will do: a stream's key is any string."""

    async def consume(self, queue: str, handler: Handler, *, prefetch: int) -> None:
        consumer = f"{self._instance}.{next(self._calls)}"
        await StreamConsumer(self, queue, handler, prefetch=prefetch, name=consumer,
                             consumed=self._consumed).run()

    # ------------------------------------------------------------ dead letters (R3)
    async def dead_letters(self, *, limit: int = 100) -> list[DeadLetter]:
        entries: Any = await self._reading(lambda: self._xrange("-", "+", limit))
        return [letter(i, f) for i, f in entries]

    async def dead_letter(self, letter_id: str) -> DeadLetter | None:
        try:
            entries: Any = await self._reading(lambda: self._xrange(letter_id, letter_id, 1))
        except TransportError as error:
            if "Invalid stream ID" in str(error):
                return None  # not an id this stream could have given
            raise
        # Redis reads "5-00" as "5-0": only the id as it gave it names the letter
        return letter(*entries[0]) if entries and text(entries[0][0]) == letter_id else None

    async def keep_dead_letter(self, letter: DeadLetter) -> None:
        fields: dict[FieldT, EncodableT] = {
            "queue": letter.queue, "reason": letter.reason, "deliveries": letter.deliveries,
            "first_seen": letter.first_seen, "at": letter.at, "body": letter.body}
        try:
            await self._retrying(lambda: self._redis.xadd(self.dead_letter_key, fields),
                                 "keeping a dead letter")
        except RedisError as exc:
            raise TransportError(f"cannot keep a dead letter of {letter.queue}: {exc}") from exc

    async def purge_dead_letters(self) -> int:
        count = await self._reading(lambda: self._purge(keys=[self.dead_letter_key]))
        return int(count)

    async def _xrange(self, first: str, last: str, count: int) -> Any:
        return await self._redis.xrange(self.dead_letter_key, first, last, count=count) or []

    async def _reading(self, op: Callable[[], Awaitable[_T]]) -> _T:
        try:
            return await self._retrying(op, "reading the dead letters", patience=2.0)
        except RedisError as error:
            raise TransportError(f"cannot read the dead letters: {error}") from error

    async def _ack(self, key: str, entry_id: bytes) -> None:
        # the handler's work is done: its ack goes even if the consumer stops meanwhile
        # (a cancelled caller's command is otherwise dropped)
        await asyncio.shield(self._batch.ack(key, GROUP, entry_id))

    async def ping(self) -> None:
        try:
            await self._redis.ping()
        except (RedisError, OSError) as error:
            raise TransportError(f"cannot reach Redis: {error}") from error

    async def close(self) -> None:
        await self._batch.drain()
        await self._redis.aclose()
        await self._readers.disconnect()
