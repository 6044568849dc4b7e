"""What the Redis Streams transport adds to the transport contract (real Redis).

Redelivery of what a dead consumer left unacked (XAUTOCLAIM after the visibility
timeout), a slow live consumer keeping its message, reconnecting after Redis
drops the connections, no streams left behind, and thousands of concurrent
publishes sharing pipelines (also when their connection is killed). Keys live in database 15
under a prefix private to each test, deleted afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from sasflow import App, TaskState
from sasflow.errors import MissingExtraError, TransportError
from sasflow.transport import open_transport
from sasflow.transport.redis import GROUP, MAX_CONNECTIONS, RedisTransport
from support import APPS
from support.process import Process
from support.servers import PrivateRedis

SERVER = "redis://127.0.0.1:6379/15"
SHOP_FILE = APPS / "shopapp.py"
SHOP = f"{SHOP_FILE}:app"
OUTAGE = 3.0  # seconds Redis stays down in the restart test, once its loss was noticed
VISIBILITY = 0.3  # seconds: short, so a dead consumer's message comes back quickly
HANG_GUARD = 60.0  # only a hang fails on it: a loaded machine is slow, never this slow


async def settled(admin: aioredis.Redis, key: str) -> None:
    """Until every entry of the stream is acked and gone: nothing is left that could
    still be delivered (or delivered again)."""
    async with asyncio.timeout(HANG_GUARD):
        while (await admin.xpending(key, GROUP))["pending"] or await admin.xlen(key):
            await asyncio.sleep(0.02)

Make = Callable[..., RedisTransport]


@pytest.fixture
async def admin(redis_server: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(SERVER)
    yield client
    await client.aclose()


@pytest.fixture
async def make(admin: aioredis.Redis) -> AsyncIterator[Make]:
    """Transports sharing this test's key prefix; its keys are deleted afterwards."""
    prefix = f"sasflow-test-{uuid.uuid4().hex[:12]}:"
    opened: list[RedisTransport] = []

    def open_one(visibility_timeout: float = VISIBILITY) -> RedisTransport:
        name = f"t{uuid.uuid4().hex[:8]}"
        transport = RedisTransport(f"{SERVER}?prefix={prefix}&client_name={name}",
                                   visibility_timeout=visibility_timeout)
        opened.append(transport)
        return transport

    yield open_one
    for transport in opened:
        await transport.close()
    keys = [k async for k in admin.scan_iter(match=f"{prefix}*")]
    if keys:
        await admin.delete(*keys)


class Consumers:
    def __init__(self) -> None:
        self.tasks: list[asyncio.Task[None]] = []

    def start(self, transport: RedisTransport, queue: str,
              handler: Callable[[bytes], Awaitable[None]], prefetch: int = 1) -> None:
        self.tasks.append(asyncio.create_task(
            transport.consume(queue, handler, prefetch=prefetch)))

    async def stop_all(self) -> None:
        for task in self.tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


@pytest.fixture
async def consumers(make: Make) -> AsyncIterator[Consumers]:
    """Consumers stopped before their transports close (hence the dependency on make)."""
    started = Consumers()
    yield started
    await started.stop_all()


class Collector:
    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.changed = asyncio.Event()

    async def __call__(self, body: bytes) -> None:
        self.bodies.append(body)
        self.changed.set()

    async def until(self, count: int, seconds: float = HANG_GUARD) -> list[bytes]:
        async with asyncio.timeout(seconds):
            while len(self.bodies) < count:
                self.changed.clear()
                await self.changed.wait()
        return self.bodies


async def kill_connections(admin: aioredis.Redis, transport: RedisTransport) -> int:
    """CLIENT KILL every connection of `transport` (found by its client name)."""
    name = transport._redis.connection_pool.connection_kwargs["client_name"]
    killed = 0
    for client in await admin.client_list():
        if client.get("name") == name:
            await admin.client_kill_filter(_id=client["id"])
            killed += 1
    return killed


async def test_a_dead_consumers_unacked_message_is_taken_over(
        make: Make, admin: aioredis.Redis, consumers: Consumers) -> None:
    """An entry read by a consumer that died unacked is redelivered after the visibility
    timeout (XAUTOCLAIM), not before, and then acked."""
    transport = make()
    key = transport.prefix + "requests"
    await transport.publish("requests", b"orphan")
    # a consumer of another process reads it and dies before acking
    await admin.xgroup_create(key, GROUP, id="0", mkstream=True)
    await admin.xreadgroup(GROUP, "dead-process", {key: ">"}, count=1)
    assert (await admin.xpending(key, GROUP))["pending"] == 1

    got = Collector()
    loop = asyncio.get_running_loop()
    started = loop.time()
    consumers.start(transport, "requests", got)
    assert await got.until(1) == [b"orphan"]
    assert loop.time() - started >= VISIBILITY * 0.9  # not stolen while possibly alive
    await settled(admin, key)
    assert got.bodies == [b"orphan"]


