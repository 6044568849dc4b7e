"""Bundler (transport/amqp_bundle.py): concurrent publishes to a queue travel together.

Driven with a fake `send` that records what would go to the broker, so each rule
is shown without one: what waits together goes together, within the caps; a lone
message goes plain; every caller's future ends only after its own bundle's confirm.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from functools import partial

import pytest

from sasflow.errors import TransportError
from sasflow.transport.amqp_bundle import Bundler, decode_bundle, encode_bundle


class Broker:
    """A fake `send`: records (queue, bodies) per AMQP message; confirms when let go."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, list[bytes]]] = []
        self.confirm = asyncio.Event()
        self.confirm.set()
        self.fail: BaseException | None = None

    async def __call__(self, queue: str, payload: bytes, bundle: bool) -> None:
        self.sent.append((queue, decode_bundle(payload) if bundle else [payload]))
        await self.confirm.wait()
        if self.fail is not None:
            raise self.fail


async def until(condition: Callable[[], object]) -> None:
    """Let the loop run until `condition` holds: a positive signal, not a pause (a
    slow machine can end a pause before the tasks it waits for have had their turn)."""
    async with asyncio.timeout(60):  # a hang guard only
        while not condition():
            await asyncio.sleep(0)


def waiting(bundler: Bundler, queue: str) -> int:
    """Publishes to `queue` waiting for a bundle (none sending them yet)."""
    state = bundler._queues.get(queue)
    return 0 if state is None else len(state.waiting)


def held_broker() -> tuple[Broker, Bundler]:
    """A bundler whose broker confirms nothing until `broker.confirm` is set."""
    broker = Broker()
    broker.confirm.clear()
    return broker, Bundler(broker, max_bytes=1 << 20)


def test_a_bundle_round_trips() -> None:
    bodies = [b"", b"a", b"\x00" * 300, "ü".encode()]
    assert decode_bundle(encode_bundle(bodies)) == bodies


async def test_publishes_of_one_loop_turn_go_together_and_a_lone_one_goes_plain() -> None:
    broker = Broker()
    bundler = Bundler(broker, max_bytes=1 << 20)
    await bundler.post("q", b"alone")
    await asyncio.gather(*(bundler.post("q", f"m{n}".encode()) for n in range(100)))
    assert broker.sent[0] == ("q", [b"alone"])
    together = [body for _, bodies in broker.sent[1:] for body in bodies]
    assert together == [f"m{n}".encode() for n in range(100)]  # publishing order kept
    assert len(broker.sent) <= 3


async def test_bundles_keep_within_the_message_and_byte_caps() -> None:
    broker = Broker()
    bundler = Bundler(broker, max_bytes=1000, max_messages=10)
    await asyncio.gather(*(bundler.post("q", bytes(95)) for _ in range(60)))
    sizes = [len(bodies) for _, bodies in broker.sent]
    assert sum(sizes) == 60
    assert max(sizes) <= 10
    # ten bodies of 95 bytes with their framing could pass 1000 bytes: 9 a bundle
    assert all(len(encode_bundle(bodies)) <= 1000 for _, bodies in broker.sent if len(bodies) > 1)
    assert max(sizes) == 9


async def test_a_body_as_big_as_the_limit_goes_alone() -> None:
    broker = Broker()
    bundler = Bundler(broker, max_bytes=100)
    await asyncio.gather(bundler.post("q", bytes(100)), bundler.post("q", bytes(100)),
                         bundler.post("q", bytes(100)))
    assert [len(bodies) for _, bodies in broker.sent] == [1, 1, 1]


async def test_queues_are_bundled_apart() -> None:
    broker = Broker()
    bundler = Bundler(broker, max_bytes=1 << 20)
    await asyncio.gather(*(bundler.post(f"q{n % 2}", f"m{n}".encode()) for n in range(20)))
    for queue, bodies in broker.sent:
        assert all(int(body[1:]) % 2 == int(queue[1:]) for body in bodies)


async def test_publish_waits_for_its_own_bundles_confirm() -> None:
    broker, bundler = held_broker()
    publishing = [bundler.post("q", b"x") for _ in range(5)]
    await until(lambda: sum(len(bodies) for _, bodies in broker.sent) == 5)
    assert not any(task.done() for task in publishing)
    broker.confirm.set()
    await asyncio.gather(*publishing)


async def test_a_failed_send_fails_every_publish_in_that_bundle() -> None:
    broker = Broker()
    broker.fail = TransportError("broker gone")
    bundler = Bundler(broker, max_bytes=1 << 20)
    results = await asyncio.gather(*(bundler.post("q", b"x") for _ in range(10)),
                                   return_exceptions=True)
    assert all(isinstance(r, TransportError) for r in results)
    broker.fail = None
    await bundler.post("q", b"after")  # the queue is usable again
    assert broker.sent[-1] == ("q", [b"after"])


async def test_a_cancelled_publish_still_waiting_is_not_sent() -> None:
    broker, bundler = held_broker()
    first = []

    def sent(count: int) -> bool:
        return len(broker.sent) == count

    for n in (1, 2):  # two bundles being sent: later publishes wait
        first.append(bundler.post("q", b"first"))
        await until(partial(sent, n))
    cancelled = bundler.post("q", b"cancelled")
    kept = bundler.post("q", b"kept")
    await until(lambda: waiting(bundler, "q") == 2)
    cancelled.cancel()
    broker.confirm.set()
    await asyncio.gather(*first, kept)
    assert [bodies for _, bodies in broker.sent][-1] == [b"kept"]


async def test_close_fails_the_publishes_being_sent_and_those_waiting() -> None:
    broker, bundler = held_broker()
    publishing = []

    def sent_last(body: bytes) -> bool:
        return bool(broker.sent) and broker.sent[-1] == ("q", [body])

    for body in (b"a", b"b"):  # two bundles being sent ...
        publishing.append(bundler.post("q", body))
        await until(partial(sent_last, body))
    publishing.append(bundler.post("q", b"waits"))
    await until(lambda: waiting(bundler, "q") == 1)  # ... the third waits
    assert [bodies for _, bodies in broker.sent] == [[b"a"], [b"b"]]
    await bundler.close()
    for task in publishing:
        with pytest.raises(TransportError, match="the transport closed"):
            await task
