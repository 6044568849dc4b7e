"""Bundles for the RabbitMQ transport: messages to one queue that wait together travel as one.

Each AMQP message costs aio-pika a publish, a confirm, a delivery and an ack,
every one of them several turns of the event loop, and costs the broker a
message to route and persist. Under load hundreds of requests (or replies) for
the same queue are published within one turn of the loop; sent one by one, the
client, not the broker, was the limit (docs/benchmarks.md). So publishes to a
queue that arrive while its previous bundle is being sent gather into the next
one: one persistent message, one confirm, one delivery, one ack. Each caller's
future (`post`) still ends only once the broker confirmed the bundle holding its
message. A message that finds the queue idle goes alone, as a plain message.

Only sasflow's own queues (agent requests, scheduler replies) carry bundles: an
application's status queue gets one plain message per status, readable by any
AMQP client.

On the consuming side a bundle's messages are handled one by one, as if each
had come alone (transport.amqp_consume), and the bundle is acked when all are done.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import msgspec

from sasflow.errors import TransportError

__all__ = ["BUNDLE_TYPE", "Bundler", "decode_bundle", "encode_bundle"]

# The content type that marks a bundle; any other message is one body.
BUNDLE_TYPE = "application/vnd.sasflow.bundle+msgpack"
# A bundle's cap: enough to make the per-message cost vanish, small enough that a
# consumer holding one does not hoard a queue's work from its neighbours.
MAX_BUNDLE_MESSAGES = 128
# Bundles of one queue being sent at once; the rest gather meanwhile.
_IN_FLIGHT = 2

_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder(list[bytes]).decode

# Sends one AMQP message: (queue, body, is_bundle), returning once confirmed.
Send = Callable[[str, bytes, bool], Awaitable[None]]


def encode_bundle(bodies: list[bytes]) -> bytes:
    return _encode(bodies)


def decode_bundle(payload: bytes) -> list[bytes]:
    return _decode(payload)


@dataclass
class _Queue:
    """The publishes waiting for one queue, and how many of its bundles are being sent."""

    waiting: deque[tuple[bytes, asyncio.Future[None]]] = field(default_factory=deque)
    sending: int = 0


class Bundler:
    """Gathers concurrent publishes per queue into bundles (see the module docstring)."""

    def __init__(self, send: Send, *, max_bytes: int,
                 max_messages: int = MAX_BUNDLE_MESSAGES) -> None:
        self._send = send
        self._max_bytes = max_bytes  # a bundle's size stays within the message limit
        self._max_messages = max_messages
        self._queues: dict[str, _Queue] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def post(self, queue: str, body: bytes) -> asyncio.Future[None]:
        """Queue `body` for `queue`'s next bundle: the future ends once the broker
        confirmed it. Cancelled while it still waits, it is not sent."""
        state = self._queues.get(queue)
        if state is None:
            state = self._queues[queue] = _Queue()
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        state.waiting.append((body, future))
        if state.sending < _IN_FLIGHT:
            state.sending += 1
            task = asyncio.create_task(self._drain(queue, state))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return future

    async def close(self) -> None:
        """Stop sending; publishes still waiting fail with TransportError."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for queue, state in self._queues.items():
            for _, future in state.waiting:
                if not future.done():
                    future.set_exception(TransportError(
                        f"the transport closed before a message to {queue} was sent"))
        self._queues.clear()

    async def _drain(self, queue: str, state: _Queue) -> None:
        # Starts on the loop turn after the publish that made it: the publishes of
        # that turn are taken together.
        try:
            while state.waiting:
                batch = self._take(state)
                if batch:
                    await self._send_batch(queue, batch)
        finally:
            state.sending -= 1
            if not state.sending and not state.waiting:
                self._queues.pop(queue, None)

    def _take(self, state: _Queue) -> list[tuple[bytes, asyncio.Future[None]]]:
        """The next bundle's messages, in publishing order, within both caps."""
        batch: list[tuple[bytes, asyncio.Future[None]]] = []
        size = 0
        while state.waiting and len(batch) < self._max_messages:
            body, future = state.waiting[0]
            if future.done():  # its caller was cancelled: not sent
                state.waiting.popleft()
                continue
            # msgpack adds at most 5 bytes a body and 5 for the list
            grown = size + len(body) + 5
            if batch and grown + 5 > self._max_bytes:
                break
            batch.append(state.waiting.popleft())
            size = grown
        return batch

    async def _send_batch(self, queue: str,
                          batch: list[tuple[bytes, asyncio.Future[None]]]) -> None:
        try:
            if len(batch) == 1:
                await self._send(queue, batch[0][0], False)
            else:
                await self._send(queue, encode_bundle([body for body, _ in batch]), True)
        except BaseException as error:
            failure = error if isinstance(error, Exception) else TransportError(
                f"the transport closed while a message to {queue} was being sent")
            for _, future in batch:
                if not future.done():
                    future.set_exception(failure)
            if failure is not error:  # the drain itself was cancelled: stop
                raise
            return
        for _, future in batch:
            if not future.done():
                future.set_result(None)