async def test_a_slow_live_consumer_keeps_its_message(make: Make, admin: aioredis.Redis,
                                                      consumers: Consumers) -> None:
    """A handler running for several visibility timeouts is not mistaken for a dead
    consumer: another consumer never receives its message, though it took over a dead
    consumer's entry that was delivered after it."""
    # a visibility timeout no stall of a loaded machine reaches: the live consumer's
    # heartbeat (every third of it) is never late enough to lose its entry
    visibility = 3.0
    slow_host, other_host = make(visibility), make(visibility)
    key = slow_host.prefix + "requests"
    release, started = asyncio.Event(), asyncio.Event()
    handled: list[bytes] = []

    async def slow(body: bytes) -> None:
        started.set()
        await release.wait()
        handled.append(body)

    other = Collector()
    consumers.start(slow_host, "requests", slow, prefetch=1)  # busy: it reads no more
    await slow_host.publish("requests", b"long job")
    async with asyncio.timeout(HANG_GUARD):
        await started.wait()
    # then an entry read by a consumer that died: idle for the visibility timeout, it is
    # taken over by the sweep of the other consumer, which would take the long job
    # first (older, and idle longer) were it not kept fresh
    await slow_host.publish("requests", b"orphan")
    await admin.xreadgroup(GROUP, "dead-process", {key: ">"}, count=1)
    consumers.start(other_host, "requests", other)
    assert await other.until(1) == [b"orphan"]
    release.set()
    async with asyncio.timeout(HANG_GUARD):
        while not handled:
            await asyncio.sleep(0.02)
    await settled(admin, key)
    assert (other.bodies, handled) == ([b"orphan"], [b"long job"])


async def test_consuming_survives_its_connections_being_killed(
        make: Make, admin: aioredis.Redis, consumers: Consumers) -> None:
    """After CLIENT KILL of the transport's connections, the consumer reconnects: the
    message in flight is acked once, later messages are delivered, none twice."""
    transport = make(visibility_timeout=30.0)  # redelivery must come from reconnecting
    key = transport.prefix + "requests"
    release, started = asyncio.Event(), asyncio.Event()
    got: list[bytes] = []
    more = asyncio.Event()

    async def handler(body: bytes) -> None:
        if body == b"in flight":
            started.set()
            await release.wait()
        got.append(body)
        if len(got) >= 3:
            more.set()

    consumers.start(transport, "requests", handler, prefetch=2)
    await transport.publish("requests", b"in flight")
    async with asyncio.timeout(HANG_GUARD):
        await started.wait()
    assert await kill_connections(admin, transport) >= 1
    release.set()  # its ack meets a dead connection first
    await transport.publish("requests", b"after kill 1")
    await transport.publish("requests", b"after kill 2")
    async with asyncio.timeout(HANG_GUARD):
        await more.wait()
    await settled(admin, key)  # nothing left to deliver again
    assert sorted(got) == [b"after kill 1", b"after kill 2", b"in flight"]


async def test_a_message_received_over_a_killed_connection_is_recovered(
        make: Make, admin: aioredis.Redis, consumers: Consumers) -> None:
    """Connections killed repeatedly while messages flow: every message is still
    handled, without waiting for the visibility timeout."""
    transport = make(visibility_timeout=30.0)
    got = Collector()
    consumers.start(transport, "requests", got, prefetch=4)
    sent = [f"m{n}".encode() for n in range(30)]
    for n, body in enumerate(sent):
        await transport.publish("requests", body)
        if n % 10 == 5:
            await kill_connections(admin, transport)
    assert sorted(set(await got.until(30))) == sorted(sent)


async def test_an_unused_empty_stream_is_deleted_when_its_last_consumer_stops(
        make: Make, admin: aioredis.Redis, consumers: Consumers) -> None:
    """Per-instance reply queues leave nothing behind in Redis once drained and unused."""
    transport = make()
    key = transport.prefix + "reply.s1"
    got = Collector()
    consumers.start(transport, "reply.s1", got)
    await transport.publish("reply.s1", b"reply")
    await got.until(1)
    assert await admin.exists(key)
    await consumers.stop_all()
    assert not await admin.exists(key)


