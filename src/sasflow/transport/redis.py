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
import contextlib
import itertools
import logging
import os
import random
import socket
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from sasflow.errors import ConfigurationError, TransportError
from sasflow.outage import Outage
from sasflow.redact import redact
from sasflow.transport.base import DEFAULT_MAX_MESSAGE_BYTES, Handler
from sasflow.transport.dead_letter import (
    DeadLetter,
    MalformedMessage,
    describe,
    log_dead_letter,
    policy_from_query,
)
from sasflow.transport.redis_batch import AutoPipeline

__all__ = ["RedisTransport"]

log = logging.getLogger(__name__)

GROUP = "sasflow"
FIELD = b"body"
# an entry sent again after failing: its failed deliveries so far, and the first one's time
DELIVERIES = b"deliveries"
FIRST_SEEN = b"first_seen"
DEAD_LETTERS = "sasflow.dead-letters"
_LOST = (RedisConnectionError, RedisTimeoutError, OSError)
_T = TypeVar("_T")
MAX_CONNECTIONS = 16  # per transport; publishes and acks, pipelined, use two of them at most
POOL_TIMEOUT = 10.0  # seconds waiting for a free pooled connection before it counts as lost
# How long a publish or an ack keeps retrying a lost connection (as RabbitMQ's publish).
PATIENCE = 15.0

# Put entries back: re-add each one still pending (XACK says so, so an entry
# another consumer already acked is never duplicated) and drop the original.
_REQUEUE = """
local n = 0
for i = 2, #ARGV do
  local id = ARGV[i]
  if redis.call('XACK', KEYS[1], ARGV[1], id) == 1 then
    local e = redis.call('XRANGE', KEYS[1], id, id)
    if #e == 1 then
      redis.call('XADD', KEYS[1], '*', unpack(e[1][2]))
      n = n + 1
    end
    redis.call('XDEL', KEYS[1], id)
  end
end
return n
"""

# Send again an entry whose handler failed: re-add its body with its count of
# failed deliveries, drop the original (only if still pending, as above).
_RETRY = """
if redis.call('XACK', KEYS[1], ARGV[1], ARGV[2]) == 1 then
  redis.call('XADD', KEYS[1], '*', 'body', ARGV[3], 'deliveries', ARGV[4], 'first_seen', ARGV[5])
  redis.call('XDEL', KEYS[1], ARGV[2])
  return 1
end
return 0
"""

# Move an entry to the dead-letter stream (KEYS[2]) with its reason; its new id.
_BURY = """
if redis.call('XACK', KEYS[1], ARGV[1], ARGV[2]) == 1 then
  local id = redis.call('XADD', KEYS[2], '*', 'queue', ARGV[3], 'reason', ARGV[4],
    'deliveries', ARGV[5], 'first_seen', ARGV[6], 'at', ARGV[7], 'body', ARGV[8])
  redis.call('XDEL', KEYS[1], ARGV[2])
  return id
end
return false
"""

# Forget the dead letters; how many there were (a script: atomic, and no MULTI
# for the ACL of docs/deploy.md to grant).
_PURGE = """
local n = redis.call('XLEN', KEYS[1])
redis.call('DEL', KEYS[1])
return n
"""

