"""The RabbitMQ transport over TLS (``amqps://``): its own connections (the
publisher's, each consumer's) and aio-pika's read the same URL options.

The machine's broker listens in the clear, so a TLS-terminating proxy stands in
front of it, with a certificate authority made for the test (trustme): the URL
names only the proxy's port, so every connection the transport opens goes
through TLS or not at all.
"""

from __future__ import annotations

import asyncio
import ssl
import uuid
from collections.abc import AsyncIterator, Iterator
from functools import partial
from pathlib import Path
from urllib.parse import quote

import aio_pika
import pytest
import trustme

from sasflow.transport import open_transport
from sasflow.transport.amqp_wire import WireAddress, open_wire
from sasflow.transport.amqp_wire_publish import PublishingWire
from sasflow.transport.base import ImmediateHandler
from support.faultproxy import FaultProxy

HANG_GUARD = 60.0  # only a hang fails on it


@pytest.fixture
def authority() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
def tls_front(authority: trustme.CA, rabbitmq_server: str) -> Iterator[FaultProxy]:
    """The machine's RabbitMQ behind a proxy that speaks TLS, with a certificate for
    127.0.0.1 that the test's authority signed."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    authority.issue_cert("127.0.0.1").configure_cert(context)
    with FaultProxy(5672, tls=context) as proxy:
        yield proxy


@pytest.fixture
async def queue(rabbitmq_server: str) -> AsyncIterator[str]:
    name = f"amqp-tls-test.{uuid.uuid4().hex[:12]}"
    yield name
    connection = await aio_pika.connect(rabbitmq_server)
    async with connection:
        channel = await connection.channel()
        await channel.queue_delete(name)


async def test_messages_travel_over_tls_trusting_the_urls_certificate_authority(
        tls_front: FaultProxy, authority: trustme.CA, tmp_path: Path, queue: str) -> None:
    ca = tmp_path / "ca.pem"
    authority.cert_pem.write_to_path(str(ca))
    transport = open_transport(f"amqps://guest:guest@127.0.0.1:{tls_front.port}/"
                               f"?cafile={ca}&queue_expires=20")
    got: list[bytes] = []
    arrived = asyncio.Event()

    def take(body: bytes) -> None:
        got.append(body)
        arrived.set()

    consumer = asyncio.create_task(transport.consume(queue, ImmediateHandler(take),
                                                     prefetch=4))
    try:
        async with asyncio.timeout(HANG_GUARD):
            await transport.publish(queue, b"over tls")
            await arrived.wait()
        assert got == [b"over tls"]
        # aio-pika's (declaring), the publisher's and the consumer's
        assert tls_front.connections >= 3
    finally:
        consumer.cancel()
        await asyncio.gather(consumer, return_exceptions=True)
        await transport.close()


async def test_a_broker_whose_certificate_is_not_trusted_is_refused(
        tls_front: FaultProxy, authority: trustme.CA) -> None:
    """Without the URL's authority the system's trust store knows nothing of the
    broker's certificate. The authority given in the URL itself (``cadata``) is
    trusted; with ``no_verify_ssl=1`` the operator chose not to check."""
    broker = f"amqps://guest:guest@127.0.0.1:{tls_front.port}/"
    unchecked = WireAddress(broker)
    with pytest.raises(ConnectionError, match="CERTIFICATE_VERIFY_FAILED"):
        await open_wire(unchecked, lambda: PublishingWire(unchecked), within=HANG_GUARD)
    pem = quote(authority.cert_pem.bytes().decode())
    for options in (f"?cadata={pem}", "?no_verify_ssl=1"):
        trusting = WireAddress(broker + options)
        wire = await open_wire(trusting, partial(PublishingWire, trusting), within=HANG_GUARD)
        assert wire.lost is None
        await wire.close()
