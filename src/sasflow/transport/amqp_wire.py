"""The RabbitMQ transport's own publisher: pamqp's frames over an `asyncio.Protocol`.

A single task's path crosses the broker one message at a time, each waited for,
so each message pays its client's whole machinery. aiormq passes every frame
through asyncio queues, stream reads, locks and futures: a confirmed publish cost
155 µs of CPU, where this layer's floor is 78 (bench/amqp_client_floor.py). Here
a publish is one write, and its confirm one callback from `data_received`.

What it does, and no more:

- the handshake (PLAIN credentials from the URL, its vhost), then heartbeats at
  the interval the broker proposes, or the URL's ``heartbeat``: a broker silent
  for two intervals is taken for gone;
- one channel in confirm mode, on which each publish is persistent as its
  properties say and ``mandatory``. A message the broker returns (its queue is
  gone) fails its publish with `MessageReturned`, one it nacks with
  `MessageNacked`;
- a connection lost, closed by the broker, or a channel the broker closed, fails
  every publish waiting on it with a ConnectionError; the next publish connects
  again. So a publish is sent at least once, as the transport's retry promises.

Declaring, consuming, the dead letters and the operator's verbs stay with
aio-pika (amqp.py): they are not on the path, and its robust connection
restores them.
"""

from __future__ import annotations

import asyncio
from typing import Any, cast
from urllib.parse import parse_qs, unquote, urlsplit

from pamqp import body as pamqp_body
from pamqp import frame as pamqp_frame
from pamqp import header as pamqp_header
from pamqp import heartbeat as pamqp_heartbeat
from pamqp.commands import Basic, Channel, Confirm, Connection

from sasflow.errors import ConfigurationError

__all__ = ["MessageNacked", "MessageReturned", "WirePublisher", "wire_url"]

_CHANNEL = 1
_FRAME_OVERHEAD = 8  # a frame's type, channel and size before its payload, its end after
_HEARTBEAT = pamqp_frame.marshal(pamqp_heartbeat.Heartbeat(), 0)


class MessageReturned(Exception):
    """The broker could not route the message (mandatory): its queue is gone."""


class MessageNacked(Exception):
    """The broker refused the message (basic.nack)."""


def wire_url(url: str) -> bool:
    """Whether this publisher can take `url`: plain ``amqp://`` (TLS options are
    aio-pika's to read, so ``amqps://`` publishes through it)."""
    return urlsplit(url).scheme == "amqp"


class WirePublisher:
    """Confirmed publishes on a connection of its own, opened on first use and again
    after it is lost. Used from one event loop."""

    def __init__(self, url: str, *, connect_timeout: float) -> None:
        parts = urlsplit(url)
        self._host, self._port = parts.hostname or "localhost", parts.port or 5672
        self._credentials = f"\0{unquote(parts.username or 'guest')}" \
                            f"\0{unquote(parts.password or 'guest')}"
        self._vhost = unquote(parts.path[1:]) if len(parts.path) > 1 else "/"
        heartbeat = parse_qs(parts.query).get("heartbeat", [None])[0]
        try:
            self._heartbeat = None if heartbeat is None else int(float(heartbeat))
        except ValueError:
            raise ConfigurationError(f"heartbeat must be a number of seconds, got"
                                     f" {heartbeat!r}") from None
        self._connect_timeout = connect_timeout
        self._wire: _Wire | None = None
        self._opening: asyncio.Future[_Wire] | None = None

    async def publish(self, queue: str, body: bytes, properties: Basic.Properties) -> None:
        """Publish `body` to `queue` on the default exchange, once confirmed."""
        wire = self._wire
        if wire is None or wire.lost is not None:
            wire = await self._open()
        await wire.publish(queue, body, properties)

    async def _open(self) -> _Wire:
        if self._opening is None:
            self._opening = asyncio.ensure_future(self._connect())
        opening = self._opening
        try:
            # shielded: a publish cancelled mid-connect leaves the others theirs
            wire = await asyncio.shield(opening)
        finally:
            if self._opening is opening and opening.done():
                self._opening = None
        self._wire = wire
        return wire

    async def _connect(self) -> _Wire:
        loop = asyncio.get_running_loop()
        wire = _Wire(self._credentials, self._vhost, self._heartbeat)
        try:
            async with asyncio.timeout(self._connect_timeout):
                await loop.create_connection(lambda: wire, self._host, self._port)
                await wire.ready
        except (OSError, TimeoutError) as error:
            wire.abort()
            raise ConnectionError(f"cannot open a publishing connection to RabbitMQ:"
                                  f" {error!r}") from error
        return wire

    async def close(self) -> None:
        wire, self._wire = self._wire, None
        if self._opening is not None:
            self._opening.cancel()
        if wire is not None:
            await wire.close()


