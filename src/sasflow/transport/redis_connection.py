"""The Redis Streams transport's connections: the pools, and a lost one waited out.

Under load (a scheduler driving hundreds of tasks at once) ``publish`` and the
acks are called concurrently hundreds of times; they are auto-pipelined
(redis_batch.py) over a ``BlockingConnectionPool``: bounded
(``max_connections``, default 16), it waits for a free connection (up to 10 s,
then the connection counts as lost) instead of failing at once, so no burst can
exhaust it. Each blocking ``XREADGROUP`` reader holds a connection of its own,
from a separate pool, so a reader never waits for, nor starves, the commands.

redis-py retries nothing here: a lost connection is retried by `retrying`, with
capped, jittered backoff, for as long as a restarted Redis takes to come back,
so that it is seen and the entries it may have delivered are recovered.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from sasflow.errors import TransportError

__all__ = ["LOST", "MAX_CONNECTIONS", "PATIENCE", "POOL_TIMEOUT", "backoff", "open_pools",
           "retrying"]

log = logging.getLogger("sasflow.transport.redis")

LOST = (RedisConnectionError, RedisTimeoutError, OSError)
_T = TypeVar("_T")
MAX_CONNECTIONS = 16  # per transport; publishes and acks, pipelined, use two of them at most
POOL_TIMEOUT = 10.0  # seconds waiting for a free pooled connection before it counts as lost
# How long a publish or an ack keeps retrying a lost connection (as RabbitMQ's publish).
PATIENCE = 15.0


def open_pools(redis_url: str, block_seconds: float
               ) -> tuple[aioredis.BlockingConnectionPool, aioredis.ConnectionPool]:
    """The pool the commands share, and the pool the blocking readers take theirs from."""
    # No retries inside redis-py: this module retries itself, so that a lost
    # connection is seen and the entries it may have delivered are recovered.
    settings: dict[str, Any] = dict(
        retry=Retry(NoBackoff(), 0), socket_connect_timeout=5.0,
        # bounds every read, so a half-dead connection is noticed and replaced
        socket_timeout=block_seconds + 10.0)
    pool = aioredis.BlockingConnectionPool.from_url(
        redis_url, max_connections=MAX_CONNECTIONS, timeout=POOL_TIMEOUT, **settings)
    # one connection per consumer, held while it lives: bounded by the consumers
    readers = aioredis.ConnectionPool(
        connection_class=pool.connection_class, max_connections=2**31,
        **pool.connection_kwargs)
    return pool, readers


async def retrying(op: Callable[[], Awaitable[_T]], what: str,
                   patience: float = PATIENCE) -> _T:
    """Run `op`, retrying a lost connection with capped, jittered backoff for up to
    `patience` seconds (a restarted Redis is back within it), quietly: the
    consumers' Outage says the connection is lost, once."""
    give_up = time.monotonic() + patience
    for attempt in itertools.count(1):
        try:
            return await op()
        except LOST as exc:
            pause = backoff(attempt)
            if time.monotonic() + pause > give_up:
                raise TransportError(f"redis unreachable while {what}: {exc}") from exc
            log.debug("redis unreachable while %s (%s); retrying", what, exc)
            await asyncio.sleep(pause)
    raise AssertionError("unreachable")


def backoff(attempt: int) -> float:
    return min(2.0, 0.05 * 2.0 ** (attempt - 1)) * (0.5 + random.random() / 2)
