"""One consumer's connection (amqp_wire.py): its deliveries as they complete, its acks.

A delivery is its method, its header and its body frames; once the body is whole
it is handed to the consumer from `data_received`, with no task or queue between.
Acks and nacks are written together two turns of the loop on: the next turn is
what the handler set going (a scheduler's driver woken by its reply), the one
after it what that set going (the driver's write, sent by the group commit's
task), and the acks of one read of the socket go out as one write. An ack only
frees a prefetch slot; sent a turn earlier, its write (~50 µs) stood between a
reply and the commit it leads to.

Its connection carries this one consumer: when the broker cancels it (its queue
was deleted) the connection ends, as it does when it is lost, and the consumer
(amqp_consume.py) opens another. A delivery tag means something only on the
connection that delivered it: an ack on one that ended is dropped, and the
broker delivers the message again.
"""

from __future__ import annotations

from collections.abc import Callable

from pamqp import body as pamqp_body
from pamqp import frame as pamqp_frame
from pamqp import header as pamqp_header
from pamqp.commands import Basic, Queue
from pamqp.common import FieldTable

from sasflow.transport.amqp_wire import CHANNEL, Wire, WireAddress

__all__ = ["ConsumingWire", "Delivered"]

# (the connection, the delivery tag, redelivered by the broker, properties, body)
Delivered = Callable[["ConsumingWire", int, bool, Basic.Properties, bytes], None]


class ConsumingWire(Wire):
    """A connection whose channel consumes one queue."""

    def __init__(self, address: WireAddress, delivered: Delivered) -> None:
        super().__init__(address)
        self._delivered = delivered
        self._delivering = True
        self.consumer_tag = ""
        self._deliver: Basic.Deliver | None = None  # the delivery being assembled
        self._properties = Basic.Properties()
        self._size = self._received = 0
        self._parts: list[bytes] = []
        self._settled: list[bytes] = []  # acks and nacks to write together
        self.handlers.update({
            Basic.Deliver: self._deliver_begins, pamqp_header.ContentHeader: self._header,
            pamqp_body.ContentBody: self._body, Basic.Cancel: self._cancelled,
        })

    async def consume(self, queue: str, *, arguments: FieldTable, prefetch: int) -> None:
        """Deliveries of `queue`, at most `prefetch` unacked; the queue declared first,
        each time: a queue deleted under its consumer comes back."""
        await self.call(Basic.Qos(prefetch_count=prefetch), Basic.QosOk)
        await self.call(Queue.Declare(queue=queue, durable=True, arguments=arguments),
                        Queue.DeclareOk)
        consuming = await self.call(Basic.Consume(queue=queue), Basic.ConsumeOk)
        self.consumer_tag = consuming.consumer_tag or ""

    def ack(self, tag: int) -> bool:
        """Ack delivery `tag`; False if the connection that delivered it is gone."""
        return self._settle(Basic.Ack(delivery_tag=tag))

    def nack(self, tag: int) -> bool:
        """Give delivery `tag` back to the queue; False if its connection is gone."""
        return self._settle(Basic.Nack(delivery_tag=tag, requeue=True))

    def stop(self) -> None:
        """No more deliveries: any still coming go back to the queue when the connection
        closes, with those held unacked."""
        if self._delivering:
            self._delivering = False
            if self.consumer_tag and self.lost is None:
                self.write(pamqp_frame.marshal(Basic.Cancel(consumer_tag=self.consumer_tag),
                                               CHANNEL))

    def _settle(self, method: Basic.Ack | Basic.Nack) -> bool:
        if self.lost is not None:
            return False
        if not self._settled:  # (two turns on: see above)
            self.loop.call_soon(self.loop.call_soon, self._write_settled)
        self._settled.append(pamqp_frame.marshal(method, CHANNEL))
        return True

    def _write_settled(self) -> None:
        settled, self._settled = self._settled, []
        if settled:  # (none left if the connection's close wrote them)
            self.write(b"".join(settled))

    async def close(self) -> None:
        """Close the connection, with the acks still waiting for their turn written
        first: the broker would take their messages back and deliver them again."""
        self._write_settled()
        await super().close()

    # ------------------------------------------------------------ a delivery's frames
    def _deliver_begins(self, frame: Basic.Deliver) -> None:
        self._deliver = frame

    def _header(self, frame: pamqp_header.ContentHeader) -> None:
        self._properties, self._size, self._received = frame.properties, frame.body_size, 0
        self._parts = []
        if frame.body_size == 0:
            self._whole(b"")

    def _body(self, frame: pamqp_body.ContentBody) -> None:
        self._parts.append(frame.value)
        self._received += len(frame.value)
        if self._received >= self._size:
            parts = self._parts
            self._whole(parts[0] if len(parts) == 1 else b"".join(parts))

    def _whole(self, body: bytes) -> None:
        deliver, self._deliver = self._deliver, None
        if deliver is not None and self._delivering:
            self._delivered(self, deliver.delivery_tag or 0, deliver.redelivered,
                            self._properties, body)

    def _cancelled(self, _: Basic.Cancel) -> None:
        self.lose("RabbitMQ cancelled the consumer: its queue was deleted")
