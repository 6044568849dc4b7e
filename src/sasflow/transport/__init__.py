"""Transports: in-process queues (embedded default); RabbitMQ and Redis with extras."""

from __future__ import annotations

from sasflow.errors import ConfigurationError
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
    if url.startswith(("amqp://", "amqps://", "redis://", "rediss://")):
        raise ConfigurationError(f"the transport {url.split(':')[0]} is not available yet")
    raise ConfigurationError(
        f"unknown transport URL {url!r}: expected memory, amqp://... or redis://...")
