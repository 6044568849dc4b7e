"""Alerts POSTed to webhooks (SPEC E8), on every store and its injected clock, to a real
HTTP receiver on 127.0.0.1 (support/receiver.py).

Each pass of the deliverer (`deliver()`) returns once its POSTs were answered and
recorded, so what the receiver got after it is final: a POST that was not sent
is not on its way. Backoffs and leases pass by moving the store's clock.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from sasflow.alert_delivery import AlertDeliverer
from sasflow.errors import StoreError
from sasflow.model import isoformat
from sasflow.store import Store
from sasflow.store.records import Alert, Instance
from sasflow.supervisor import Supervisor
from sasflow.webhooks import configured_webhooks, verify_signature
from support.ports import free_port
from support.receiver import Receiver
from support.stores import ORDER, PLANS, Clock, StoreFactory, claim_one, submitted

SECRET = "whsec-test-0123456789"
DAY = 86400.0


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with Receiver() as started:
        yield started


def deliverer(store: Any, *urls: str, **options: Any) -> AlertDeliverer:
    webhooks = configured_webhooks(urls, SECRET)
    assert webhooks is not None
    return AlertDeliverer(store, webhooks, **options)


@pytest.fixture
async def delivery(store: Store, receiver: Receiver) -> AsyncIterator[AlertDeliverer]:
    async with deliverer(store, receiver.url) as started:
        yield started


async def raise_alert(store: Store, clock: Clock, task_id: str = "a") -> Alert:
    """A task's step refused for good: the task goes to error with an alert (E8)."""
    plan = PLANS["alerting"]
    await submitted(store, task_id, workflow="alerting")
    task = await claim_one(store, "s1", {"alerting": plan})
    assert await store.apply(plan.reply(task, "s1", False, None, "card declined", clock.now))
    alert = (await store.alerts())[-1]
    assert alert.task_id == task_id
    return alert


async def test_an_alert_is_posted_once_with_its_fields_signed(
        store: Store, clock: Clock, receiver: Receiver, delivery: AlertDeliverer) -> None:
    """The POST carries the alert's fields as JSON, its id in a header, and a signature
    a receiver verifies (and that a tampered body fails); it is recorded delivered and
    not sent again."""
    alert = await raise_alert(store, clock)
    assert await delivery.deliver() == 1
    [post] = receiver.wait_for(1)
    assert post.headers["content-type"] == "application/json"
    assert post.alert_id == alert.id
    assert post.json() == {"id": alert.id, "task_id": "a", "step": alert.step,
                           "agent": alert.agent, "at": isoformat(alert.at),
                           "message": alert.message, "incident": None, "count": None,
                           "resolved_at": None}
    assert post.json()["at"].endswith("+00:00") and alert.step == "reserve"
    signature = post.headers["x-sasflow-signature"]
    assert verify_signature(SECRET, signature, post.body)
    assert not verify_signature(SECRET, signature, post.body.replace(b"reserve", b"reservE"))
    assert not verify_signature("another secret", signature, post.body)

    assert await delivery.deliver() == 0
    [record] = await store.alert_deliveries(alert.id)
    assert (record.url, record.tries, record.delivered_at, record.gave_up_at) == (
        receiver.url, 1, clock.now, None)
    assert receiver.alert_ids == [alert.id]


async def test_a_500_is_tried_again_after_its_backoff_and_delivered_once(
        store: Store, clock: Clock, receiver: Receiver, delivery: AlertDeliverer) -> None:
    alert = await raise_alert(store, clock)
    receiver.answer(500)
    assert await delivery.deliver() == 1
    [failed] = await store.alert_deliveries(alert.id)
    assert failed.last_error == "HTTP 500 Internal Server Error"
    assert failed.delivered_at is None and failed.gave_up_at is None
    assert clock.now + 0.5 <= failed.due_at <= clock.now + 1.0  # the first backoff: 0.5-1 s
    assert await delivery.deliver() == 0  # not before its backoff has passed
    assert receiver.alert_ids == [alert.id]

    clock.now = failed.due_at
    assert await delivery.deliver() == 1
    assert await delivery.deliver() == 0
    assert receiver.alert_ids == [alert.id, alert.id]
    [record] = await store.alert_deliveries(alert.id)
    assert (record.tries, record.delivered_at, record.gave_up_at) == (2, clock.now, None)
    assert record.last_error == "HTTP 500 Internal Server Error"  # the last failure's


