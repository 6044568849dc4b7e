"""Auto-pipelining for the Redis transport: many concurrent commands, one round trip.

Callers submit a command and await its own reply. Commands waiting when a flush
starts are written to one pooled connection together and their replies read
back in order, so hundreds of concurrent publishes cost a handful of round trips
and at most ``max_in_flight`` connections, instead of one connection each (which
exhausts any bounded pool). While a flush is in flight, new commands gather for
the next one.

Acks of the same stream waiting together share one ``XACK`` and one ``XDEL``
naming all their ids. The two are not atomic: an entry acked but not yet
deleted is no longer pending, so it is never redelivered, and a retried ack is
harmless (``XACK`` of an acked id does nothing).

A connection lost during a flush gives every caller whose reply was not read a
fresh ``redis.exceptions.ConnectionError``: its command may or may not have run,
so the caller retries (at least once delivery) and never sees a silent success.
A reply that was read is delivered even if a later one is lost.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import Any

from redis.asyncio.connection import ConnectionPool
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

__all__ = ["AutoPipeline", "PipelineStats"]

_LOST = (RedisConnectionError, RedisTimeoutError, OSError)


@dataclass
class PipelineStats:
    """Counters of one AutoPipeline (observability and tests)."""

    flushes: int = 0
    commands: int = 0
    lost_flushes: int = 0  # flushes whose connection was lost with replies unread


class _Op:
    """One caller's request: the commands it needs and the future it awaits."""

    __slots__ = ("first", "future", "last")

    def __init__(self, future: asyncio.Future[Any]) -> None:
        self.future = future
        self.first = self.last = 0  # its commands are replies[first:last]


class AutoPipeline:
    """Send concurrent XADDs and acks in shared pipelines (see the module docstring)."""

    def __init__(self, pool: ConnectionPool, *, max_in_flight: int = 2) -> None:
        self._pool = pool
        self._max_in_flight = max_in_flight
        self._adds: list[tuple[tuple[Any, ...], _Op]] = []
        self._acks: dict[tuple[str, str], list[tuple[bytes, _Op]]] = {}
        self._in_flight = 0
        self._starting = False  # a flush was started and has not yet taken its batch
        self._tasks: set[asyncio.Task[None]] = set()
        self.stats = PipelineStats()

    def xadd(self, key: str, field: bytes, body: bytes,
             maxlen: int | None) -> asyncio.Future[Any]:
        """XADD `key` * `field` `body` (capped approximately at `maxlen`); its reply: the id."""
        cap: tuple[Any, ...] = () if maxlen is None else ("MAXLEN", "~", maxlen)
        op = self._op()
        self._adds.append((("XADD", key, *cap, "*", field, body), op))
        self._kick()
        return op.future

    def ack(self, key: str, group: str, entry_id: bytes) -> asyncio.Future[Any]:
        """XACK then XDEL `entry_id` of `key` (shared with other acks of `key` waiting)."""
        op = self._op()
        self._acks.setdefault((key, group), []).append((entry_id, op))
        self._kick()
        return op.future

    async def drain(self) -> None:
        """Wait until everything submitted so far has been flushed."""
        while self._tasks:
            await asyncio.wait(list(self._tasks))

    def _op(self) -> _Op:
        return _Op(asyncio.get_running_loop().create_future())

    def _kick(self) -> None:
        if (self._starting or self._in_flight >= self._max_in_flight
                or not (self._adds or self._acks)):
            return
        self._starting = True
        self._in_flight += 1
        task = asyncio.get_running_loop().create_task(self._flush())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _flush(self) -> None:
        # Runs from the loop iteration after it was started: everything submitted
        # meanwhile is taken together.
        self._starting = False
        adds, self._adds = self._adds, []
        acks, self._acks = self._acks, {}
        try:
            commands: list[tuple[Any, ...]] = []
            ops: list[_Op] = []
            for command, op in adds:
                if not op.future.done():  # a cancelled caller's command is not sent
                    op.first, op.last = len(commands), len(commands) + 1
                    commands.append(command)
                    ops.append(op)
            for (key, group), waiting in acks.items():
                live = [(i, op) for i, op in waiting if not op.future.done()]
                if not live:
                    continue
                ids = [i for i, _ in live]
                first = len(commands)
                commands.append(("XACK", key, group, *ids))
                commands.append(("XDEL", key, *ids))
                for _, op in live:
                    op.first, op.last = first, first + 2
                    ops.append(op)
            if commands:
                await self._send(commands, ops)
        finally:
            self._in_flight -= 1
            self._kick()

    async def _send(self, commands: list[tuple[Any, ...]], ops: list[_Op]) -> None:
        self.stats.flushes += 1
        self.stats.commands += len(commands)
        replies: list[Any] = []
        failure: BaseException | None = None
        try:
            connection = await self._pool.get_connection()  # type: ignore[no-untyped-call]  # redis-py leaves it unannotated
            try:
                await connection.send_packed_command(connection.pack_commands(commands))
                for _ in commands:
                    try:
                        replies.append(await connection.read_response())
                    except ResponseError as error:
                        replies.append(error)
            except BaseException:
                # replies left unread would be handed to the next user of the connection
                with contextlib.suppress(Exception):
                    await connection.disconnect()
                raise
            finally:
                await self._pool.release(connection)
        except BaseException as error:  # handed to every waiting caller
            failure = error
            if len(replies) < len(commands):
                self.stats.lost_flushes += 1
        for op in ops:
            if op.future.done():
                continue
            if op.last <= len(replies):
                errors = [r for r in replies[op.first:op.last] if isinstance(r, Exception)]
                if errors:
                    op.future.set_exception(errors[0])
                else:
                    op.future.set_result(replies[op.last - 1])
            else:
                op.future.set_exception(_lost(failure, len(commands)))
        if isinstance(failure, (asyncio.CancelledError, KeyboardInterrupt, SystemExit)):
            raise failure


def _lost(failure: BaseException | None, count: int) -> BaseException:
    """The error a caller gets when its reply was never read (a fresh one per caller)."""
    if failure is None or isinstance(failure, (*_LOST, asyncio.CancelledError)):
        error = RedisConnectionError(
            f"connection lost with a pipeline of {count} commands in flight: {failure}")
        error.__cause__ = failure
        return error
    return failure