# A consumer leaving: forget it if it holds nothing, and delete the stream when
# it is empty and nobody else consumes it (per-instance reply queues would pile
# up otherwise). Atomic, so a message published meanwhile is never dropped.
_LEAVE = """
if #redis.call('XPENDING', KEYS[1], ARGV[1], '-', '+', 1, ARGV[2]) > 0 then return 0 end
redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], ARGV[2])
if redis.call('XLEN', KEYS[1]) > 0 then return 0 end
local groups = redis.call('XINFO', 'GROUPS', KEYS[1])
if #groups ~= 1 then return 0 end
local g = groups[1]
for i = 1, #g, 2 do
  if (g[i] == 'consumers' or g[i] == 'pending') and g[i + 1] ~= 0 then return 0 end
end
redis.call('DEL', KEYS[1])
return 1
"""


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
        # No retries inside redis-py: this module retries itself, so that a lost
        # connection is seen and the entries it may have delivered are recovered.
        settings: dict[str, Any] = dict(
            retry=Retry(NoBackoff(), 0), socket_connect_timeout=5.0,
            # bounds every read, so a half-dead connection is noticed and replaced
            socket_timeout=block_seconds + 10.0)
        pool = aioredis.BlockingConnectionPool.from_url(
            redis_url, max_connections=MAX_CONNECTIONS, timeout=POOL_TIMEOUT, **settings)
        self._redis: aioredis.Redis = aioredis.Redis.from_pool(pool)
        # one connection per consumer, held while it lives: bounded by the consumers
        self._readers = aioredis.ConnectionPool(
            connection_class=pool.connection_class, max_connections=2**31,
            **pool.connection_kwargs)
        self._batch = AutoPipeline(pool)
        self._requeue = self._redis.register_script(_REQUEUE)
        self._retry = self._redis.register_script(_RETRY)
        self._bury = self._redis.register_script(_BURY)
        self._purge = self._redis.register_script(_PURGE)
        self._leave = self._redis.register_script(_LEAVE)
        self._instance = f"{socket.gethostname()}.{os.getpid()}.{uuid.uuid4().hex[:8]}"
        self._calls = itertools.count(1)
        self._consumed: dict[str, int] = {}  # consumers running in this process, by queue
        # one for every consumer: a restart is a few lines, not a few per queue
        self._outage = Outage(log, f"Redis at {redact(redis_url)}")

    def _key(self, queue: str) -> str:
        return self.prefix + queue

    async def _retrying(self, op: Callable[[], Awaitable[_T]], what: str,
                        patience: float = PATIENCE) -> _T:
        """Run `op`, retrying a lost connection with capped, jittered backoff for up to
        `patience` seconds (a restarted Redis is back within it), quietly: the
        consumers' Outage says the connection is lost, once."""
        give_up = time.monotonic() + patience
        for attempt in itertools.count(1):
            try:
                return await op()
            except _LOST as exc:
                pause = _backoff(attempt)
                if time.monotonic() + pause > give_up:
                    raise TransportError(f"redis unreachable while {what}: {exc}") from exc
                log.debug("redis unreachable while %s (%s); retrying", what, exc)
                await asyncio.sleep(pause)
        raise AssertionError("unreachable")

    async def publish(self, queue: str, body: bytes) -> None:
        if len(body) > self.max_message_bytes:
            raise TransportError(
                f"message of {len(body)} bytes to {queue} is over the limit of"
                f" {self.max_message_bytes} bytes")
        key = self._key(queue)

        try:
            await self._retrying(lambda: self._batch.xadd(key, FIELD, body, self.maxlen),
                                 f"publishing to {queue}")
        except RedisError as exc:
            raise TransportError(f"cannot publish to {queue}: {exc}") from exc

    async def _join_group(self, key: str, consumer: str) -> None:
        try:
            # id 0: messages published before the first consumer are delivered too
            await self._redis.xgroup_create(key, GROUP, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        # registered now, not at its first delivery, so that a consumer leaving
        # sees this one and keeps the stream
        await self._redis.xgroup_createconsumer(key, GROUP, consumer)

    async def consume(self, queue: str, handler: Handler, *, prefetch: int) -> None:
        key = self._key(queue)
        consumer = f"{self._instance}.{next(self._calls)}"
        slots = max(1, prefetch)
        running: dict[bytes, asyncio.Task[None]] = {}
        room = asyncio.Event()
        # its own connection: a blocked XREADGROUP must not hold a pooled one
        reader = aioredis.Redis(connection_pool=self._readers, single_connection_client=True)
        loop = asyncio.get_running_loop()

        async def handle(entry_id: bytes, fields: dict[bytes, bytes], delivered: int) -> None:
            try:
                try:
                    if FIELD not in fields:
                        raise MalformedMessage(f"a stream entry without a {FIELD!r} field")
                    await handler(fields[FIELD])
                except Exception as error:
                    # this delivery and those before it (counted in the entry, then by Redis)
                    deliveries = _int(fields.get(DELIVERIES)) + delivered
                    await self._after_failure(queue, key, entry_id, fields, deliveries, error)
                else:
                    await self._retrying(lambda: self._ack(key, entry_id),
                                         f"acking a message of {queue}")
            except (TransportError, RedisError) as exc:
                # left pending: recovered after the visibility timeout
                log.warning("could not settle a message of %s: %s", queue, exc)
            finally:
                running.pop(entry_id, None)
                room.set()

        async def start(entries: list[tuple[bytes, dict[bytes, bytes] | None]], *,
                        first: bool) -> None:
            """Handle `entries`; unless this is their `first` delivery, ask Redis how
            many times each was delivered (it counts each takeover of a dead consumer's)."""
            fresh = [(i, f) for i, f in entries if i not in running and f is not None]
            counts = [1] * len(fresh) if first else await asyncio.gather(
                *(self._times_delivered(key, i) for i, _ in fresh))
            for (entry_id, fields), delivered in zip(fresh, counts, strict=True):
                assert fields is not None
                running[entry_id] = asyncio.ensure_future(handle(entry_id, fields, delivered))

        self._consumed[queue] = self._consumed.get(queue, 0) + 1
        interval = max(0.05, self.visibility_timeout / 3)
        next_sweep, failures, recover = 0.0, 0, False
        beat = asyncio.ensure_future(self._heartbeat(key, consumer, running, interval))
        try:
            while True:
                _raise_if_cancelled()
                while len(running) >= slots:
                    room.clear()
                    await room.wait()
                free = slots - len(running)
                try:
                    if failures or next_sweep == 0.0:
                        await self._join_group(key, consumer)
                    if recover:
                        # what this consumer was handed but may never have received
                        # (its history includes the entries being handled: skipped)
                        held = _entries(await reader.xreadgroup(
                            GROUP, consumer, {key: "0"}, count=free + len(running)))
                        gone = [i for i, fields in held if not fields]
                        if gone:  # deleted meanwhile: nothing left to deliver
                            await self._redis.xack(key, GROUP, *gone)
                        await start(held, first=False)
                        recover = False
                        failures = 0
                        continue
                    if loop.time() >= next_sweep:
                        next_sweep = loop.time() + interval
                        claimed = await self._redis.xautoclaim(
                            key, GROUP, consumer, int(self.visibility_timeout * 1000),
                            count=free)
                        await start([(i, f) for i, f in claimed[1]], first=False)
                        if len(running) >= slots:
                            continue
                        free = slots - len(running)
                    entries = _entries(await self._blocking_read(
                        reader.xreadgroup(GROUP, consumer, {key: ">"}, count=free,
                                          block=max(1, int(1000 * min(
                                              self.block_seconds, next_sweep - loop.time()))))))
                    failures = 0
                    self._outage.recovered(by=consumer)
                    await start(entries, first=True)
                except _LOST as exc:
                    _raise_if_cancelled()  # being stopped: not a reason to reconnect
                    failures += 1
                    recover = True
                    self._outage.failed(exc, by=consumer)
                    await asyncio.sleep(_backoff(failures))
                except ResponseError as exc:
                    if "NOGROUP" not in str(exc) and "UNBLOCKED" not in str(exc):
                        raise TransportError(f"cannot consume {queue}: {exc}") from exc
                    # the stream was deleted or Redis restarted empty: join again
                    failures += 1
                    await asyncio.sleep(_backoff(failures))
        finally:
            self._consumed[queue] -= 1
            self._outage.left(consumer)
            for task in [beat, *running.values()]:
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.gather(beat, *running.values(), return_exceptions=True)
            await self._leave_group(key, consumer)
            with contextlib.suppress(RedisError, OSError):
                async with asyncio.timeout(self.block_seconds):
                    await reader.aclose()

    async def _blocking_read(self, read: Awaitable[Any]) -> Any:
        """Await a blocking XREADGROUP, but let a cancelled consumer stop at once.

        A blocked read interrupted by cancellation does not always give up its
        connection promptly, so it runs as its own task; whatever it may still
        have been handed stays pending for this consumer and is put back when
        the consumer leaves (or taken over after the visibility timeout).
        """
        task = asyncio.ensure_future(read)
        task.add_done_callback(_retrieve)
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            task.cancel()
            await asyncio.wait([task], timeout=self.block_seconds)
            raise

    async def _times_delivered(self, key: str, entry_id: bytes) -> int:
        pending = await self._redis.xpending_range(key, GROUP, entry_id, entry_id, 1)
        return int(pending[0]["times_delivered"]) if pending else 1

    async def _after_failure(self, queue: str, key: str, entry_id: bytes,
                             fields: dict[bytes, bytes], deliveries: int,
                             error: Exception) -> None:
        """Send an entry that failed its `deliveries`-th delivery again after the backoff,
        or to the dead-letter stream (R3)."""
        now = time.time()
        first_seen = _float(fields.get(FIRST_SEEN)) or now
        if isinstance(error, MalformedMessage) or self.policy.exhausted(deliveries):
            body = fields.get(FIELD, repr(fields).encode())
            reason = describe(error)
            letter_id = await self._retrying(lambda: self._bury(
                keys=[key, self.dead_letter_key],
                args=[GROUP, entry_id, queue, reason, deliveries, repr(first_seen), repr(now),
                      body]), f"dead-lettering a message of {queue}")
            if letter_id is not None:  # else another consumer had settled it
                log_dead_letter(log, DeadLetter(
                    id=_text(letter_id), queue=queue, reason=reason, deliveries=deliveries,
                    first_seen=first_seen, at=now, body=body))
            return
        log.debug("handler for %s raised; delivering again", queue, exc_info=True)
        # pending and kept fresh meanwhile, so a crash now loses nothing
        await asyncio.sleep(self.policy.delay(deliveries))
        await self._retrying(lambda: self._retry(
            keys=[key], args=[GROUP, entry_id, fields[FIELD], deliveries, repr(first_seen)]),
            f"delivering again a message of {queue}")

    # ------------------------------------------------------------ dead letters (R3)
    async def dead_letters(self, *, limit: int = 100) -> list[DeadLetter]:
        entries: Any = await self._reading(lambda: self._xrange("-", "+", limit))
        return [_letter(i, f) for i, f in entries]

    async def dead_letter(self, letter_id: str) -> DeadLetter | None:
        try:
            entries: Any = await self._reading(lambda: self._xrange(letter_id, letter_id, 1))
        except TransportError as error:
            if "Invalid stream ID" in str(error):
                return None  # not an id this stream could have given
            raise
        # Redis reads "5-00" as "5-0": only the id as it gave it names the letter
        return _letter(*entries[0]) if entries and _text(entries[0][0]) == letter_id else None

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
        await self._batch.ack(key, GROUP, entry_id)

    async def _heartbeat(self, key: str, consumer: str,
                         running: dict[bytes, asyncio.Task[None]], interval: float) -> None:
        """Keep resetting the idle time of entries being handled, so a slow handler
        is not mistaken for a dead consumer and its entries taken over."""
        while True:
            await asyncio.sleep(interval)
            _raise_if_cancelled()
            if running:
                claim: list[Any] = list(running)
                with contextlib.suppress(*_LOST, ResponseError):
                    await self._redis.xclaim(key, GROUP, consumer, 0, claim, justid=True)

    async def _leave_group(self, key: str, consumer: str) -> None:
        """Put back whatever this consumer still holds, then leave the group."""
        try:
            pending = await self._retrying(
                lambda: self._redis.xpending_range(key, GROUP, "-", "+", 10_000, consumer),
                "leaving the consumer group", patience=1.0)
            ids = [p["message_id"] for p in pending]
            if ids:
                await self._retrying(lambda: self._requeue(keys=[key], args=[GROUP, *ids]),
                                     "putting back messages", patience=1.0)
            await self._retrying(lambda: self._leave(keys=[key], args=[GROUP, consumer]),
                                 "leaving the consumer group", patience=1.0)
        except (TransportError, RedisError) as exc:
            # held entries stay pending and are taken over after the visibility timeout
            log.warning("could not leave the consumer group of %s cleanly: %s", key, exc)

    async def ping(self) -> None:
        try:
            await self._redis.ping()
        except (RedisError, OSError) as error:
            raise TransportError(f"cannot reach Redis: {error}") from error

    async def close(self) -> None:
        await self._batch.drain()
        await self._redis.aclose()
        await self._readers.disconnect()


def _entries(reply: Any) -> list[tuple[bytes, dict[bytes, bytes] | None]]:
    """The entries of an XREADGROUP reply on one stream (RESP2 list or RESP3 dict)."""
    if not reply:
        return []
    if isinstance(reply, dict):
        return [e for stream in reply.values() for e in stream[0]]
    return [e for _, stream in reply for e in stream]


def _int(value: bytes | None) -> int:
    try:
        return int(value) if value is not None else 0
    except ValueError:
        return 0


def _float(value: bytes | None) -> float:
    try:
        return float(value) if value is not None else 0.0
    except ValueError:
        return 0.0


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _letter(entry_id: bytes | str, fields: dict[bytes, bytes]) -> DeadLetter:
    at = _float(fields.get(b"at"))
    return DeadLetter(id=_text(entry_id), queue=fields.get(b"queue", b"").decode(errors="replace"),
                      reason=fields.get(b"reason", b"").decode(errors="replace"),
                      deliveries=_int(fields.get(DELIVERIES)),
                      first_seen=_float(fields.get(FIRST_SEEN)) or at, at=at,
                      body=fields.get(FIELD, b""))


def _raise_if_cancelled() -> None:
    """Stop a cancelled task even if a library call swallowed its CancelledError."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


def _retrieve(task: asyncio.Future[Any]) -> None:
    """Mark an abandoned read's outcome as seen (it is recovered another way)."""
    if not task.cancelled():
        task.exception()


def _backoff(attempt: int) -> float:
    return min(2.0, 0.05 * 2.0 ** (attempt - 1)) * (0.5 + random.random() / 2)
