"""Dead letters (SPEC R3, U7): where a message goes once no consumer can handle it.

Every transport counts the deliveries of each message. A handler that raises
has its message delivered again, after a backoff that doubles each time, so a
message that keeps failing never spins a consumer hot; once it has been
delivered ``max_deliveries`` times it is taken off its queue and kept as a
``DeadLetter`` with the error's text, and one line is logged. A handler that
raises ``MalformedMessage`` (a body that cannot even be decoded) has its
message dead-lettered at once: delivering it again cannot help.

Where dead letters are kept depends on the transport: a RabbitMQ queue, a
Redis stream, or, for in-process queues that die with their process, the state
store (the ``DeadLetterBox`` the application hands the in-process transport).
``sasflow dead-letters`` reads them from there.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Protocol, TypeVar
from urllib.parse import parse_qsl

import msgspec

from sasflow.errors import ConfigurationError, PayloadError

__all__ = ["DEFAULT_POLICY", "DeadLetter", "DeadLetterBox", "DeadLetterReader", "DeliveryPolicy",
           "ListBox", "MalformedMessage", "decoded", "describe", "letter_for",
           "log_dead_letter", "new_letter_id", "on_dead_letter", "policy_from_query"]

log = logging.getLogger("sasflow.transport.dead_letter")

_T = TypeVar("_T")

# Characters of a body kept in the log line and in `dead-letters list`.
PREVIEW_CHARS = 120


class MalformedMessage(PayloadError):
    """Raised by a handler for a body it cannot decode: the message is dead-lettered
    at once, since delivering it again cannot make it readable (R3, U7)."""


class DeadLetter(msgspec.Struct, kw_only=True):
    """A message taken off its queue because no consumer could handle it."""

    id: str
    queue: str  # the queue it was taken from
    reason: str  # the error of its last delivery
    deliveries: int  # how many times it was delivered
    first_seen: float  # when its first failed delivery happened (seconds since the epoch)
    at: float  # when it was dead-lettered
    body: bytes


@dataclass(frozen=True)
class DeliveryPolicy:
    """How often a failing message is delivered, and how long apart (R3)."""

    max_deliveries: int = 5
    backoff: float = 0.2  # seconds before the second delivery; doubles after each
    max_backoff: float = 5.0

    def __post_init__(self) -> None:
        if self.max_deliveries < 1:
            raise ConfigurationError(
                f"max_deliveries must be at least 1, got {self.max_deliveries}")
        if not 0 <= self.backoff <= self.max_backoff:
            raise ConfigurationError(
                f"redelivery backoff must be between 0 and {self.max_backoff}s,"
                f" got {self.backoff}")

    def exhausted(self, deliveries: int) -> bool:
        """Whether a message delivered `deliveries` times, failing each time, is done with."""
        return deliveries >= self.max_deliveries

    def delay(self, deliveries: int) -> float:
        """Seconds to wait before delivering again a message that failed `deliveries` times."""
        return min(self.max_backoff, self.backoff * 2.0 ** max(0, deliveries - 1))


DEFAULT_POLICY = DeliveryPolicy()

# The transport URL's query options that set the policy.
POLICY_OPTIONS = ("max_deliveries", "redelivery_backoff")


def policy_from_query(options: dict[str, str]) -> DeliveryPolicy:
    """The policy named by a transport URL's ``max_deliveries`` and ``redelivery_backoff``."""
    try:
        max_deliveries = int(options.get("max_deliveries", DEFAULT_POLICY.max_deliveries))
        backoff = float(options.get("redelivery_backoff", DEFAULT_POLICY.backoff))
    except ValueError as error:
        raise ConfigurationError(f"bad delivery option in the transport URL: {error}") from None
    return DeliveryPolicy(max_deliveries=max_deliveries, backoff=backoff)


