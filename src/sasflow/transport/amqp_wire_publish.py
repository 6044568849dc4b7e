"""The RabbitMQ transport's publisher, on a connection of its own (amqp_wire.py).

Its channel is in confirm mode: a publish is one write of its three frames (more
for a body over the broker's frame size), and its confirm one callback from
`data_received`. Each publish is ``mandatory``: a message the broker returns
(its queue is gone) fails its publish with `MessageReturned`, one it nacks with
`MessageNacked`. A lost connection fails every publish waiting on it with a
ConnectionError, and the next publish connects again: a publish is sent at least
once, as the transport's retry promises.
"""

from __future__ import annotations

import asyncio

from pamqp import body as pamqp_body
from pamqp import frame as pamqp_frame
from pamqp import header as pamqp_header
from pamqp.commands import Basic, Confirm

from sasflow.transport.amqp_wire import CHANNEL, FRAME_OVERHEAD, Wire, WireAddress, open_wire

__all__ = ["MessageNacked", "MessageReturned", "WirePublisher"]


class MessageReturned(Exception):
    """The broker could not route the message (mandatory): its queue is gone."""


class MessageNacked(Exception):
    """The broker refused the message (basic.nack)."""


class WirePublisher:
    """Confirmed publishes on a connection of its own, opened on first use and again
    after it is lost. Used from one event loop."""

    def __init__(self, address: WireAddress, *, connect_timeout: float) -> None:
        self._address = address
        self._connect_timeout = connect_timeout
        self._wire: PublishingWire | None = None
        self._opening: asyncio.Future[PublishingWire] | None = None

    async def publish(self, queue: str, body: bytes, properties: Basic.Properties) -> None:
        """Publish `body` to `queue` on the default exchange, once confirmed."""
        wire = self._wire
        if wire is None or wire.lost is not None:
            wire = await self._open()
        await wire.publish(queue, body, properties)

    async def _open(self) -> PublishingWire:
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

    async def _connect(self) -> PublishingWire:
        wire = await open_wire(self._address, lambda: PublishingWire(self._address),
                               within=self._connect_timeout)
        try:
            await wire.call(Confirm.Select(), Confirm.SelectOk)
        except BaseException:
            wire.abort()
            raise
        return wire

    async def close(self) -> None:
        wire, self._wire = self._wire, None
        if self._opening is not None:
            self._opening.cancel()
        if wire is not None:
            await wire.close()


class PublishingWire(Wire):
    """A connection whose channel confirms each publish."""

    def __init__(self, address: WireAddress) -> None:
        super().__init__(address)
        self._confirms: dict[int, asyncio.Future[None]] = {}  # by delivery tag, in order
        self._tags: dict[str, int] = {}  # a publish's message id: its delivery tag
        self._published = 0
        self._returning = False  # a returned message's header is next
        self.handlers.update({
            Basic.Ack: self._settle, Basic.Nack: self._settle,
            Basic.Return: self._returned, pamqp_header.ContentHeader: self._returned_header,
            pamqp_body.ContentBody: lambda _: None,  # a returned message's body
        })

    async def publish(self, queue: str, body: bytes, properties: Basic.Properties) -> None:
        if self.lost is not None or self._transport is None:
            raise ConnectionError(str(self.lost))
        self._published += 1
        tag = self._published
        # the id a return names the message by (RabbitMQ returns before it confirms)
        properties.message_id = message_id = str(tag)
        self._tags[message_id] = tag
        confirmed = self._confirms[tag] = self.loop.create_future()
        room = self.frame_max - FRAME_OVERHEAD
        self.write(b"".join((
            pamqp_frame.marshal(Basic.Publish(exchange="", routing_key=queue, mandatory=True),
                                CHANNEL),
            pamqp_frame.marshal(pamqp_header.ContentHeader(0, len(body), properties),
                                CHANNEL),
            *(pamqp_frame.marshal(pamqp_body.ContentBody(body[at:at + room]), CHANNEL)
              for at in range(0, len(body), room)))))
        try:
            await confirmed
        finally:
            self._tags.pop(message_id, None)

    def failed(self, error: ConnectionError) -> None:
        waiting, self._confirms = self._confirms, {}
        for confirmed in waiting.values():
            if not confirmed.done():
                confirmed.set_exception(ConnectionError(str(error)))

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

    def _returned(self, _: Basic.Return) -> None:
        self._returning = True  # its header names the message

    def _returned_header(self, frame: pamqp_header.ContentHeader) -> None:
        if not self._returning:
            return
        self._returning = False  # its body frames are skipped
        tag = self._tags.get(frame.properties.message_id or "")
        confirmed = self._confirms.pop(tag, None) if tag is not None else None
        if confirmed is not None and not confirmed.done():
            confirmed.set_exception(MessageReturned("RabbitMQ returned the message"))
