"""Transports: in-process queues (embedded default); RabbitMQ and Redis with extras."""

from __future__ import annotations

from sasflow.errors import ConfigurationError, MissingExtraError
from sasflow.transport.base import (
    DEFAULT_MAX_MESSAGE_BYTES,
    Handler,
    Transport,
    agent_queue,
    reply_queue,
)

__all__ = ["Handler", "Transport", "agent_queue", "open_transport", "reply_queue"]


def open_transport(url: str | None, *,
                   max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> Transport:
    """The transport a URL names: ``memory`` (default), ``amqp://...``, ``redis://...``."""
    if url in (None, "", "memory", "memory://"):
        from sasflow.transport.memory import MemoryTransport

        return MemoryTransport(max_message_bytes=max_message_bytes)
    if url == "sim":  # sasflow.testing's simulated broker, with no faults injected
        from sasflow.testing.transport import SimTransport

        return SimTransport(max_message_bytes=max_message_bytes)
    if url.startswith(("amqp://", "amqps://")):
        try:
            from sasflow.transport.amqp import AmqpTransport
        except ImportError as error:
            if error.name not in ("aio_pika", "aiormq"):
                raise
            raise MissingExtraError(
                "the RabbitMQ transport needs aio-pika: pip install 'sasflow[rabbitmq]'"
            ) from error
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
        f"unknown transport URL {url!r}: expected memory, amqp://... or redis://...")
