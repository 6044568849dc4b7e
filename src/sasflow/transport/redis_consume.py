"""The Redis Streams transport's consumers: read, handle, ack; recover the rest.

Every ``consume`` call is a consumer of the queue's group (``sasflow``) with a
name unique to the process and call. An entry is read with ``XREADGROUP`` and
``XACK``-ed (then ``XDEL``-ed, so streams stay short) only after its handler
returned. A consumer that dies without acking leaves its entries pending; every
consumer periodically takes over entries idle longer than the visibility
timeout with ``XAUTOCLAIM``, and keeps its own in-flight entries fresh with
``XCLAIM`` so a slow handler is not mistaken for a dead one. A consumer that
stops puts back what it still holds, in one script, and leaves the group.

A handler that raises does not have its entry put back at once (it would come
straight back: the hot loop of R3). The entry stays pending, kept fresh, for
the delivery policy's backoff, and is then re-added carrying its count of
failed deliveries in the entry's own fields; at the policy's bound it goes to
the dead letters instead (redis_dead_letters.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError, ResponseError

from sasflow.errors import TransportError
from sasflow.transport.base import Handler
from sasflow.transport.dead_letter import DeadLetter, MalformedMessage, describe, log_dead_letter
from sasflow.transport.redis_connection import LOST, backoff
from sasflow.transport.redis_dead_letters import (
    DELIVERIES,
    FIELD,
    FIRST_SEEN,
    as_float,
    as_int,
    text,
)

if TYPE_CHECKING:
    from sasflow.transport.redis import RedisTransport

__all__ = ["GROUP", "LEAVE", "REQUEUE", "RETRY", "StreamConsumer"]

log = logging.getLogger("sasflow.transport.redis")

GROUP = "sasflow"

# Put entries back: re-add each one still pending (XACK says so, so an entry
# another consumer already acked is never duplicated) and drop the original.
REQUEUE = """
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
RETRY = """
if redis.call('XACK', KEYS[1], ARGV[1], ARGV[2]) == 1 then
  redis.call('XADD', KEYS[1], '*', 'body', ARGV[3], 'deliveries', ARGV[4], 'first_seen', ARGV[5])
  redis.call('XDEL', KEYS[1], ARGV[2])
  return 1
end
return 0
"""