async def test_a_400_is_not_tried_again_and_is_recorded_and_logged_once(
        store: Store, clock: Clock, receiver: Receiver, delivery: AlertDeliverer,
        caplog: pytest.LogCaptureFixture) -> None:
    alert = await raise_alert(store, clock)
    receiver.answer(400)
    with caplog.at_level(logging.INFO, logger="sasflow.alerts"):
        assert await delivery.deliver() == 1
        clock.advance(3600)
        assert await delivery.deliver() == 0
    assert receiver.alert_ids == [alert.id]
    [record] = await store.alert_deliveries(alert.id)
    assert (record.tries, record.delivered_at, record.last_error) == (
        1, None, "HTTP 400 Bad Request")
    assert record.gave_up_at == clock.now - 3600
    [line] = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert line == f"alert {alert.id} not delivered to {receiver.url}: HTTP 400 Bad Request" \
                   " (not retried)"


async def test_failures_are_tried_again_within_the_attempts_then_logged_once(
        store: Store, clock: Clock, receiver: Receiver,
        caplog: pytest.LogCaptureFixture) -> None:
    """5xx and 429 are tried again, up to `attempts` POSTs; the give-up is one log line
    for the alert, not one per attempt."""
    alert = await raise_alert(store, clock)
    receiver.answer(503, 429, 502)
    async with deliverer(store, receiver.url, attempts=3) as delivery:
        with caplog.at_level(logging.DEBUG, logger="sasflow.alerts"):
            for _ in range(3):
                assert await delivery.deliver() == 1
                [record] = await store.alert_deliveries(alert.id)
                clock.now = max(clock.now, record.due_at)
            assert await delivery.deliver() == 0
    assert receiver.alert_ids == [alert.id] * 3
    assert (record.tries, record.delivered_at, record.gave_up_at, record.last_error) == (
        3, None, record.due_at, "HTTP 502 Bad Gateway")
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warnings == [f"alert {alert.id} not delivered to {receiver.url} after 3"
                        " attempt(s), given up: HTTP 502 Bad Gateway"]


async def test_a_receiver_that_is_down_or_silent_is_tried_again(
        store: Store, clock: Clock, receiver: Receiver) -> None:
    """A refused connection and a POST unanswered within its timeout are failures worth
    trying again, not refusals."""
    closed = f"http://127.0.0.1:{free_port()}/hook"  # nothing listens there
    alert = await raise_alert(store, clock)
    async with deliverer(store, closed, receiver.url, timeout=0.2) as delivery:
        receiver.hold()
        assert await delivery.deliver() == 2
        receiver.release()
        records = {r.url: r for r in await store.alert_deliveries(alert.id)}
    down, silent = records[closed], records[receiver.url]
    for record in (down, silent):
        assert record.gave_up_at is None and record.delivered_at is None
        assert record.due_at > clock.now and record.last_error
    assert silent.last_error == "no answer within 0.2s"
    assert (down.last_error or "").startswith("ConnectError: ")


async def test_an_acknowledged_alert_is_never_sent(
        store: Store, clock: Clock, receiver: Receiver, delivery: AlertDeliverer) -> None:
    seen = await raise_alert(store, clock, "seen")
    await store.acknowledge_alert(seen.id, by="operator:ann", why="card replaced")
    fresh = await raise_alert(store, clock, "fresh")
    assert await delivery.deliver() == 1
    assert receiver.alert_ids == [fresh.id]
    assert await store.alert_deliveries(seen.id) == []


async def test_retries_stop_once_the_alert_is_acknowledged(
        store: Store, clock: Clock, receiver: Receiver, delivery: AlertDeliverer) -> None:
    alert = await raise_alert(store, clock)
    receiver.answer(503)
    assert await delivery.deliver() == 1
    [failed] = await store.alert_deliveries(alert.id)
    await store.acknowledge_alert(alert.id, by="operator:ann", why="on it")
    clock.now = failed.due_at + 60
    later = await raise_alert(store, clock, "later")
    assert await delivery.deliver() == 1  # the later alert only
    assert receiver.alert_ids == [alert.id, later.id]
    assert await store.alert_deliveries(alert.id) == [failed]


async def test_a_new_deliverer_on_the_same_store_resends_nothing_delivered(
        make_store: StoreFactory, clock: Clock, receiver: Receiver) -> None:
    """A restart (a new process, a new leader: another store instance on the same data)
    carries on from the delivery records."""
    first_store = make_store(clock=clock)
    first = await raise_alert(first_store, clock, "first")
    async with deliverer(first_store, receiver.url) as delivery:
        assert await delivery.deliver() == 1
    second_store = make_store(clock=clock)
    second = await raise_alert(second_store, clock, "second")
    async with deliverer(second_store, receiver.url) as delivery:
        assert await delivery.deliver() == 1
        assert await delivery.deliver() == 0
    assert receiver.alert_ids == [first.id, second.id]