async def test_a_stream_with_messages_is_kept_when_its_consumer_stops(
        make: Make, admin: aioredis.Redis, consumers: Consumers) -> None:
    """Stopping a consumer never deletes messages still waiting for the next one."""
    transport = make()
    key = transport.prefix + "requests"
    consumers.start(transport, "requests", Collector())
    async with asyncio.timeout(HANG_GUARD):  # the consumer has made its stream
        while not await admin.exists(key):
            await asyncio.sleep(0.01)
    await consumers.stop_all()
    await transport.publish("requests", b"waiting")
    assert await admin.xlen(key) == 1


async def connections_of(admin: aioredis.Redis, transport: RedisTransport) -> int:
    name = transport._redis.connection_pool.connection_kwargs["client_name"]
    return sum(1 for client in await admin.client_list() if client.get("name") == name)


async def test_thousands_of_concurrent_redis_publishes_share_a_few_connections(
        make: Make, admin: aioredis.Redis, consumers: Consumers) -> None:
    """2,000 publishes at once all succeed (no pool exhaustion) and are consumed exactly
    once, while a consumer with a large prefetch acks concurrently on the same transport;
    the commands travel in shared pipelines over a bounded number of connections."""
    transport = make(visibility_timeout=30.0)
    key = transport.prefix + "requests"
    got = Collector()
    consumers.start(transport, "requests", got, prefetch=512)
    sent = [f"m{n}".encode() for n in range(2000)]
    async with asyncio.timeout(HANG_GUARD), asyncio.TaskGroup() as publishing:
        for body in sent:  # a failure stops the others (a TaskGroup), leaving nothing behind
            publishing.create_task(transport.publish("requests", body))
    assert sorted(await got.until(len(sent))) == sorted(sent)
    await settled(admin, key)  # the last acks are flushed: nothing left to deliver again
    assert len(got.bodies) == len(sent)
    stats = transport._batch.stats
    assert stats.lost_flushes == 0
    assert stats.flushes < len(sent) // 4  # publishes and acks went many at a time
    assert await connections_of(admin, transport) <= MAX_CONNECTIONS + 1  # + the reader


async def test_redis_publishes_in_a_killed_pipeline_are_retried_or_fail_never_lost(
        make: Make, admin: aioredis.Redis, consumers: Consumers) -> None:
    """CLIENT KILL while concurrent publishes wait in a pipeline: each one either returns
    (after retrying) and is then delivered, or raises TransportError; none is lost."""
    publisher, receiver = make(visibility_timeout=30.0), make(visibility_timeout=30.0)
    got = Collector()
    consumers.start(receiver, "requests", got, prefetch=256)
    returned: list[bytes] = []
    failed = 0

    async def publish(body: bytes) -> None:
        nonlocal failed
        try:
            await publisher.publish("requests", body)
        except TransportError:
            failed += 1
        else:
            returned.append(body)

    rounds = 0
    async with asyncio.timeout(60.0):
        # until a pipeline was caught by the kill with replies still unread
        while publisher._batch.stats.lost_flushes == 0 and rounds < 10:
            rounds += 1
            batch = asyncio.gather(*(publish(f"r{rounds}.{n}".encode())
                                     for n in range(1000)))
            while not batch.done():
                await kill_connections(admin, publisher)
                await asyncio.sleep(0.003)
            await batch  # anything but TransportError fails the test here
    assert publisher._batch.stats.lost_flushes >= 1
    assert returned  # retrying made most of them go through
    assert len(returned) + failed == 1000 * rounds
    wanted = set(returned)
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(HANG_GUARD):
            while not wanted <= set(got.bodies):
                got.changed.clear()
                await got.changed.wait()
    missing = wanted - set(got.bodies)
    assert not missing, f"{len(missing)} publishes returned but were never delivered"