class _Wire(asyncio.Protocol):
    """One connection: frames cut from the stream and answered as each completes."""

    def __init__(self, credentials: str, vhost: str, heartbeat: int | None) -> None:
        loop = asyncio.get_running_loop()
        self._loop = loop
        self.ready: asyncio.Future[None] = loop.create_future()
        self.lost: ConnectionError | None = None
        self._credentials, self._vhost, self._heartbeat = credentials, vhost, heartbeat
        self._transport: asyncio.WriteTransport | None = None
        self._buffer = b""
        self._frame_max = 131072
        self._confirms: dict[int, asyncio.Future[None]] = {}  # by delivery tag, in order
        self._tags: dict[str, int] = {}  # a publish's message id: its delivery tag
        self._published = 0
        self._returning = False  # a returned message's header is next
        self._heard = self._said = False  # since the last heartbeat tick
        self._ticking: asyncio.TimerHandle | None = None
        self._closed: asyncio.Future[None] = loop.create_future()

    # ------------------------------------------------------------ publishing
    async def publish(self, queue: str, body: bytes, properties: Basic.Properties) -> None:
        if self.lost is not None or self._transport is None:
            raise ConnectionError(str(self.lost))
        self._published += 1
        tag = self._published
        # the id a return names the message by (RabbitMQ returns before it confirms)
        properties.message_id = message_id = str(tag)
        self._tags[message_id] = tag
        confirmed = self._confirms[tag] = self._loop.create_future()
        room = self._frame_max - _FRAME_OVERHEAD
        self._transport.write(b"".join((
            pamqp_frame.marshal(Basic.Publish(exchange="", routing_key=queue, mandatory=True),
                                _CHANNEL),
            pamqp_frame.marshal(pamqp_header.ContentHeader(0, len(body), properties),
                                _CHANNEL),
            *(pamqp_frame.marshal(pamqp_body.ContentBody(body[at:at + room]), _CHANNEL)
              for at in range(0, len(body), room)))))
        self._said = True
        try:
            await confirmed
        finally:
            self._tags.pop(message_id, None)

    def _settle(self, frame: Basic.Ack | Basic.Nack) -> None:
        """A confirm: of one publish, or (multiple) of every one up to its tag."""
        if frame.multiple:
            tags = [tag for tag in self._confirms if tag <= frame.delivery_tag]
        else:
            tags = [frame.delivery_tag]
        for tag in tags:
            confirmed = self._confirms.pop(tag, None)
            if confirmed is None or confirmed.done():
                continue
            if isinstance(frame, Basic.Ack):
                confirmed.set_result(None)
            else:
                confirmed.set_exception(MessageNacked("RabbitMQ nacked the message"))

    # ------------------------------------------------------------ the protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # (uvloop's transport writes, but is no asyncio.WriteTransport to isinstance)
        self._transport = cast(asyncio.WriteTransport, transport)
        self._write(pamqp_frame.marshal(pamqp_header.ProtocolHeader(), 0))

    def data_received(self, data: bytes) -> None:
        self._heard = True
        buffer = self._buffer + data if self._buffer else data
        at = 0
        while len(buffer) - at >= _FRAME_OVERHEAD:
            end = at + _FRAME_OVERHEAD + int.from_bytes(buffer[at + 3:at + 7])
            if len(buffer) < end:
                break
            _used, channel, frame = pamqp_frame.unmarshal(buffer[at:end])
            at = end
            self._received(channel, frame)
        self._buffer = buffer[at:]

    def _received(self, channel: int, frame: Any) -> None:
        if isinstance(frame, Basic.Ack | Basic.Nack):
            self._settle(frame)
        elif isinstance(frame, Basic.Return):
            self._returning = True  # its header names the message
        elif isinstance(frame, pamqp_header.ContentHeader) and self._returning:
            tag = self._tags.get(frame.properties.message_id or "")
            confirmed = self._confirms.pop(tag, None) if tag is not None else None
            if confirmed is not None and not confirmed.done():
                confirmed.set_exception(MessageReturned("RabbitMQ returned the message"))
            self._returning = False  # its body frames are skipped below
        elif isinstance(frame, pamqp_body.ContentBody | pamqp_heartbeat.Heartbeat):
            pass
        elif isinstance(frame, Connection.Start):
            self._write(pamqp_frame.marshal(Connection.StartOk(
                client_properties={"product": "sasflow", "capabilities": {
                    "publisher_confirms": True, "basic.nack": True}},
                response=self._credentials), 0))
        elif isinstance(frame, Connection.Tune):
            heartbeat = frame.heartbeat if self._heartbeat is None else self._heartbeat
            self._frame_max = frame.frame_max or self._frame_max
            self._write(pamqp_frame.marshal(Connection.TuneOk(
                channel_max=frame.channel_max, frame_max=self._frame_max,
                heartbeat=heartbeat), 0))
            self._write(pamqp_frame.marshal(Connection.Open(virtual_host=self._vhost), 0))
            if heartbeat:
                self._tick(heartbeat / 2)
        elif isinstance(frame, Connection.OpenOk):
            self._write(pamqp_frame.marshal(Channel.Open(), _CHANNEL))
        elif isinstance(frame, Channel.OpenOk):
            self._write(pamqp_frame.marshal(Confirm.Select(), _CHANNEL))
        elif isinstance(frame, Confirm.SelectOk):
            if not self.ready.done():
                self.ready.set_result(None)
        elif isinstance(frame, Connection.Close):
            self._write(pamqp_frame.marshal(Connection.CloseOk(), 0))
            self._lose(f"RabbitMQ closed the connection: {frame.reply_code} {frame.reply_text}")
        elif isinstance(frame, Channel.Close):
            self._write(pamqp_frame.marshal(Channel.CloseOk(), channel))
            self._lose(f"RabbitMQ closed the publishing channel: {frame.reply_code}"
                       f" {frame.reply_text}")
        elif isinstance(frame, Connection.CloseOk):
            self._lose("closed")
        # connection.blocked and unblocked: publishes wait for their confirms meanwhile

    def _write(self, data: bytes) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.write(data)

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
                self._lose("RabbitMQ sent nothing for two heartbeats")
                return
            if not self._said:
                self._write(_HEARTBEAT)
            self._heard = self._said = False
            self._ticking = self._loop.call_later(interval, tick)
        self._ticking = self._loop.call_later(interval, tick)

    def _lose(self, why: str) -> None:
        """Fail every publish waiting here, and close the connection."""
        if self.lost is None:
            self.lost = ConnectionError(why)
        if self._ticking is not None:
            self._ticking.cancel()
        waiting, self._confirms = self._confirms, {}
        for confirmed in waiting.values():
            if not confirmed.done():
                confirmed.set_exception(ConnectionError(str(self.lost)))
        if not self.ready.done():
            self.ready.set_exception(ConnectionError(str(self.lost)))
            self.ready.exception()  # retrieved: a connect that timed out awaits it no more
        if self._transport is not None and not self._transport.is_closing():
            self._transport.close()

    def connection_lost(self, error: Exception | None) -> None:
        self._lose(f"the publishing connection to RabbitMQ was lost: {error!r}"
                   if error is not None else "the publishing connection to RabbitMQ closed")
        if not self._closed.done():
            self._closed.set_result(None)

    def abort(self) -> None:
        self._lose("the publishing connection to RabbitMQ was given up")
        if self._transport is not None:
            self._transport.abort()

    async def close(self) -> None:
        """Close the connection politely, waiting a moment for the broker's answer."""
        if self.lost is None and self._transport is not None:
            self._write(pamqp_frame.marshal(Connection.Close(
                reply_code=200, reply_text="closing", class_id=0, method_id=0), 0))
            try:
                async with asyncio.timeout(1.0):
                    await asyncio.shield(self._closed)
            except TimeoutError:
                pass
        self._lose("closed")
