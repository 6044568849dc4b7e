"""The transport seam (SPEC S4, E5): named queues between schedulers, agents and
the application.

A queue per agent carries requests; a queue per scheduler instance carries the
replies; an application's own queue carries its status messages. Delivery is at
least once: a consumer acks a message after handling it, and one that dies
before acking has it redelivered. Every implementation passes the contract
suite in tests/contract/.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Protocol

from sasflow.errors import MessageRefused, PayloadError

if TYPE_CHECKING:
    from sasflow.transport.dead_letter import DeadLetter

__all__ = ["DEFAULT_MAX_MESSAGE_BYTES", "Handler", "ImmediateHandler", "Transport", "agent_queue",
           "carries_bundles", "check_reply_to", "refuse_oversized", "reply_queue"]

DEFAULT_MAX_MESSAGE_BYTES = 1024 * 1024

# Called with each message body; the message is acked when it returns, and
# redelivered if it raises or the process dies first: after a backoff, and at
# most the delivery policy's number of times before it becomes a dead letter.
# A handler raises MalformedMessage (dead_letter.py) for a body it cannot
# decode: that message is a dead letter at once (R3).
Handler = Callable[[bytes], Awaitable[None]]


class ImmediateHandler:
    """A handler whose work is done when it returns: it never waits.

    A transport that knows this type may call `now(body)` as each message is
    read, with no task of its own: for a handler this small (a scheduler's
    replies, each setting a future) the task, not the handler, was the cost.
    Awaited, it does the same, so every transport can take it as a Handler.
    """

    __slots__ = ("now",)

    def __init__(self, now: Callable[[bytes], None]) -> None:
        self.now = now

    async def __call__(self, body: bytes) -> None:
        self.now(body)


_AGENT_PREFIX = "sasflow.agent."
_REPLY_PREFIX = "sasflow.reply."


def agent_queue(agent: str) -> str:
    return f"{_AGENT_PREFIX}{agent}"


def reply_queue(instance_id: str) -> str:
    return f"{_REPLY_PREFIX}{instance_id}"


def refuse_oversized(queue: str, body: bytes, limit: int) -> None:
    """MessageRefused if `body` is over a transport's `limit` (no broker takes it later)."""
    if len(body) > limit:
        raise MessageRefused(f"message of {len(body)} bytes to {queue} is over the limit of"
                             f" {limit} bytes")


def check_reply_to(transport: Transport, reply_to: object, task_id: str) -> None:
    """PayloadError unless `reply_to` names a queue `transport` can have: a name the
    broker refuses would leave the task's statuses nowhere to go."""
    if not isinstance(reply_to, str) or not reply_to or not reply_to.isprintable():
        raise PayloadError(f"reply_to must be a queue name, got {reply_to!r}")
    try:
        transport.check_queue(reply_to)
    except MessageRefused as refused:
        raise PayloadError(f"reply_to cannot be a queue here: {refused}",
                           task_id=task_id) from None


def carries_bundles(queue: str) -> bool:
    """Whether `queue` is sasflow's own (requests, replies), so that only sasflow reads it.

    A transport may pack such a queue's messages together; any other queue (an
    application's, for its status messages) gets one plain message per publish.
    """
    return queue.startswith((_AGENT_PREFIX, _REPLY_PREFIX))


class Transport(Protocol):
    """Publish to a named queue; consume one with acks.

    A transport whose confirm may come after the consumer's answer (RabbitMQ's) may
    also offer ``publish_soon(queue, body) -> asyncio.Future[None]``: the publish
    started, the future ending once it is confirmed. A scheduler then waits for a
    request's reply or for that future to fail, whichever comes first (amqp.py).
    """

    # True when queues reach other processes (a broker); False for in-process queues.
    shared: bool
    max_message_bytes: int

    async def publish(self, queue: str, body: bytes) -> None:
        """Send `body` to `queue`; MessageRefused if this transport can never send it
        there (over the size limit, a queue name it cannot have), TransportError if it
        cannot be delivered now."""
        ...

    def check_queue(self, queue: str) -> None:
        """MessageRefused if no message can ever be sent to `queue` here."""
        ...

    async def keep_dead_letter(self, letter: DeadLetter) -> None:
        """Keep `letter` among the dead letters: a message that could not be sent (an
        outbox relay's, refused) is kept where those no consumer could handle are."""
        ...

    async def consume(self, queue: str, handler: Handler, *, prefetch: int) -> None:
        """Deliver `queue`'s messages to `handler`, up to `prefetch` at once, until cancelled."""
        ...

    async def ping(self) -> None:
        """Return if the transport is reachable; TransportError if not (health checks)."""
        ...

    async def dead_letters(self, *, limit: int = 100) -> list[DeadLetter]:
        """The messages no consumer could handle (R3), oldest first."""
        ...

    async def dead_letter(self, letter_id: str) -> DeadLetter | None: ...

    async def purge_dead_letters(self) -> int:
        """Forget every dead letter; how many there were."""
        ...

    async def close(self) -> None: ...