def split_policy(query: str) -> tuple[DeliveryPolicy, list[tuple[str, str]]]:
    """The delivery policy a URL query sets, and the query's other parameters."""
    pairs = parse_qsl(query, keep_blank_values=True)
    ours = {k: v for k, v in pairs if k in POLICY_OPTIONS}
    return policy_from_query(ours), [(k, v) for k, v in pairs if k not in POLICY_OPTIONS]


def new_letter_id() -> str:
    """A unique id that sorts by time (milliseconds in hex, then random)."""
    return f"{time.time_ns() // 1_000_000:012x}{secrets.token_hex(4)}"


def letter_for(queue: str, body: bytes, error: BaseException, *, deliveries: int = 1,
               first_seen: float = 0.0) -> DeadLetter:
    """The dead letter of `body`, taken from `queue` now because of `error`."""
    now = time.time()
    return DeadLetter(id=new_letter_id(), queue=queue, reason=describe(error),
                      deliveries=deliveries, first_seen=first_seen or now, at=now, body=body)


def describe(error: BaseException) -> str:
    """The reason a dead letter records: the error's type and text, on one line."""
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def preview(body: bytes, limit: int = PREVIEW_CHARS) -> str:
    text = body.decode("utf-8", errors="replace")
    text = text.encode("unicode_escape").decode("ascii")  # one line, whatever it holds
    return text if len(text) <= limit else text[:limit] + "..."


# Who hears of the dead letters made in this context: a worker with metrics on sets it
# around its roles (metrics.py), so the consumers each transport starts there count
# theirs without being handed anything.
on_dead_letter: ContextVar[Callable[[DeadLetter], None] | None] = ContextVar(
    "sasflow_on_dead_letter", default=None)


def log_dead_letter(logger: logging.Logger, letter: DeadLetter) -> None:
    """The one line logged for a dead letter (R3: logged once, not once per delivery),
    and `on_dead_letter` told of it: every transport calls this once per dead letter."""
    logger.error("dead-lettered message %s of %s after %d deliver%s: %s (body: %s)",
                 letter.id, letter.queue, letter.deliveries,
                 "y" if letter.deliveries == 1 else "ies", letter.reason, preview(letter.body))
    hear = on_dead_letter.get()
    if hear is not None:
        hear(letter)


class DeadLetterReader(Protocol):
    """Where dead letters are read back (`sasflow dead-letters`): a transport or a store."""

    async def dead_letters(self, *, limit: int = 100) -> list[DeadLetter]:
        """The oldest `limit` dead letters, oldest first."""
        ...

    async def dead_letter(self, letter_id: str) -> DeadLetter | None: ...

    async def purge_dead_letters(self) -> int:
        """Forget every dead letter; how many there were."""
        ...


class DeadLetterBox(DeadLetterReader, Protocol):
    """Where dead letters are kept (the store, for the in-process transport)."""

    async def add_dead_letter(self, letter: DeadLetter) -> None: ...


class ListBox:
    """Dead letters kept in this process's memory (the in-process transport on its own)."""

    def __init__(self) -> None:
        self.letters: list[DeadLetter] = []

    async def add_dead_letter(self, letter: DeadLetter) -> None:
        self.letters.append(letter)

    async def dead_letters(self, *, limit: int = 100) -> list[DeadLetter]:
        return self.letters[:limit]

    async def dead_letter(self, letter_id: str) -> DeadLetter | None:
        return next((letter for letter in self.letters if letter.id == letter_id), None)

    async def purge_dead_letters(self) -> int:
        count = len(self.letters)
        self.letters.clear()
        return count


# Opens the box the in-process transport keeps its dead letters in (the store),
# on the first dead letter, so that a transport never opens a store it does not need.
BoxOpener = Callable[[], DeadLetterBox]


def decoded(decode: Callable[[bytes], _T], body: bytes, what: str) -> _T:
    """`decode(body)`, or MalformedMessage naming `what` was expected (every consumer
    decodes through this, so no body can make a handler raise anything else)."""
    try:
        return decode(body)
    except (msgspec.DecodeError, UnicodeDecodeError) as error:
        raise MalformedMessage(f"not a {what}: {error}") from None
