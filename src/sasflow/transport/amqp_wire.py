"""The RabbitMQ transport's own connections: pamqp's frames over an `asyncio.Protocol`.

A single task's path crosses the broker one message at a time, each waited for,
so each message pays its client's whole machinery. aiormq passes every frame
through asyncio queues, stream reads, locks and futures: a confirmed publish cost
155 µs of CPU and a hop 319, where this layer's floor is 78 and 137
(bench/amqp_client_floor.py). Here a frame is handled by one call from
`data_received`, and a message goes out as one write.

This module is the connection both uses share; a connection carries one channel,
which is a publisher's (amqp_wire_publish.py) or one consumer's
(amqp_wire_consume.py). What it does, and no more:

- the handshake (PLAIN credentials from the URL, its vhost), over TLS for an
  ``amqps://`` URL, with aio-pika's URL options for it (`ssl_context`);
- heartbeats at the interval the broker proposes, or the URL's ``heartbeat``: a
  broker silent for two intervals is taken for gone;
- the channel's synchronous methods (`Wire.call`), answered in order;
- a connection lost or closed by the broker, or a channel the broker closed,
  ends the connection (`Wire.ended`) and fails whatever waited on it with a
  ConnectionError: the user opens a new one. A channel closed for what the
  broker refuses of a queue (not permitted, missing, declared otherwise) fails
  the call with `ChannelRefused`, which no retry helps.

Declaring the dead letters and the operator's verbs stay with aio-pika
(amqp.py): they are not on the path.
"""

from __future__ import annotations

import asyncio
import collections
import ssl
from collections.abc import Callable
from typing import Any, TypeVar, cast
from urllib.parse import parse_qs, unquote, urlsplit

from pamqp import frame as pamqp_frame
from pamqp import header as pamqp_header
from pamqp import heartbeat as pamqp_heartbeat
from pamqp.commands import Channel, Connection

from sasflow.errors import ConfigurationError

__all__ = ["CHANNEL", "FRAME_OVERHEAD", "ChannelRefused", "Wire", "WireAddress", "open_wire"]

CHANNEL = 1  # the one channel of a connection
FRAME_OVERHEAD = 8  # a frame's type, channel and size before its payload, its end after
_HEARTBEAT = pamqp_frame.marshal(pamqp_heartbeat.Heartbeat(), 0)
# How long a closing connection waits for the broker's goodbye and its socket's end.
_GOODBYE = 1.0
# What the broker closes a channel with for a queue itself: not permitted, not found,
# declared with other arguments. The same on every retry.
_REFUSAL_CODES = frozenset({403, 404, 406})

W = TypeVar("W", bound="Wire")
Answer = TypeVar("Answer")


class ChannelRefused(Exception):
    """The broker closed the channel on a method for what it refuses of a queue."""

    def __init__(self, code: int, text: str) -> None:
        super().__init__(f"{code} {text}")
        self.code = code


