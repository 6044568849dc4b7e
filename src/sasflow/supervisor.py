"""The Supervisor: finds units whose complete-by passed and requests recovery
(SPEC S7, S8, E9, E10, M3).

It never runs a step. It moves state with one fenced compare-and-set per expired
task (`epoch = e AND state = s AND complete_by < now`), so two supervisors can
never count the same expiry twice, and it leaves the atomic claim as the only
way back into execution: below the workflow's `max_failures` the task is
released (unlocked, pending, claimable after a backoff) for any scheduler to
take; at the threshold the workflow's policy applies (error + alert,
compensate, or park).

It also recovers, without waiting for their complete-by, the units held by a
worker instance that is gone: stopped, or silent past its heartbeat lease (R2).
A step with a five-minute timeout whose worker was SIGKILLed is then retried
within the lease and an interval, not five minutes later. The same fences hold
(owner, epoch, state, the unit's complete-by, the supervisors' lease): if the
"gone" instance was only paused and went on meanwhile, nothing is written; if
it wakes after the release, its writes fail their fence and its agents' late
replies carry the old epoch and are dropped. The released unit runs again only
through a claim, under a new epoch, so no two runs ever share an epoch.

Several supervisors may run; a lease with an expiry and a fencing epoch elects
the one that sweeps. When the leader dies its lease runs out and another takes
over. Each recovery is also fenced with the lease's epoch: a leader that was
paused and deposed meanwhile writes nothing when it wakes (M3).

It sweeps only the workflows it declares, by name (R4): tasks of a workflow no
process here knows are never read, however many, so they cannot fill its batch
and hold up the others. It counts the expiries of every version of those
workflows (an expiry reads only the task's own steps), and the release leaves
each task to the schedulers of its own version. What no live process can take
is reported as one alert per incident (incidents.py). Each batch of recoveries
is logged in one line.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping

from sasflow.errors import StoreError
from sasflow.incidents import IncidentWatch
from sasflow.logs import log_context
from sasflow.model import Task
from sasflow.plan import Plan
from sasflow.store.interfaces import SupervisorStore
from sasflow.store.records import Alert
from sasflow.testing import failpoints
from sasflow.transition import LeaseFence, Transition

__all__ = ["LEASE_NAME", "Supervisor"]

log = logging.getLogger("sasflow.supervisor")

LEASE_NAME = "supervisor"
_EXPIRY_SLACK = 0.002  # seconds past a complete-by before looking: it must have passed
_LOGGED_PER_BATCH = 5  # recoveries named in a batch's log line; the rest are counted
_FORGET_EVERY = 3600.0  # seconds between two clean-ups of gone instances' rows


class Supervisor:
    def __init__(self, store: SupervisorStore, plans: Mapping[str, Plan], *, instance_id: str,
                 interval: float = 1.0, batch: int = 1000,
                 on_applied: Callable[[Transition], None] = lambda t: None,
                 on_alert: Callable[[Alert], None] = lambda a: None,
                 census_interval: float | None = None, instance_ttl: float | None = None,
                 realert_after: float = 3600.0, forget_instances_after: float = 86400.0,
                 incident_grace: float = 0.0) -> None:
        """`census_interval` (default 10 intervals): how often the leader compares what
        unfinished tasks need with what live instances declare; `instance_ttl`: how
        old a heartbeat may be for its instance to count as live (by default its own
        lease, after which its tasks are released as gone); `realert_after`: when
        an incident still there is raised again (R4, incidents.py); `incident_grace`:
        how long an incident must last before it is raised (besides two censuses), so
        that a worker still starting is not reported absent;
        `forget_instances_after`: how long after its last beat the row of an instance
        that holds nothing is deleted (once an hour, by the leader)."""
        if interval <= 0:
            raise ValueError("the supervisor interval must be > 0")
        self.store = store
        self.plans = plans
        self.instance_id = instance_id
        self.interval = interval
        self.batch = batch
        self.on_applied = on_applied
        self.lease_epoch: int | None = None
        self.forget_instances_after = forget_instances_after
        self._forget_at = 0.0  # the store's clock: when the next clean-up is due
        self.recovered = 0  # expiries this instance has acted on
        self.incidents = IncidentWatch(
            store, plans, every=census_interval if census_interval is not None
            else 10 * interval, instance_ttl=instance_ttl, realert_after=realert_after,
            on_alert=on_alert, grace=incident_grace)

    @property
    def lease_ttl(self) -> float:
        return max(3 * self.interval, 1.0)

    async def run(self) -> None:
        """Every interval: renew (or try to take) the lease and, leading, sweep.

        Between intervals the leader also wakes when the next complete-by falls
        due, so an expiry is acted on within milliseconds, not up to an interval.
        """
        loop = asyncio.get_running_loop()
        renew_at = loop.time()
        while True:
            try:
                if loop.time() >= renew_at:
                    renew_at = loop.time() + self.interval
                    await self.tick()
                elif self.lease_epoch is not None:
                    await self.sweep()
                delay = renew_at - loop.time()
                if self.lease_epoch is not None:
                    due = await self.store.next_expiry(self.plans)
                    wait = None if due is None else due - self.store.now()
                    if wait is not None and wait > 0:  # (one still expired is left to the interval)
                        delay = min(delay, wait + _EXPIRY_SLACK)
            except StoreError as error:  # the store logs its outage itself: one line here
                log.warning("supervisor %s: tick failed: %s", self.instance_id, error)
                delay = self.interval
            except Exception:  # a store hiccup must not kill the supervisor
                log.exception("supervisor tick failed")
                delay = self.interval
            await asyncio.sleep(max(delay, _EXPIRY_SLACK))

    async def tick(self) -> int:
        """Renew or take the lease; if this instance leads, sweep once and release
        what gone instances hold."""
        epoch = await self.store.acquire_lease(LEASE_NAME, self.instance_id, self.lease_ttl)
        if epoch != self.lease_epoch:
            log.info("supervisor %s: %s", self.instance_id,
                     "leading" if epoch is not None else "standing by")
        self.lease_epoch = epoch
        if epoch is None:
            return 0
        recovered = await self.sweep() + await self.release_orphans()
        await self._forget_gone_instances()
        return recovered

    async def _forget_gone_instances(self) -> None:
        """Delete the rows of instances gone for a day, now and then: pods come and go
        with new ids, and their rows would otherwise pile up for ever."""
        now = self.store.now()
        if now < self._forget_at:
            return
        self._forget_at = now + _FORGET_EVERY
        forgotten = await self.store.forget_instances(now - self.forget_instances_after)
        if forgotten:
            log.info("supervisor %s: forgot %d instance(s) silent for %.0fs or more",
                     self.instance_id, forgotten, self.forget_instances_after)

    async def sweep(self) -> int:
        """Recover every expired unit once; returns how many this call recovered.

        Then, if one is due, the census of incidents (R4).
        """
        # only the workflows declared here, by name: the others cost nothing (R4)
        total = await self._recover(lambda limit: self.store.expired(limit, self.plans),
                                    Plan.expire, "expired")
        await self.incidents.maybe_check()
        return total

    async def release_orphans(self) -> int:
        """Recover every unit held by a gone instance (R2), once an interval: unlike
        expiries, which have a time to wake up for, they are found by looking."""
        return await self._recover(lambda limit: self.store.orphaned(limit, self.plans),
                                   Plan.orphan, "orphaned")

    async def _recover(self, find: Callable[[int], Awaitable[list[Task]]],
                       decide: Callable[[Plan, Task, str, float], Transition],
                       what: str) -> int:
        """Apply `decide` to every task `find` lists, batch after batch."""
        total = 0
        while True:
            expired = await find(self.batch)
            if not expired:
                break
            transitions = []
            for task in expired:
                transition = decide(self.plans[task.workflow], task, self.instance_id,
                                    self.store.now())
                if self.lease_epoch is not None:  # fenced: a deposed leader writes nothing
                    transition.lease = LeaseFence(LEASE_NAME, self.instance_id,
                                                  self.lease_epoch)
                transitions.append(transition)
            # applied together: the store group-commits them
            if failpoints.ARMED: await failpoints.hit("supervisor.before_recover")  # noqa: E701
            applied = await asyncio.gather(*(self.store.apply(t) for t in transitions))
            done = [t for t, ok in zip(transitions, applied, strict=True) if ok]
            for transition in done:
                # what it sets off (an alert, an application's callback) names its task
                with log_context(task_id=transition.task_id):
                    self.on_applied(transition)
            self._log_recoveries(done, what)
            total += len(done)
            self.recovered += len(done)
            if len(expired) < self.batch or not done:
                break
        return total

    def _log_recoveries(self, done: list[Transition], what: str) -> None:
        """One line per batch: how many, by outcome, and the first few by task and why."""
        if not done:
            return
        outcomes: dict[str, int] = {}
        for transition in done:
            outcomes[transition.state.value] = outcomes.get(transition.state.value, 0) + 1
        named = "; ".join(f"{t.task_id} ({t.why})" for t in done[:_LOGGED_PER_BATCH])
        more = len(done) - _LOGGED_PER_BATCH
        log.info("recovered %d %s task(s) (%s): %s%s", len(done), what,
                 ", ".join(f"{n} {state}" for state, n in sorted(outcomes.items())), named,
                 f"; and {more} more" if more > 0 else "")
