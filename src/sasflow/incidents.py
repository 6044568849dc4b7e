"""Incidents: unfinished work that no live process can take (SPEC R4).

The supervisor's leader takes a census of what unfinished tasks need (their
workflow versions, and the agents of the units they are at) and compares it with
what live worker instances declare (their heartbeats, `Store.instances`). Each
mismatch is ONE incident, whatever the number of tasks it holds:

* ``workflow:NAME@VERSION``: tasks of a workflow version that no live scheduler
  declares (a renamed workflow, a release that changed its steps, or one whose
  workers are all gone);
* ``agent:NAME``: tasks of declared versions waiting at a unit of an agent that
  no live process serves.

An instance is live while its last beat is within the lease it declared: the
rule by which the supervisor releases a gone instance's tasks (store
select_orphaned), so a dead worker's version is absent from the census as soon
as its tasks are released, not a fixed half minute later.

An incident is raised as one alert (no task id) once it has been seen by two
censuses in a row spanning at least `grace` seconds: a worker that is still
starting, or the replacement of one that died, has that long to beat before its
absence counts (the worker passes its heartbeat lease: no worker is judged absent
sooner than a silent one is judged gone). It is
raised again only if the tasks it holds have doubled since, or after
`realert_after` seconds; its alert is resolved once it is gone. The open alerts
live in the store, so a new leader carries on from them instead of raising again.

Without heartbeats to go on (no live instance has beaten), the versions the
supervisor's own application declares stand for what runs, and agents are not
judged.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from sasflow.plan import Plan
from sasflow.store.interfaces import SupervisorStore
from sasflow.store.records import Alert, Census, Instance

__all__ = ["Incident", "IncidentWatch", "find_incidents"]

log = logging.getLogger("sasflow.supervisor")


@dataclass(frozen=True, slots=True)
class Incident:
    key: str  # workflow:NAME@VERSION or agent:NAME
    count: int  # the unfinished tasks it holds
    message: str
    agent: str | None = None


def find_incidents(census: Census, live: list[Instance],
                   plans: Mapping[str, Plan]) -> dict[str, Incident]:
    """The incidents of this census, given the live instances (and, without any, the
    supervisor's own `plans`)."""
    if live:
        declared = {(name, version) for i in live if "scheduler" in i.roles
                    for name, version in i.workflows.items()}
        served: set[str] | None = {a for i in live if "agent" in i.roles for a in i.agents}
    else:
        declared = {(name, plan.workflow.version) for name, plan in plans.items()}
        served = None
    found: dict[str, Incident] = {}
    for (workflow, version), count in sorted(census.versions.items(), key=str):
        if (workflow, version) in declared:
            continue
        others = sorted(v for name, v in declared if name == workflow)
        if others:
            why = (f"no live worker declares that version (they declare {', '.join(others)});"
                   f" they wait for a worker of version {version}, or for"
                   " `sasflow tasks migrate`")
        else:
            why = "no live worker declares that workflow; they wait for one that does"
        key = f"workflow:{workflow}@{version}"
        found[key] = Incident(key, count, f"{count} unfinished task(s) of workflow"
                                          f" {workflow!r} version {version}: {why}")
    if served is not None:
        waiting: dict[str, int] = {}
        for (workflow, version, agent), count in census.agents.items():
            if (workflow, version) in declared and agent not in served:
                waiting[agent] = waiting.get(agent, 0) + count
        for agent, count in sorted(waiting.items()):
            key = f"agent:{agent}"
            found[key] = Incident(key, count, f"{count} unfinished task(s) wait at a step of"
                                              f" agent {agent!r}, which no live worker serves",
                                  agent=agent)
    return found


class IncidentWatch:
    """The leader's census, taken every `every` seconds (store time), and its alerts."""

    def __init__(self, store: SupervisorStore, plans: Mapping[str, Plan], *, every: float,
                 instance_ttl: float | None, realert_after: float,
                 on_alert: Callable[[Alert], None], grace: float = 0.0) -> None:
        self.store = store
        self.plans = plans
        self.every = every
        self.instance_ttl = instance_ttl
        self.realert_after = realert_after
        self.on_alert = on_alert
        self.grace = grace
        self._due = float("-inf")
        # the incidents of the last census, each with when censuses began to see it
        self._since: dict[str, float] = {}

    async def maybe_check(self) -> None:
        """Take a census if one is due."""
        now = self.store.now()
        if now < self._due:
            return
        self._due = now + self.every
        await self.check()

    async def check(self) -> list[Alert]:
        """Take a census now; raise and resolve alerts; return those raised."""
        now = self.store.now()
        # live as the orphans' release judges it (store/queries.sql select_orphaned): no
        # instance's tasks are released as gone while the census still counts it
        live = [i for i in await self.store.instances()
                if i.stopped_at is None and now - i.beat_at <= (
                    i.lease if self.instance_ttl is None else self.instance_ttl)]
        found = find_incidents(await self.store.census(), live, self.plans)
        seen = self._since
        self._since = {key: seen.get(key, now) for key in found}
        open_alerts = {a.incident: a for a in await self.store.incidents()}
        raised = [Alert(id=0, task_id=None, at=now, message=i.message, agent=i.agent,
                        incident=i.key, count=i.count)
                  for key, i in found.items()
                  if key in seen and now - seen[key] >= self.grace
                  and self._worth_raising(open_alerts.get(key), i, now)]
        resolved = [key for key in open_alerts if key is not None and key not in found]
        await self.store.report_incidents(raised, resolved)
        for alert in raised:
            log.warning("alert: %s", alert.message)
            self.on_alert(alert)
        for key in resolved:
            log.info("resolved: %s", key)
        return raised

    def _worth_raising(self, current: Alert | None, incident: Incident, now: float) -> bool:
        if current is None:
            return True
        grown = incident.count >= 2 * (current.count or 0)
        return grown or now - current.at >= self.realert_after