# A consumer leaving: forget it if it holds nothing, and delete the stream when
# it is empty and nobody else consumes it (per-instance reply queues would pile
# up otherwise). Atomic, so a message published meanwhile is never dropped.
LEAVE = """
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


class StreamConsumer:
    """One ``consume`` of a queue: its reader connection, its running handlers, how
    each entry is settled, and what it hands back when it stops. Talks to Redis
    through its transport (its pool, scripts and retrying)."""

    def __init__(self, transport: RedisTransport, queue: str, handler: Handler, *,
                 prefetch: int, name: str, consumed: dict[str, int]) -> None:
        self.transport, self.queue, self.handler = transport, queue, handler
        self.key = transport._key(queue)
        self.name = name  # this consumer's, in the group
        self.slots = max(1, prefetch)
        self.consumed = consumed  # consumers running in this process, by queue
        self.running: dict[bytes, asyncio.Task[None]] = {}
        self.room = asyncio.Event()

    async def run(self) -> None:
        """Consume until cancelled; after a lost connection, recover what it was handed."""
        transport, queue, key, consumer = self.transport, self.queue, self.key, self.name
        slots, running, room = self.slots, self.running, self.room
        # its own connection: a blocked XREADGROUP must not hold a pooled one
        reader = aioredis.Redis(connection_pool=transport._readers,
                                single_connection_client=True)
        loop = asyncio.get_running_loop()
        self.consumed[queue] = self.consumed.get(queue, 0) + 1
        interval = max(0.05, transport.visibility_timeout / 3)
        next_sweep, failures, recover = 0.0, 0, False
        beat = asyncio.ensure_future(self._heartbeat(interval))
        try:
            while True:
                _raise_if_cancelled()
                while len(running) >= slots:
                    room.clear()
                    await room.wait()
                free = slots - len(running)
                try:
                    if failures or next_sweep == 0.0:
                        await self._join_group()
                    if recover:
                        # what this consumer was handed but may never have received
                        # (its history includes the entries being handled: skipped)
                        held = _entries(await reader.xreadgroup(
                            GROUP, consumer, {key: "0"}, count=free + len(running)))
                        gone = [i for i, fields in held if not fields]
                        if gone:  # deleted meanwhile: nothing left to deliver
                            await transport._redis.xack(key, GROUP, *gone)
                        await self._start(held, first=False)
                        recover = False
                        failures = 0
                        continue
                    if loop.time() >= next_sweep:
                        next_sweep = loop.time() + interval
                        claimed = await transport._redis.xautoclaim(
                            key, GROUP, consumer, int(transport.visibility_timeout * 1000),
                            count=free)
                        await self._start([(i, f) for i, f in claimed[1]], first=False)
                        if len(running) >= slots:
                            continue
                        free = slots - len(running)
                    entries = _entries(await self._blocking_read(
                        reader.xreadgroup(GROUP, consumer, {key: ">"}, count=free,
                                          block=max(1, int(1000 * min(
                                              transport.block_seconds,
                                              next_sweep - loop.time()))))))
                    failures = 0
                    transport._outage.recovered(by=consumer)
                    await self._start(entries, first=True)
                except LOST as exc:
                    _raise_if_cancelled()  # being stopped: not a reason to reconnect
                    failures += 1
                    recover = True
                    transport._outage.failed(exc, by=consumer)
                    await asyncio.sleep(backoff(failures))
                except ResponseError as exc:
                    if "NOGROUP" not in str(exc) and "UNBLOCKED" not in str(exc):
                        raise TransportError(f"cannot consume {queue}: {exc}") from exc
                    # the stream was deleted or Redis restarted empty: join again
                    failures += 1
                    await asyncio.sleep(backoff(failures))
        finally:
            self.consumed[queue] -= 1
            transport._outage.left(consumer)
            for task in [beat, *running.values()]:
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.gather(beat, *running.values(), return_exceptions=True)
            # the acks of the handlers that ended go out before what is held is put
            # back: put back, a handled message would be delivered and run again
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(transport.block_seconds):
                    await transport._batch.drain()
            await self._leave_group()
            with contextlib.suppress(RedisError, OSError):
                async with asyncio.timeout(transport.block_seconds):
                    await reader.aclose()

    async def _join_group(self) -> None:
        redis = self.transport._redis
        try:
            # id 0: messages published before the first consumer are delivered too
            await redis.xgroup_create(self.key, GROUP, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        # registered now, not at its first delivery, so that a consumer leaving
        # sees this one and keeps the stream
        await redis.xgroup_createconsumer(self.key, GROUP, self.name)

    async def _handle(self, entry_id: bytes, fields: dict[bytes, bytes], delivered: int) -> None:
        queue, key = self.queue, self.key
        try:
            try:
                if FIELD not in fields:
                    raise MalformedMessage(f"a stream entry without a {FIELD!r} field")
                await self.handler(fields[FIELD])
            except Exception as error:
                # this delivery and those before it (counted in the entry, then by Redis)
                deliveries = as_int(fields.get(DELIVERIES)) + delivered
                await self._after_failure(entry_id, fields, deliveries, error)
            else:
                await self.transport._retrying(lambda: self.transport._ack(key, entry_id),
                                               f"acking a message of {queue}")
        except (TransportError, RedisError) as exc:
            # left pending: recovered after the visibility timeout
            log.warning("could not settle a message of %s: %s", queue, exc)
        finally:
            self.running.pop(entry_id, None)
            self.room.set()

    async def _start(self, entries: list[tuple[bytes, dict[bytes, bytes] | None]], *,
                     first: bool) -> None:
        """Handle `entries`; unless this is their `first` delivery, ask Redis how
        many times each was delivered (it counts each takeover of a dead consumer's)."""
        fresh = [(i, f) for i, f in entries if i not in self.running and f is not None]
        counts = [1] * len(fresh) if first else await asyncio.gather(
            *(self._times_delivered(i) for i, _ in fresh))
        for (entry_id, fields), delivered in zip(fresh, counts, strict=True):
            assert fields is not None
            self.running[entry_id] = asyncio.ensure_future(
                self._handle(entry_id, fields, delivered))

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
            await asyncio.wait([task], timeout=self.transport.block_seconds)
            raise

    async def _times_delivered(self, entry_id: bytes) -> int:
        pending = await self.transport._redis.xpending_range(self.key, GROUP, entry_id,
                                                             entry_id, 1)
        return int(pending[0]["times_delivered"]) if pending else 1

    async def _after_failure(self, entry_id: bytes, fields: dict[bytes, bytes],
                             deliveries: int, error: Exception) -> None:
        """Send an entry that failed its `deliveries`-th delivery again after the backoff,
        or to the dead-letter stream (R3)."""
        transport, queue, key = self.transport, self.queue, self.key
        now = time.time()
        first_seen = as_float(fields.get(FIRST_SEEN)) or now
        if isinstance(error, MalformedMessage) or transport.policy.exhausted(deliveries):
            body = fields.get(FIELD, repr(fields).encode())
            reason = describe(error)

            async def bury() -> None:
                letter_id = await transport._retrying(lambda: transport._bury(
                    keys=[key, transport.dead_letter_key],
                    args=[GROUP, entry_id, queue, reason, deliveries, repr(first_seen),
                          repr(now), body]), f"dead-lettering a message of {queue}")
                if letter_id is not None:  # else another consumer had settled it
                    log_dead_letter(log, DeadLetter(
                        id=text(letter_id), queue=queue, reason=reason, deliveries=deliveries,
                        first_seen=first_seen, at=now, body=body))

            # finished even if the consumer stops meanwhile: a letter made is logged
            burying = asyncio.ensure_future(bury())
            burying.add_done_callback(_retrieve)
            await asyncio.shield(burying)
            return
        log.debug("handler for %s raised; delivering again", queue, exc_info=True)
        # pending and kept fresh meanwhile, so a crash now loses nothing
        await asyncio.sleep(transport.policy.delay(deliveries))
        await transport._retrying(lambda: transport._retry(
            keys=[key], args=[GROUP, entry_id, fields[FIELD], deliveries, repr(first_seen)]),
            f"delivering again a message of {queue}")

    async def _heartbeat(self, interval: float) -> None:
        """Keep resetting the idle time of entries being handled, so a slow handler
        is not mistaken for a dead consumer and its entries taken over."""
        while True:
            await asyncio.sleep(interval)
            _raise_if_cancelled()
            if self.running:
                claim: list[Any] = list(self.running)
                with contextlib.suppress(*LOST, ResponseError):
                    await self.transport._redis.xclaim(self.key, GROUP, self.name, 0, claim,
                                                       justid=True)

    async def _leave_group(self) -> None:
        """Put back whatever this consumer still holds, then leave the group."""
        transport, key, consumer = self.transport, self.key, self.name
        try:
            pending = await transport._retrying(
                lambda: transport._redis.xpending_range(key, GROUP, "-", "+", 10_000, consumer),
                "leaving the consumer group", patience=1.0)
            ids = [p["message_id"] for p in pending]
            if ids:
                await transport._retrying(
                    lambda: transport._requeue(keys=[key], args=[GROUP, *ids]),
                    "putting back messages", patience=1.0)
            await transport._retrying(
                lambda: transport._leave(keys=[key], args=[GROUP, consumer]),
                "leaving the consumer group", patience=1.0)
        except (TransportError, RedisError) as exc:
            # held entries stay pending and are taken over after the visibility timeout
            log.warning("could not leave the consumer group of %s cleanly: %s", key, exc)


def _entries(reply: Any) -> list[tuple[bytes, dict[bytes, bytes] | None]]:
    """The entries of an XREADGROUP reply on one stream (RESP2 list or RESP3 dict)."""
    if not reply:
        return []
    if isinstance(reply, dict):
        return [e for stream in reply.values() for e in stream[0]]
    return [e for _, stream in reply for e in stream]


def _raise_if_cancelled() -> None:
    """Stop a cancelled task even if a library call swallowed its CancelledError."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


def _retrieve(task: asyncio.Future[Any]) -> None:
    """Mark an abandoned read's outcome as seen (it is recovered another way)."""
    if not task.cancelled():
        task.exception()

