"""In-process queues: the embedded default transport (no broker to run).

Queues live in this process only, so a request reaches an agent of the same
process; that is what the embedded mode wants (each worker process runs its own
scheduler and agents over the shared SQLite store). A handler that raises has
its message put back, as a broker would redeliver it.
"""

from __future__ import annotations

import asyncio
import contextlib

from sasflow.errors import TransportError
from sasflow.transport.base import DEFAULT_MAX_MESSAGE_BYTES, Handler

__all__ = ["MemoryTransport"]


class MemoryTransport:
    shared = False

    def __init__(self, *, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> None:
        self.max_message_bytes = max_message_bytes
        self._queues: dict[str, asyncio.Queue[bytes]] = {}
        self._consumed: dict[str, int] = {}

    def _queue(self, name: str) -> asyncio.Queue[bytes]:
        q = self._queues.get(name)
        if q is None:
            q = self._queues[name] = asyncio.Queue()
        return q

    async def publish(self, queue: str, body: bytes) -> None:
        if len(body) > self.max_message_bytes:
            raise TransportError(
                f"message of {len(body)} bytes to {queue} is over the limit of"
                f" {self.max_message_bytes} bytes")
        self._queue(queue).put_nowait(body)

    async def consume(self, queue: str, handler: Handler, *, prefetch: int) -> None:
        q = self._queue(queue)
        slots = asyncio.Semaphore(max(1, prefetch))
        running: set[asyncio.Task[None]] = set()
        self._consumed[queue] = self._consumed.get(queue, 0) + 1

        async def handle(body: bytes) -> None:
            try:
                await handler(body)
            except asyncio.CancelledError:
                q.put_nowait(body)  # not acked: redeliver
                raise
            except Exception:
                q.put_nowait(body)
            finally:
                slots.release()

        try:
            while True:
                await slots.acquire()
                body = await q.get()
                task = asyncio.ensure_future(handle(body))
                running.add(task)
                task.add_done_callback(running.discard)
        finally:
            self._consumed[queue] -= 1
            for task in list(running):
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.gather(*running, return_exceptions=True)

    async def ping(self) -> None:
        """In-process queues are always there."""

    def has_consumer(self, queue: str) -> bool:
        return self._consumed.get(queue, 0) > 0

    async def close(self) -> None:
        self._queues.clear()
