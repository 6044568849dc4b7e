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
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping

from sasflow.errors import StoreError
from sasflow.model import Task
from sasflow.plan import Plan
from sasflow.store.base import Store
from sasflow.transition import LeaseFence, Transition

__all__ = ["LEASE_NAME", "Supervisor"]

log = logging.getLogger("sasflow.supervisor")

LEASE_NAME = "supervisor"
_EXPIRY_SLACK = 0.002  # seconds past a complete-by before looking: it must have passed


class Supervisor:
    def __init__(self, store: Store, plans: Mapping[str, Plan], *, instance_id: str,
                 interval: float = 1.0, batch: int = 1000,
                 on_applied: Callable[[Transition], None] = lambda t: None) -> None:
        if interval <= 0:
            raise ValueError("the supervisor interval must be > 0")
        self.store = store
        self.plans = plans
        self.instance_id = instance_id
        self.interval = interval
        self.batch = batch
        self.on_applied = on_applied
        self.lease_epoch: int | None = None
        self.recovered = 0  # expiries this instance has acted on

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
                    due = await self.store.next_expiry()
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
        return await self.sweep() + await self.release_orphans()

    async def sweep(self) -> int:
        """Recover every expired unit once; returns how many this call recovered."""
        return await self._recover(self.store.expired, Plan.expire)

    async def release_orphans(self) -> int:
        """Recover every unit held by a gone instance (R2), once an interval: unlike
        expiries, which have a time to wake up for, they are found by looking."""
        released = await self._recover(self.store.orphaned, Plan.orphan)
        if released:
            log.info("supervisor %s: released %d task(s) held by instances that are gone",
                     self.instance_id, released)
        return released

    async def _recover(self, find: Callable[[int], Awaitable[list[Task]]],
                       decide: Callable[[Plan, Task, str, float], Transition]) -> int:
        """Apply `decide` to every task `find` lists, batch after batch."""
        total = 0
        while True:
            expired = await find(self.batch)
            if not expired:
                return total
            transitions = []
            for task in expired:
                plan = self.plans.get(task.workflow)
                if plan is None:
                    log.warning("task %s: workflow %r is not known here", task.task_id,
                                task.workflow)
                    continue
                transition = decide(plan, task, self.instance_id, self.store.now())
                if self.lease_epoch is not None:  # fenced: a deposed leader writes nothing
                    transition.lease = LeaseFence(LEASE_NAME, self.instance_id,
                                                  self.lease_epoch)
                transitions.append(transition)
            if not transitions:
                return total
            # applied together: the store group-commits them
            applied = await asyncio.gather(*(self.store.apply(t) for t in transitions))
            for transition, ok in zip(transitions, applied, strict=True):
                if ok:
                    self.on_applied(transition)
            total += sum(applied)
            self.recovered += sum(applied)
            if len(expired) < self.batch or not any(applied):
                return total