def test_a_redis_url_without_redis_py_names_the_extra(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Without redis-py installed, a redis:// URL says which pip install line is needed."""
    monkeypatch.setitem(sys.modules, "redis", None)
    monkeypatch.delitem(sys.modules, "sasflow.transport.redis")
    with pytest.raises(MissingExtraError, match=r"pip install 'sasflow\[redis\]'"):
        open_transport("redis://127.0.0.1:6379/15")


async def test_takeovers_of_a_dead_consumers_entry_count_towards_the_bound(
        make: Make, admin: aioredis.Redis, consumers: Consumers) -> None:
    """Redis counts each delivery of an entry (XPENDING's times-delivered grows with every
    takeover of a dead consumer's entry): an entry already delivered four times to
    consumers that died is, on its fifth delivery whose handler fails, a dead letter
    with deliveries = 5, its handler called once here (R3: bounded under crashes too)."""
    transport = make()
    queue = f"poison-{uuid.uuid4().hex[:8]}"
    key = transport._key(queue)
    await admin.xgroup_create(key, GROUP, id="0", mkstream=True)
    entry = await admin.xadd(key, {"body": b"crashes every consumer"})
    # a consumer that read it and died, then three more that took it over and died
    await admin.xreadgroup(GROUP, "ghost", {key: ">"}, count=1)
    await admin.xclaim(key, GROUP, "ghost-2", 0, [entry], retrycount=4)
    calls = 0

    async def crashing(body: bytes) -> None:
        nonlocal calls
        calls += 1
        raise RuntimeError("boom")

    consumers.start(transport, queue, crashing)
    async with asyncio.timeout(HANG_GUARD):
        while not (letters := await transport.dead_letters()):
            await asyncio.sleep(0.02)
    assert [(d.queue, d.deliveries, d.body) for d in letters] == [
        (queue, 5, b"crashes every consumer")]
    assert calls == 1
    assert await admin.xlen(key) == 0  # taken off its stream, in the same script


@pytest.fixture
def private_redis(redis_server: str, tmp_path: Path) -> Iterator[PrivateRedis]:
    """A redis-server of this test's own (on another port, keeping an fsynced
    append-only file), which it may stop and start again."""
    server = PrivateRedis(tmp_path / "redis").start()
    yield server
    server.close()


def wait_for(predicate: Callable[[], bool], what: str, seconds: float = 60.0) -> None:
    """Poll `predicate` until it holds (a hang guard, not a claim about speed)."""
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.05)


def test_a_redis_restart_under_a_running_worker_logs_a_few_lines_and_work_flows_after(
        private_redis: PrivateRedis, tmp_path: Path) -> None:
    """R2: Redis stopped for seconds under a worker that publishes and
    consumes, then started again. Before, the log grew by ~1,500 tracebacks (a task
    driver's per failed publish) and tasks in flight failed. Now the transport logs one
    line when the connection is lost and one when every consumer is back, no traceback;
    every task, those submitted during the outage too, is processed."""
    store = f"sqlite:///{tmp_path / 'shop.db'}"
    log = tmp_path / "worker.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SASFLOW_")}
    worker = Process.spawn(
        "restarted", [sys.executable, "-m", "sasflow.cli", "worker", SHOP, "--store", store,
                      "--transport", private_redis.url, "--instance-id", "restarted"],
        log, env=env)
    shop = load_shop(store)
    try:
        wait_for(lambda: "starting" in log.read_text(), "the worker to start")
        submitted = [shop.submit("order", {}) for _ in range(20)]
        wait_for(lambda: all(shop.get(t).state is TaskState.PROCESSED for t in submitted),
                 "the first orders")
        lines_before = len(log.read_text().splitlines())
        private_redis.kill()
        # the outage is seen (the positive signal), while orders come in
        wait_for(lambda: "is unreachable" in log.read_text(), "the outage noticed")
        during = [shop.submit("order", {}) for _ in range(20)]
        time.sleep(OUTAGE)  # the fault itself: down as long as a restart takes
        private_redis.start()
        after = [shop.submit("order", {}) for _ in range(20)]
        wait_for(lambda: all(shop.get(t).state is TaskState.PROCESSED
                             for t in [*during, *after]), "every order after the restart")
        text = log.read_text()
        assert text.count("Traceback") == 0, text[-3000:]
        outage_lines = text.splitlines()[lines_before:]
        # one transport under four consumers (replies, three agents' requests): lost,
        # back, and at most a reminder; nothing per call, nothing per consumer
        assert len(outage_lines) <= 3, outage_lines
        assert sum("is unreachable" in line for line in outage_lines) == 1, outage_lines
        assert sum("reachable again" in line for line in outage_lines) == 1, outage_lines
    finally:
        shop.close()
        if worker.stop(timeout=30) is None:
            pytest.fail(f"the worker did not stop on SIGTERM:\n{worker.tail()}")


def load_shop(store: str) -> App:
    """The shop's App, declared by the same file the worker runs, on this test's store."""
    spec = importlib.util.spec_from_file_location("restart_shopapp", SHOP_FILE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    shop: App = module.app
    shop.configure(store=store)
    return shop
