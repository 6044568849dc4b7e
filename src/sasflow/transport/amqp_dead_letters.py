"""The RabbitMQ transport's dead letters (R3): how they are kept, counted and read.

A message whose handler failed is published again carrying its count of failed
deliveries in a header of ours, and at the delivery policy's bound goes to the
fanout exchange ``sasflow.dead-letters`` (URL option ``dead_letters=NAME``) with
its queue, reason and times in headers, on to the durable queue of that name
bound to it. docs/architecture.md says why the count is ours rather than the
broker's: the broker's own dead-lettering needs queue arguments that existing
queues cannot be given. Reading them (``sasflow dead-letters list|show``) takes
the queue's messages unacked and hands them back in order, so it changes
nothing.
"""

from __future__ import annotations

from collections.abc import Callable

from aio_pika.abc import AbstractChannel, AbstractIncomingMessage
from pamqp.commands import Basic

from sasflow.transport.amqp_connection import PERSISTENT
from sasflow.transport.dead_letter import DeadLetter

__all__ = ["DEAD_LETTERS", "DELIVERIES", "FIRST_SEEN", "dead_letter_properties", "number",
           "peek", "purge"]

DEAD_LETTERS = "sasflow.dead-letters"
# Headers: failed deliveries so far and the first one's time (republished copies);
# a dead letter's queue, reason and when it was dead-lettered.
DELIVERIES = "x-sasflow-deliveries"
FIRST_SEEN = "x-sasflow-first-seen"
_QUEUE = "x-sasflow-queue"
_REASON = "x-sasflow-reason"
_DEAD_AT = "x-sasflow-dead-at"
# How long `peek` waits for each message of the dead-letter queue.
_PEEK_TIMEOUT = 5.0


async def peek(channel: AbstractChannel, name: str,
               enough: Callable[[list[DeadLetter]], bool]) -> list[DeadLetter]:
    """The dead-letter queue's messages from its head until `enough`, left in place:
    taken unacked and handed back, in order, when the channel closes."""
    letters: list[DeadLetter] = []
    queue = await channel.get_queue(name)
    while not letters or not enough(letters):
        message = await queue.get(no_ack=False, fail=False, timeout=_PEEK_TIMEOUT)
        if message is None:
            break
        letters.append(_letter_from(message))
    return letters


async def purge(channel: AbstractChannel, name: str) -> int:
    """Forget the dead letters; how many there were."""
    queue = await channel.get_queue(name)
    purged = await queue.purge()
    return int(purged.message_count or 0)


def number(value: object) -> int | float:
    """A numeric header's value; 0 when absent or not a number (a foreign message)."""
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else 0


def dead_letter_properties(letter: DeadLetter) -> Basic.Properties:
    """What a dead letter's message carries beside its body: where it came from and why."""
    return Basic.Properties(
        delivery_mode=PERSISTENT, message_id=letter.id,
        headers={_QUEUE: letter.queue, _REASON: letter.reason, DELIVERIES: letter.deliveries,
                 FIRST_SEEN: letter.first_seen, _DEAD_AT: letter.at})


def _letter_from(message: AbstractIncomingMessage) -> DeadLetter:
    """A dead letter as the dead-letter queue holds it (or any message an operator's
    policy routed there: what it lacks is left empty)."""
    headers = message.headers or {}
    at = float(number(headers.get(_DEAD_AT)))
    return DeadLetter(id=message.message_id or f"tag-{message.delivery_tag}",
                      queue=str(headers.get(_QUEUE) or message.routing_key or ""),
                      reason=str(headers.get(_REASON) or "(dead-lettered by the broker)"),
                      deliveries=int(number(headers.get(DELIVERIES))),
                      first_seen=float(number(headers.get(FIRST_SEEN))) or at,
                      at=at, body=message.body)
