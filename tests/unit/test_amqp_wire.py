"""The RabbitMQ transport's own connections (transport/amqp_wire*.py), fed the
broker's frames by hand: which publish each confirm, nack or return settles; how
a consumer's deliveries are assembled and its acks written."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest
from pamqp import body as pamqp_body
from pamqp import frame as pamqp_frame
from pamqp import header as pamqp_header
from pamqp.commands import Basic, Channel, Connection, Queue

from sasflow.errors import ConfigurationError
from sasflow.transport.amqp_wire import ChannelRefused, Wire, WireAddress
from sasflow.transport.amqp_wire_consume import ConsumingWire
from sasflow.transport.amqp_wire_publish import MessageNacked, MessageReturned, PublishingWire

_ADDRESS = WireAddress("amqp://guest:guest@127.0.0.1/")


class _Written:
    """A transport that keeps what is written to it."""

    def __init__(self) -> None:
        self.frames: list[Any] = []
        self.writes = 0
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes += 1
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


def _from_broker(wire: Wire, *frames: Any) -> None:
    wire.data_received(b"".join(pamqp_frame.marshal(f, 1) for f in frames))


def _connected(wire: Wire) -> _Written:
    written = _Written()
    wire.connection_made(cast(asyncio.BaseTransport, written))  # writes are all it uses
    return written


async def _publishing(count: int) -> tuple[PublishingWire, _Written, list[asyncio.Task[None]]]:
    wire = PublishingWire(_ADDRESS)
    written = _connected(wire)
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
    wire = PublishingWire(_ADDRESS)
    written = _connected(wire)
    wire.frame_max = 4096  # what the broker tuned
    body = bytes(range(256)) * 40  # 10,240 bytes
    publishing = asyncio.create_task(wire.publish("q", body, Basic.Properties()))
    await asyncio.sleep(0)
    bodies = [f for f in written.frames if isinstance(f, pamqp_body.ContentBody)]
    assert len(bodies) == 3 and b"".join(b.value for b in bodies) == body
    publishing.cancel()


def test_a_heartbeat_that_is_no_number_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="heartbeat must be a number of seconds"):
        WireAddress("amqp://guest:guest@127.0.0.1/?heartbeat=often")


def test_an_amqps_url_connects_over_tls_with_aio_pikas_options() -> None:
    plain = WireAddress("amqp://u:p%40ss@mq/vhost")
    assert (plain.port, plain.vhost, plain.credentials, plain.ssl_context()) == (
        5672, "vhost", "\0u\0p@ss", None)
    checked = WireAddress("amqps://mq/").ssl_context()
    assert checked is not None and checked.check_hostname
    assert WireAddress("amqps://mq/").port == 5671
    unchecked = WireAddress("amqps://mq:5000/?no_verify_ssl=1").ssl_context()
    assert unchecked is not None and not unchecked.check_hostname


# ------------------------------------------------------------ consuming
def _consuming() -> tuple[ConsumingWire, _Written, list[tuple[int, bool, bytes]]]:
    got: list[tuple[int, bool, bytes]] = []
    wire = ConsumingWire(_ADDRESS, lambda _wire, tag, again, _properties, body:
                         got.append((tag, again, body)))
    return wire, _connected(wire), got


def _delivery(tag: int, body: bytes, *, frame_size: int = 1000,
              redelivered: bool = False) -> bytes:
    frames: list[Any] = [Basic.Deliver(consumer_tag="c", delivery_tag=tag, redelivered=redelivered,
                            exchange="", routing_key="q"),
              pamqp_header.ContentHeader(0, len(body), Basic.Properties()),
              *(pamqp_body.ContentBody(body[at:at + frame_size])
                for at in range(0, len(body), frame_size))]
    return b"".join(pamqp_frame.marshal(f, 1) for f in frames)


async def test_a_delivery_is_handed_over_once_whole_however_the_socket_cuts_it() -> None:
    wire, _written, got = _consuming()
    stream = _delivery(1, b"x" * 2500) + _delivery(2, b"", redelivered=True) + _delivery(
        3, b"three")
    for at in range(0, len(stream), 7):  # seven bytes a read: frames cut anywhere
        wire.data_received(stream[at:at + 7])
    assert got == [(1, False, b"x" * 2500), (2, True, b""), (3, False, b"three")]


async def test_the_acks_of_one_read_go_out_together_behind_what_their_handlers_set_going(
        ) -> None:
    wire, written, _got = _consuming()
    before = written.writes
    sent_with_acks_out: list[int] = []  # acks written when the step's write was sent

    async def write_of_the_step() -> None:  # (the group commit's task)
        sent_with_acks_out.append(written.writes - before)

    async def driver(reply: asyncio.Future[None]) -> None:
        await reply
        await asyncio.create_task(write_of_the_step())  # the write its reply leads to

    reply = asyncio.get_running_loop().create_future()
    driving = asyncio.create_task(driver(reply))
    await asyncio.sleep(0)  # the driver waits for its reply
    reply.set_result(None)  # a delivery's handler hands the reply over, then settles
    assert wire.ack(1) and wire.nack(2) and wire.ack(3)
    assert written.writes == before  # not yet: what the handlers woke goes first
    await driving
    assert sent_with_acks_out == [0]  # and what that set going: the write before the acks
    while written.writes == before:
        await asyncio.sleep(0)
    assert written.writes == before + 1  # the three in one write
    acks = written.frames[-3:]
    assert [type(f) for f in acks] == [Basic.Ack, Basic.Nack, Basic.Ack]
    assert [f.delivery_tag for f in acks] == [1, 2, 3] and acks[1].requeue


async def test_acks_waiting_for_their_turn_go_out_before_the_connection_closes() -> None:
    """A consumer stopped right after its handlers settled: the broker would take the
    messages back with the connection, and deliver them again, if the goodbye went
    out before their acks."""
    wire, written, _got = _consuming()
    assert wire.ack(1) and wire.nack(2) and wire.ack(3)
    closing = asyncio.create_task(wire.close())
    while not any(isinstance(f, Connection.Close) for f in written.frames):
        await asyncio.sleep(0)
    kinds = [type(f) for f in written.frames]
    assert kinds[-4:] == [Basic.Ack, Basic.Nack, Basic.Ack, Connection.Close]
    for _ in range(3):  # the turns the acks had waited for: nothing is written twice
        await asyncio.sleep(0)
    assert len(written.frames) == len(kinds)
    wire.data_received(pamqp_frame.marshal(Connection.CloseOk(), 0))
    assert written.closed
    wire.connection_lost(None)  # (the socket gone)
    await closing


async def test_an_ack_on_a_connection_that_ended_is_dropped() -> None:
    wire, written, _got = _consuming()
    wire.connection_lost(None)
    assert wire.ended.done() and written.closed
    assert not wire.ack(1)
    await asyncio.sleep(0)
    assert not any(isinstance(f, Basic.Ack) for f in written.frames)


async def test_the_broker_cancelling_the_consumer_ends_its_connection() -> None:
    wire, written, _got = _consuming()
    _from_broker(wire, Basic.Cancel(consumer_tag="c"))
    assert wire.ended.done() and written.closed
    assert "queue was deleted" in str(wire.lost)


async def test_a_stopped_consumer_takes_no_more_deliveries_and_says_so() -> None:
    wire, written, got = _consuming()
    wire.consumer_tag = "c"
    wire.data_received(_delivery(1, b"one"))
    wire.stop()
    wire.data_received(_delivery(2, b"two"))
    assert [tag for tag, _, _ in got] == [1]
    assert isinstance(written.frames[-1], Basic.Cancel)


async def test_a_queue_the_broker_refuses_fails_its_declare_for_good() -> None:
    wire, written, _got = _consuming()
    declaring = wire.call(Queue.Declare(queue="q", durable=True), Queue.DeclareOk)
    _from_broker(wire, Channel.Close(reply_code=406, reply_text="PRECONDITION_FAILED",
                                     class_id=50, method_id=10))
    with pytest.raises(ChannelRefused, match="406"):
        await declaring
    assert wire.ended.done() and written.closed
