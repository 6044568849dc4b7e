"""A server that stops answering: a store call given up after a bound, as if its
connection had broken.

A PostgreSQL server can stop answering while its connections stay up: a hung host,
a link or a firewall that drops every packet, a failover that left the old address
silent. A statement in flight then waits for as long as TCP keeps resending (about
a quarter of an hour), or for ever while something still acknowledges the packets,
and with it the role that made the call: a scheduler's step, a supervisor's sweep,
a heartbeat.

So every job of the store (`Connections.run`) gets its answers within
`answer_within` seconds (ANSWER_WITHIN_S by default), or its connection is given up
as lost: the socket is shut down under the waiting call, which ends libpq's wait at
once, and the job fails with psycopg.OperationalError, as for a connection that
broke. It is then waited out within `reconnect_for`, and a write whose answer never
came is looked up by its token once the server answers again (bulk.py). The bound
is far above any statement of the store's: a lock wait is 5 s at most
(stalled.py): a call still waiting at it is taken for unanswered.

The socket is shut down rather than the call cancelled: psycopg, cancelled, asks
the server to cancel the statement and waits for that on a new connection (up to 5
s for the request, 5 s for its answer), which a silent server never gives, so the
call took `answer_within` + 10 s to give up. And psycopg's blocking calls have no
bound at all: `AnsweredSync` (the blocking submit's own connection) has a watchdog
thread do the same to them. The store's other asynchronous connections (its
listeners, a client's reads from other loops) use `Answered` as the jobs do.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import threading
import time
from types import TracebackType
from typing import Any

import psycopg

__all__ = ["ANSWER_WITHIN_S", "Answered", "AnsweredSync"]

ANSWER_WITHIN_S = 30.0


class Answered:
    """`conn`'s socket shut down if what runs inside has not had its answers within
    `seconds`, which then fails as a lost connection (a class, not a generator: it
    wraps every job, and costs half as much so)."""

    __slots__ = ("_conn", "_fired", "_seconds", "_timer")

    def __init__(self, conn: psycopg.AsyncConnection[Any], seconds: float) -> None:
        self._conn = conn
        self._seconds = seconds
        self._fired = False

    async def __aenter__(self) -> None:
        self._timer = asyncio.get_running_loop().call_later(self._seconds, self._give_up)

    def _give_up(self) -> None:
        self._fired = True
        with contextlib.suppress(psycopg.Error):  # closed already: nothing waits on it
            _shut_down(self._conn.fileno())

    async def __aexit__(self, kind: type[BaseException] | None, error: BaseException | None,
                        trace: TracebackType | None) -> None:
        self._timer.cancel()
        if not self._fired:
            return
        await self._conn.close()  # no use to anyone now
        if isinstance(error, psycopg.OperationalError):
            raise psycopg.OperationalError(
                f"no answer from the database within {self._seconds:g}s") from error


class AnsweredSync:
    """What runs inside, on the synchronous `conn`, gets its answers within `seconds`,
    or fails with psycopg.OperationalError as for a connection that broke."""

    __slots__ = ("_fd", "_seconds", "_watch")

    def __init__(self, conn: psycopg.Connection[Any], seconds: float) -> None:
        self._fd = conn.fileno()
        self._seconds = seconds

    def __enter__(self) -> None:
        self._watch = _WATCHDOG.arm(self._fd, self._seconds)

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        _WATCHDOG.disarm(self._watch)
        if isinstance(error, psycopg.OperationalError) and self._watch.fired:
            raise psycopg.OperationalError(
                f"no answer from the database within {self._seconds:g}s") from error


class _Watch:
    __slots__ = ("deadline", "fd", "fired")

    def __init__(self, fd: int, deadline: float) -> None:
        self.fd = fd
        self.deadline = deadline
        self.fired = False


class _Watchdog:
    """One thread for the process, started with the first watch: it looks over the
    watches every quarter of the shortest bound it has been given, and shuts down the
    socket of each one past its deadline. Arming and disarming take no more than a
    lock: a watch costs its call 2.5 µs (docs/benchmarks.md)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._watches: set[_Watch] = set()
        self._look_every = float("inf")
        self._woken = threading.Event()
        self._thread: threading.Thread | None = None

    def arm(self, fd: int, seconds: float) -> _Watch:
        watch = _Watch(fd, time.monotonic() + seconds)
        with self._lock:
            self._watches.add(watch)
            if seconds / 4 < self._look_every:
                self._look_every = seconds / 4
                self._woken.set()  # look sooner than it meant to
            if self._thread is None:
                self._thread = threading.Thread(target=self._look, daemon=True,
                                                name="sasflow-pg-watchdog")
                self._thread.start()
        return watch

    def disarm(self, watch: _Watch) -> None:
        with self._lock:
            self._watches.discard(watch)

    def _look(self) -> None:
        while True:
            self._woken.wait(self._look_every)
            self._woken.clear()
            now = time.monotonic()
            with self._lock:  # under it, a watch disarmed is never fired after
                for watch in [w for w in self._watches if w.deadline <= now]:
                    self._watches.discard(watch)
                    watch.fired = True
                    _shut_down(watch.fd)


def _shut_down(fd: int) -> None:
    """End every wait on the socket `fd`, its owner's included (a duplicate of it is
    shut down: the socket is one), and leave closing it to its owner."""
    with contextlib.suppress(OSError), socket.socket(fileno=os.dup(fd)) as duplicate:
        duplicate.shutdown(socket.SHUT_RDWR)


_WATCHDOG = _Watchdog()
