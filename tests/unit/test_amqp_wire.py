"""The RabbitMQ transport's own publisher (transport/amqp_wire.py), fed the broker's
frames by hand: which publish each confirm, nack or return settles."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest
from pamqp import body as pamqp_body
from pamqp import frame as pamqp_frame
from pamqp import header as pamqp_header
from pamqp.commands import Basic, Channel

from sasflow.errors import ConfigurationError
from sasflow.transport.amqp_wire import MessageNacked, MessageReturned, WirePublisher, _Wire


class _Written:
    """A transport that keeps what is written to it."""

    def __init__(self) -> None:
        self.frames: list[Any] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        at = 0
        while at < len(data):
            if data[at:at + 4] == b"AMQP":  # the protocol header
                at += 8
                continue
            used, _channel, frame = pamqp_frame.unmarshal(data[at:])
            self.frames.append(frame)
            at += used

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True


def _from_broker(wire: _Wire, *frames: Any) -> None:
    wire.data_received(b"".join(pamqp_frame.marshal(f, 1) for f in frames))


async def _publishing(count: int) -> tuple[_Wire, _Written, list[asyncio.Task[None]]]:
    wire, written = _Wire("\0guest\0guest", "/", None), _Written()
    wire.connection_made(cast(asyncio.BaseTransport, written))  # writes are all it uses
    publishes = [asyncio.create_task(
        wire.publish("q", b"body", Basic.Properties(delivery_mode=2))) for _ in range(count)]
    await asyncio.sleep(0)  # each written
    return wire, written, publishes


async def test_each_publish_is_one_write_of_its_three_frames_mandatory_and_named() -> None:
    _wire, written, publishes = await _publishing(2)
    publish, header, body = written.frames[:3]
    assert isinstance(publish, Basic.Publish) and publish.mandatory
    assert publish.routing_key == "q"
    assert isinstance(header, pamqp_header.ContentHeader)
    assert header.properties.message_id == "1"
    assert header.properties.delivery_mode == 2
    assert isinstance(body, pamqp_body.ContentBody) and body.value == b"body"
    assert written.frames[4].properties.message_id == "2"
    for publish_task in publishes:
        publish_task.cancel()


async def test_a_multiple_confirm_settles_every_publish_up_to_its_tag_and_no_more() -> None:
    wire, _written, publishes = await _publishing(3)
    _from_broker(wire, Basic.Ack(delivery_tag=2, multiple=True))
    await asyncio.sleep(0)
    assert [p.done() for p in publishes] == [True, True, False]
    _from_broker(wire, Basic.Nack(delivery_tag=3))
    with pytest.raises(MessageNacked):
        await publishes[2]


async def test_a_returned_message_fails_its_own_publish_not_the_others() -> None:
    wire, _written, publishes = await _publishing(3)
    _from_broker(wire, Basic.Return(reply_code=312, reply_text="NO_ROUTE", exchange="",
                                    routing_key="q"),
                 pamqp_header.ContentHeader(0, 4, Basic.Properties(message_id="2")),
                 pamqp_body.ContentBody(b"body"),
                 Basic.Ack(delivery_tag=3, multiple=True))  # the broker confirms it after
    with pytest.raises(MessageReturned):
        await publishes[1]
    await publishes[0]
    await publishes[2]


async def test_a_channel_the_broker_closed_fails_every_waiting_publish_and_the_next() -> None:
    wire, written, publishes = await _publishing(2)
    _from_broker(wire, Channel.Close(reply_code=406, reply_text="PRECONDITION_FAILED",
                                     class_id=60, method_id=40))
    for publish_task in publishes:
        with pytest.raises(ConnectionError, match="406 PRECONDITION_FAILED"):
            await publish_task
    assert isinstance(written.frames[-1], Channel.CloseOk) and written.closed
    with pytest.raises(ConnectionError):
        await wire.publish("q", b"next", Basic.Properties())


async def test_a_body_larger_than_a_frame_goes_in_several() -> None:
    wire, written = _Wire("\0guest\0guest", "/", None), _Written()
    wire.connection_made(cast(asyncio.BaseTransport, written))  # writes are all it uses
    wire._frame_max = 4096  # what the broker tuned
    body = bytes(range(256)) * 40  # 10,240 bytes
    publishing = asyncio.create_task(wire.publish("q", body, Basic.Properties()))
    await asyncio.sleep(0)
    bodies = [f for f in written.frames if isinstance(f, pamqp_body.ContentBody)]
    assert len(bodies) == 3 and b"".join(b.value for b in bodies) == body
    publishing.cancel()


def test_a_heartbeat_that_is_no_number_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="heartbeat must be a number of seconds"):
        WirePublisher("amqp://guest:guest@127.0.0.1/?heartbeat=often", connect_timeout=1)
