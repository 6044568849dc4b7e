"""An application's status queue (E11), read as a stream: `App.alisten` and
`App.listen` (its blocking twin)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import warnings
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from typing import Protocol

from sasflow.background_loop import BackgroundLoop
from sasflow.messages import Status, decode_status
from sasflow.outbox import OutboxWatch
from sasflow.store.interfaces import DeadLetterStore, RelayStore
from sasflow.transport.base import Transport
from sasflow.transport.dead_letter import (
    MalformedMessage,
    decoded,
    letter_for,
    log_dead_letter,
)

__all__ = ["Listening", "statuses"]

log = logging.getLogger("sasflow.app")

_BATCH = 256  # status messages taken at once


class _StatusStore(RelayStore, DeadLetterStore, Protocol):
    """What a status stream reads the outbox with, a message it cannot read going to
    the dead letters."""


async def statuses(store: _StatusStore, transport: Transport, queue: str
                   ) -> AsyncGenerator[Status, None]:
    """Status messages of the tasks submitted with ``reply_to=queue``, as they come."""
    if transport.shared:
        inbox: asyncio.Queue[Status] = asyncio.Queue()

        async def put(body: bytes) -> None:
            # decoded here: a body that is no status is the transport's dead letter (R3)
            await inbox.put(decoded(decode_status, body, "status message"))

        consumer = asyncio.create_task(transport.consume(queue, put, prefetch=256))
        try:
            while True:
                yield await inbox.get()
        finally:
            consumer.cancel()
            # its connection is closed by the time the listener goes on
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await consumer
    # in-process queues cannot cross processes: read this queue's outbox directly,
    # when a commit wrote status messages (outbox.py)
    async with OutboxWatch(store) as outbox:
        while True:
            messages = await store.take_outbox([queue], _BATCH)
            for message in messages:
                try:
                    status = decoded(decode_status, message.body, "status message")
                except MalformedMessage as error:  # kept aside once, as a transport would
                    letter = letter_for(queue, message.body, error)
                    await store.add_dead_letter(letter)
                    log_dead_letter(log, letter)
                    continue
                yield status
            await store.ack_outbox([m.id for m in messages])
            if len(messages) < _BATCH:
                await outbox.written()


class Listening:
    """`App.listen(queue)`: a blocking iterator of statuses (`for status in ...`),
    read on the app's background loop; `close()` (or a `with` block) stops it.

    Iterating it with `async for` is the old, async form of `listen`: it still
    works, with a DeprecationWarning pointing to `alisten`.
    """

    def __init__(self, stream: AsyncGenerator[Status, None], loop: BackgroundLoop) -> None:
        self._stream = stream
        self._loop = loop

    def __iter__(self) -> Iterator[Status]:
        return self

    def __next__(self) -> Status:
        try:
            return self._loop.call(self._stream.__anext__())
        except StopAsyncIteration:
            raise StopIteration from None

    def close(self) -> None:
        self._loop.call(self._stream.aclose())

    def __enter__(self) -> Listening:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # the deprecated async form: the generator itself, on the caller's loop
    def __aiter__(self) -> AsyncIterator[Status]:
        warnings.warn("`async for ... in app.listen(queue)` is deprecated:"
                      " use `app.alisten(queue)`", DeprecationWarning, stacklevel=2)
        return self._stream

    async def aclose(self) -> None:
        await self._stream.aclose()

    async def __anext__(self) -> Status:  # stepping it by hand
        return await self._stream.__anext__()
