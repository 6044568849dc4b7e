"""Transports: in-process queues (embedded default); RabbitMQ and Redis with extras."""

from __future__ import annotations

from sasflow.errors import ConfigurationError, MissingExtraError
from sasflow.redact import guard_loggers, redact
from sasflow.transport.base import (
    DEFAULT_MAX_MESSAGE_BYTES,
    Handler,
    ImmediateHandler,
    Transport,
    agent_queue,
    reply_queue,
)
from sasflow.transport.dead_letter import BoxOpener, DeadLetter, MalformedMessage, split_policy

__all__ = ["DeadLetter", "Handler", "ImmediateHandler", "MalformedMessage", "Transport",
           "agent_queue", "is_in_process", "open_transport", "reply_queue"]


def is_in_process(url: str | None) -> bool:
    """Whether `url` names the in-process transport (the default)."""
    return (url or "").partition("?")[0] in ("", "memory", "memory://")


def open_transport(url: str | None, *,
                   max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
                   dead_letter_box: BoxOpener | None = None) -> Transport:
    """The transport a URL names: ``memory`` (default), ``amqp://...``, ``redis://...``.

    Every URL may set the delivery policy (R3): ``?max_deliveries=N`` (default 5)
    and ``?redelivery_backoff=SECONDS`` (default 0.2, doubling per delivery).
    `dead_letter_box` opens where the in-process transport keeps its dead
    letters (the store); a broker keeps its own.
    """
    if is_in_process(url):
        from sasflow.transport.memory import MemoryTransport

        policy, rest = split_policy((url or "").partition("?")[2])
        if rest:
            raise ConfigurationError(
                f"unknown option(s) of the in-process transport: {', '.join(k for k, _ in rest)}")
        return MemoryTransport(max_message_bytes=max_message_bytes, policy=policy,
                               dead_letter_box=dead_letter_box)
    assert url is not None
    if url.partition("?")[0] == "sim":  # sasflow.testing's simulated broker, faults off
        from sasflow.testing.transport import SimTransport

        policy, rest = split_policy(url.partition("?")[2])
        if rest:
            raise ConfigurationError(
                f"unknown option(s) of the simulated transport: {', '.join(k for k, _ in rest)}")
        return SimTransport(max_message_bytes=max_message_bytes, policy=policy)
    if url.startswith(("amqp://", "amqps://")):
        try:
            from sasflow.transport.amqp import AmqpTransport
        except ImportError as error:
            if error.name not in ("aio_pika", "aiormq"):
                raise
            raise MissingExtraError(
                "the RabbitMQ transport needs aio-pika: pip install 'sasflow[rabbitmq]'"
            ) from error
        # aio-pika's connection warnings print the URL, query string and all (R5)
        guard_loggers("aio_pika", "aiormq")
        return AmqpTransport(url, max_message_bytes=max_message_bytes)
    if url.startswith(("redis://", "rediss://")):
        try:
            from sasflow.transport.redis import RedisTransport
        except ImportError as error:
            if error.name is None or not error.name.startswith("redis"):
                raise
            raise MissingExtraError(
                "the Redis transport needs redis-py: pip install 'sasflow[redis]'"
            ) from error
        return RedisTransport(url, max_message_bytes=max_message_bytes)
    raise ConfigurationError(
        f"unknown transport URL {redact(url)!r}: expected memory, amqp://... or redis://...")