async def test_a_post_taken_by_a_deliverer_that_died_goes_out_once_its_lease_ends(
        store: Store, clock: Clock, receiver: Receiver, delivery: AlertDeliverer) -> None:
    """Between its POST and its record, a deliverer may die: what it took is leased, so no
    other sends it meanwhile, then it is sent once more (at least once: the receiver
    dedupes by the alert id)."""
    alert = await raise_alert(store, clock)
    [taken] = await store.take_alert_deliveries([receiver.url], 10, lease=40.0, attempts=10,
                                                max_age=DAY)
    assert (taken.alert, taken.attempt) == (alert, 1)
    assert await delivery.deliver() == 0
    clock.advance(40.001)
    assert await delivery.deliver() == 1
    assert await delivery.deliver() == 0
    assert receiver.alert_ids == [alert.id]
    [record] = await store.alert_deliveries(alert.id)
    assert (record.tries, record.delivered_at) == (2, clock.now)
    # what the dead one would record now is fenced off by the later attempt
    assert not await store.record_alert_delivery(taken, error="late", retry_at=clock.now)
    assert await store.alert_deliveries(alert.id) == [record]


async def test_an_incident_seen_by_many_sweeps_is_delivered_once(
        store: Store, clock: Clock, receiver: Receiver) -> None:
    """An incident is one alert row however many censuses see it: one POST."""
    await submitted(store, "waiting")  # at a step of `inventory`, which nobody serves
    await store.beat(Instance(instance_id="w1", host="h", pid=1, roles=["scheduler", "agent"],
                              agents=["payments", "shipping"],
                              workflows={"order": ORDER.version}))
    supervisor = Supervisor(store, PLANS, instance_id="sup", census_interval=1.0,
                            instance_ttl=DAY)
    async with deliverer(store, receiver.url,
                         leading=lambda: supervisor.lease_epoch is not None) as delivery:
        for _ in range(6):
            clock.advance(1.5)
            await supervisor.tick()
            await delivery.deliver()
    [incident] = await store.incidents()
    assert incident.incident == "agent:inventory"
    [post] = receiver.wait_for(1)
    assert receiver.alert_ids == [incident.id]
    assert post.json()["incident"] == "agent:inventory" and post.json()["count"] == 1


async def test_only_a_leading_deliverer_sends(store: Store, clock: Clock) -> None:
    """Run side by side, the deliverer whose supervisor stands by sends nothing, however
    often it looks."""
    with Receiver() as led, Receiver() as standing_by:
        leader = deliverer(store, led.url, interval=0.01)
        standby = deliverer(store, standing_by.url, interval=0.01, leading=lambda: False)
        running = [asyncio.create_task(d.run()) for d in (leader, standby)]
        try:
            alert = await raise_alert(store, clock)
            await asyncio.to_thread(led.wait_for, 1)
            looked = standby.looks
            while standby.looks < looked + 3:  # it looked again since the leader sent
                await asyncio.sleep(0.01)
        finally:
            for task in running:
                task.cancel()
            await asyncio.gather(*running, return_exceptions=True)
        assert led.alert_ids == [alert.id]
        assert standing_by.requests == []


class _Failing:
    """A store whose first `failures` takes fail, as a store in an outage does."""

    def __init__(self, store: Store, failures: int) -> None:
        self._store, self.failures = store, failures

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def take_alert_deliveries(self, *args: Any, **kwargs: Any) -> Any:
        if self.failures:
            self.failures -= 1
            raise (StoreError("the store is down") if self.failures else RuntimeError("bug"))
        return await self._store.take_alert_deliveries(*args, **kwargs)


async def test_errors_never_end_the_deliverer(store: Store, clock: Clock, receiver: Receiver,
                                              caplog: pytest.LogCaptureFixture) -> None:
    alert = await raise_alert(store, clock)
    failing = _Failing(store, failures=3)
    running = asyncio.create_task(deliverer(failing, receiver.url, interval=0.01).run())
    try:
        await asyncio.to_thread(receiver.wait_for, 1)
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
    assert receiver.alert_ids == [alert.id]
    messages = [r.getMessage() for r in caplog.records if r.name == "sasflow.alerts"]
    assert messages[:3] == ["alert delivery: the store is down"] * 2 + [
        "alert delivery failed"]