class WireAddress:
    """Where and how to connect, read from the transport's URL once."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        options = {key: values[-1] for key, values in parse_qs(parts.query).items()}
        self.host = parts.hostname or "localhost"
        self.tls = parts.scheme == "amqps"
        self.port = parts.port or (5671 if self.tls else 5672)
        self.credentials = (f"\0{unquote(parts.username or 'guest')}"
                            f"\0{unquote(parts.password or 'guest')}")
        self.vhost = unquote(parts.path[1:]) if len(parts.path) > 1 else "/"
        heartbeat = options.get("heartbeat")
        try:
            self.heartbeat = None if heartbeat is None else int(float(heartbeat))
        except ValueError:
            raise ConfigurationError(f"heartbeat must be a number of seconds, got"
                                     f" {heartbeat!r}") from None
        self._options = options
        self._context: ssl.SSLContext | None = None

    def ssl_context(self) -> ssl.SSLContext | None:
        """The TLS context of an ``amqps://`` URL, built once, from the options aio-pika
        reads too: ``cafile``, ``capath``, ``cadata`` (the authority's PEM itself),
        ``certfile`` and ``keyfile`` (a client's certificate), ``no_verify_ssl=1``."""
        if not self.tls:
            return None
        if self._context is None:
            options = self._options
            context = ssl.create_default_context(
                cafile=options.get("cafile"), capath=options.get("capath"),
                cadata=options.get("cadata"))
            if options.get("certfile"):
                context.load_cert_chain(options["certfile"], options.get("keyfile"))
            if options.get("no_verify_ssl", "0") != "0":
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE
            self._context = context
        return self._context


async def open_wire(address: WireAddress, make: Callable[[], W], *, within: float) -> W:
    """A connection made by `make`, its handshake done and its channel open; a
    ConnectionError if that takes more than `within` seconds or fails."""
    loop = asyncio.get_running_loop()
    wire = make()
    try:
        async with asyncio.timeout(within):
            await loop.create_connection(lambda: wire, address.host, address.port,
                                         ssl=address.ssl_context())
            await wire.opened
            await wire.call(Channel.Open(), Channel.OpenOk)
    except (OSError, TimeoutError) as error:  # (a refused certificate is an OSError too)
        wire.abort()
        if isinstance(error, ConnectionError):
            raise
        raise ConnectionError(f"cannot open a connection to RabbitMQ: {error!r}") from error
    except BaseException:
        wire.abort()
        raise
    return wire


class Wire(asyncio.Protocol):
    """One connection and its channel: frames cut from the stream, each handed to its
    handler as it completes. A kind of connection adds the handlers of its frames
    to `handlers`."""

    def __init__(self, address: WireAddress) -> None:
        loop = asyncio.get_running_loop()
        self.loop = loop
        self.opened: asyncio.Future[None] = loop.create_future()
        self.ended: asyncio.Future[None] = loop.create_future()  # lost, closed, given up
        self._gone: asyncio.Future[None] = loop.create_future()  # the socket closed
        self.lost: ConnectionError | None = None
        self.frame_max = 131072
        self._address = address
        self._transport: asyncio.WriteTransport | None = None
        self._buffer = b""
        # the channel's synchronous methods waiting for their answers, in order
        self._answers: collections.deque[tuple[type, asyncio.Future[Any]]] = (
            collections.deque())
        self._heard = self._said = False  # since the last heartbeat tick
        self._ticking: asyncio.TimerHandle | None = None
        self.handlers: dict[type, Callable[[Any], None]] = {
            pamqp_heartbeat.Heartbeat: _ignore,
            Connection.Start: self._start, Connection.Tune: self._tune,
            Connection.OpenOk: self._open_ok, Connection.Close: self._connection_close,
            Connection.CloseOk: lambda _: self.lose("closed"),
            Channel.Close: self._channel_close,
            # blocked and unblocked: a publish waits for its confirm meanwhile
            Connection.Blocked: _ignore, Connection.Unblocked: _ignore,
        }

    # ------------------------------------------------------------ use
    def call(self, method: Any, answer: type[Answer]) -> asyncio.Future[Answer]:
        """Send one of the channel's synchronous methods; its answer (AMQP answers a
        channel's methods in order)."""
        if self.lost is not None:
            raise ConnectionError(str(self.lost))
        waiting: asyncio.Future[Answer] = self.loop.create_future()
        self._answers.append((answer, waiting))
        self.write(pamqp_frame.marshal(method, CHANNEL))
        return waiting

    def write(self, data: bytes) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.write(data)
            self._said = True

    def lose(self, why: str) -> None:
        """End the connection: what waits on it fails with a ConnectionError saying why."""
        if self.lost is None:
            self.lost = ConnectionError(why)
        if self._ticking is not None:
            self._ticking.cancel()
        answers, self._answers = self._answers, collections.deque()
        for _, waiting in answers:
            if not waiting.done():
                waiting.set_exception(ConnectionError(str(self.lost)))
        self.failed(self.lost)
        if not self.opened.done():
            self.opened.set_exception(ConnectionError(str(self.lost)))
            self.opened.exception()  # retrieved: a connect that timed out awaits it no more
        if not self.ended.done():
            self.ended.set_result(None)
        if self._transport is not None and not self._transport.is_closing():
            self._transport.close()

    def failed(self, error: ConnectionError) -> None:
        """What a kind of connection fails as it ends (its own waiters)."""

    def abort(self) -> None:
        self.lose("the connection to RabbitMQ was given up")
        if self._transport is not None:
            self._transport.abort()

    async def close(self) -> None:
        """Close the connection politely, waiting a moment for the broker's answer,
        then for the socket (TLS says goodbye too)."""
        if self._transport is None:
            return
        try:
            async with asyncio.timeout(_GOODBYE):
                if self.lost is None:
                    self.write(pamqp_frame.marshal(Connection.Close(
                        reply_code=200, reply_text="closing", class_id=0, method_id=0), 0))
                    await asyncio.shield(self.ended)
                self.lose("closed")
                await asyncio.shield(self._gone)
        except TimeoutError:
            self.abort()

    # ------------------------------------------------------------ the protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # (uvloop's transport writes, but is no asyncio.WriteTransport to isinstance)
        self._transport = cast(asyncio.WriteTransport, transport)
        self.write(pamqp_frame.marshal(pamqp_header.ProtocolHeader(), 0))

    def data_received(self, data: bytes) -> None:
        self._heard = True
        buffer = self._buffer + data if self._buffer else data
        at = 0
        handlers, answers = self.handlers, self._answers
        while len(buffer) - at >= FRAME_OVERHEAD:
            end = at + FRAME_OVERHEAD + int.from_bytes(buffer[at + 3:at + 7])
            if len(buffer) < end:
                break
            _used, _channel, frame = pamqp_frame.unmarshal(buffer[at:end])
            at = end
            handle = handlers.get(type(frame))
            if handle is not None:
                handle(frame)
            elif answers and isinstance(frame, answers[0][0]):
                waiting = answers.popleft()[1]
                if not waiting.done():
                    waiting.set_result(frame)
        self._buffer = buffer[at:]

    def connection_lost(self, error: Exception | None) -> None:
        self.lose(f"the connection to RabbitMQ was lost: {error!r}" if error is not None
                  else "the connection to RabbitMQ closed")
        if not self._gone.done():
            self._gone.set_result(None)

    # ------------------------------------------------------------ the broker's methods
    def _start(self, _: Connection.Start) -> None:
        self.write(pamqp_frame.marshal(Connection.StartOk(
            client_properties={"product": "sasflow", "capabilities": {
                "publisher_confirms": True, "basic.nack": True,
                "consumer_cancel_notify": True}},
            response=self._address.credentials), 0))

    def _tune(self, frame: Connection.Tune) -> None:
        wanted = self._address.heartbeat
        heartbeat = frame.heartbeat if wanted is None else wanted
        self.frame_max = frame.frame_max or self.frame_max
        self.write(pamqp_frame.marshal(Connection.TuneOk(
            channel_max=frame.channel_max, frame_max=self.frame_max, heartbeat=heartbeat), 0))
        self.write(pamqp_frame.marshal(Connection.Open(virtual_host=self._address.vhost), 0))
        if heartbeat:
            self._tick(heartbeat / 2)

    def _open_ok(self, _: Connection.OpenOk) -> None:
        if not self.opened.done():
            self.opened.set_result(None)

    def _connection_close(self, frame: Connection.Close) -> None:
        self.write(pamqp_frame.marshal(Connection.CloseOk(), 0))
        self.lose(f"RabbitMQ closed the connection: {frame.reply_code} {frame.reply_text}")

    def _channel_close(self, frame: Channel.Close) -> None:
        self.write(pamqp_frame.marshal(Channel.CloseOk(), CHANNEL))
        if frame.reply_code in _REFUSAL_CODES and self._answers:
            # the method waiting is what the broker refused: it says so, not an outage
            waiting = self._answers.popleft()[1]
            if not waiting.done():
                waiting.set_exception(ChannelRefused(frame.reply_code, frame.reply_text))
        self.lose(f"RabbitMQ closed the channel: {frame.reply_code} {frame.reply_text}")

    def _tick(self, interval: float) -> None:
        """Every half heartbeat: say something if nothing was said; give up on a broker
        that said nothing for two heartbeats (four ticks)."""
        silent_ticks = 0

        def tick() -> None:
            nonlocal silent_ticks
            if self.lost is not None:
                return
            silent_ticks = 0 if self._heard else silent_ticks + 1
            if silent_ticks >= 4:
                self.lose("RabbitMQ sent nothing for two heartbeats")
                return
            if not self._said:
                self.write(_HEARTBEAT)
            self._heard = self._said = False
            self._ticking = self.loop.call_later(interval, tick)
        self._ticking = self.loop.call_later(interval, tick)


def _ignore(_: object) -> None:
    pass
