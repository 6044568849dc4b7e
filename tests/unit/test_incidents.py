"""Incidents (R4): one alert per kind of work that no live process can take.

A supervisor's IncidentWatch over a real SQLite store on a clock the test moves;
live instances are recorded with the store's own heartbeat verb.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from sasflow.incidents import IncidentWatch
from sasflow.model import idempotency_key
from sasflow.plan import Plan
from sasflow.store.records import Alert, Instance, NewTask
from sasflow.store.sqlite import SQLiteStore
from sasflow.workflow import Step, Workflow

ORDER = Workflow.declare("order", [Step("reserve", "inventory"), Step("charge", "payments")],
                         agents=["inventory", "payments"])
PLANS = {"order": Plan(ORDER, frozenset())}


class Clock:
    now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SQLiteStore]:
    opened = SQLiteStore(str(tmp_path / "store.db"), clock=Clock())
    yield opened
    await opened.close()


def watch(store: SQLiteStore, raised: list[Alert]) -> IncidentWatch:
    return IncidentWatch(store, PLANS, every=10.0, instance_ttl=30.0, realert_after=3600.0,
                         on_alert=raised.append)


async def submit(store: SQLiteStore, *ids: str, workflow: Workflow = ORDER) -> None:
    for task_id in ids:
        await store.submit(NewTask(
            task_id=task_id, workflow=workflow.name, input_json=b"{}",
            steps=[(s.name, s.agent, idempotency_key(task_id, s.name)) for s in workflow.steps]))


def worker(instance_id: str, agents: list[str], roles: list[str] | None = None) -> Instance:
    return Instance(instance_id=instance_id, host="h", pid=1,
                    roles=roles or ["scheduler", "agent"], agents=agents,
                    workflows={"order": ORDER.version})


async def test_an_agent_no_live_worker_serves_raises_one_alert_once_seen_twice(
        store: SQLiteStore) -> None:
    """Tasks waiting at a unit of an agent no live process serves: one alert naming
    it with the count, raised on the second census that finds it, and only then."""
    await submit(store, "a", "b", "c")
    await store.beat(worker("w-1", agents=["payments"]))
    raised: list[Alert] = []
    incidents = watch(store, raised)
    assert await incidents.check() == []  # seen once: it may be a worker still starting
    [alert] = await incidents.check()
    assert (alert.incident, alert.count, alert.agent, alert.task_id) == (
        "agent:inventory", 3, "inventory", None)
    assert "inventory" in alert.message and "3" in alert.message
    assert await incidents.check() == []  # still there, same size: not raised again
    assert raised == [alert]
    [stored] = await store.alerts()
    assert (stored.incident, stored.count, stored.resolved_at) == ("agent:inventory", 3, None)


async def test_an_incident_is_raised_again_when_it_doubles_and_resolved_when_gone(
        store: SQLiteStore) -> None:
    """A stale heartbeat does not count as live; the incident's alert comes again only
    once it holds twice the tasks, and is resolved when no task needs it any more."""
    clock = store.clock
    assert isinstance(clock, Clock)
    await store.beat(worker("w-old", agents=["inventory", "payments"]))
    clock.now += 31  # its heartbeat is now too old
    await store.beat(worker("w-sup", agents=[], roles=["supervisor"]))
    await submit(store, "a", "b")
    incidents = watch(store, [])
    await incidents.check()
    [first] = await incidents.check()
    assert (first.incident, first.count) == (f"workflow:order@{ORDER.version}", 2)
    await submit(store, "c")
    assert await incidents.check() == []  # 3 < 2 x 2
    await submit(store, "d")
    [second] = await incidents.check()
    assert second.count == 4
    await store.beat(worker("w-new", agents=["inventory", "payments"]))
    assert await incidents.check() == []
    assert await store.incidents() == []
    assert [(a.count, a.resolved_at is not None) for a in await store.alerts()] == [
        (2, True), (4, True)]


async def test_without_heartbeats_the_own_declarations_stand_for_what_runs(
        store: SQLiteStore) -> None:
    """No live instance at all: the supervisor judges versions by its own application's,
    and agents not at all."""
    renamed = Workflow.declare("order-old", [Step("reserve", "inventory")],
                               agents=["inventory"])
    await submit(store, "a", "b")
    await submit(store, "x", workflow=renamed)
    incidents = watch(store, [])
    await incidents.check()
    assert [a.incident for a in await incidents.check()] == [
        f"workflow:order-old@{renamed.version}"]


async def test_a_worker_starting_within_the_grace_raises_nothing(store: SQLiteStore) -> None:
    """With a grace, a supervisor that starts before the workers does not report them
    absent while they start; an absence that outlasts the grace is raised at once after
    it, and one that went away and came back waits out a whole grace again."""
    clock = store.clock
    assert isinstance(clock, Clock)
    await store.beat(worker("w-sup", agents=[], roles=["supervisor"]))
    await submit(store, "a")
    incidents = IncidentWatch(store, PLANS, every=1.0, instance_ttl=30.0,
                              realert_after=3600.0, on_alert=lambda a: None, grace=10.0)
    for _ in range(5):  # many censuses, all within the grace
        assert await incidents.check() == []
        clock.now += 2
    await store.beat(worker("w-1", agents=["inventory", "payments"]))  # started in time
    assert await incidents.check() == []
    clock.now += 31  # w-1 silent past the instance ttl: absent again, from now
    await store.beat(worker("w-sup", agents=[], roles=["supervisor"]))
    assert await incidents.check() == []
    clock.now += 9.5
    assert await incidents.check() == []  # the grace restarted when it came back
    clock.now += 0.5
    [alert] = await incidents.check()
    assert alert.incident == f"workflow:order@{ORDER.version}"
    [stored] = await store.alerts()  # the only one, in all that time
    assert (stored.incident, stored.at) == (alert.incident, clock.now)


async def test_an_instance_counts_as_live_for_as_long_as_its_own_lease(
        store: SQLiteStore) -> None:
    """By default the census judges a worker as the orphans' release does: live while its
    last beat is within the lease it declared, gone after. A dead worker's version is
    then reported absent as soon as its tasks are released as gone, not later."""
    clock = store.clock
    assert isinstance(clock, Clock)
    await submit(store, "a")
    await store.beat(Instance(instance_id="w-1", host="h", pid=1, roles=["scheduler", "agent"],
                              agents=["inventory", "payments"],
                              workflows={"order": ORDER.version}, lease=4.0))
    incidents = IncidentWatch(store, PLANS, every=1.0, instance_ttl=None,
                              realert_after=3600.0, on_alert=lambda a: None)
    for _ in range(2):
        clock.now += 2  # its beat 4 s old at most: within its lease
        assert await incidents.check() == []
    clock.now += 0.5  # past it: gone, its tasks released by the next sweep
    await store.beat(worker("w-sup", agents=[], roles=["supervisor"]))  # (the census's own)
    assert await incidents.check() == []  # seen once: it may be a worker still starting
    [alert] = await incidents.check()
    assert alert.incident == f"workflow:order@{ORDER.version}"
