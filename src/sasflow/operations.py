"""An operator's verbs (SPEC E8, U3, U4): act on a task, acknowledge an alert, read
and purge dead letters. The CLI and the HTTP API both go through these.

Every action on a task is planned by the task's workflow (plan.py) and applied
under the fence like any other transition, so it cannot race a scheduler or a
supervisor: if the task moved meanwhile, it is read again and planned again. The
history records who acted and why (`by`, `reason`).
"""

from __future__ import annotations

import builtins
from collections.abc import Callable
from dataclasses import dataclass

import msgspec

from sasflow.background_loop import BackgroundLoop
from sasflow.declarations import Declarations
from sasflow.errors import InvalidTransitionError, UnknownAlertError, UnknownWorkflowError
from sasflow.model import Task, TaskState
from sasflow.plan import Plan, task_version
from sasflow.signals import InProcessSignals
from sasflow.store.interfaces import Store
from sasflow.store.listing import TaskQuery
from sasflow.store.records import Alert
from sasflow.transition import Transition, applied
from sasflow.transport.base import Transport
from sasflow.transport.dead_letter import DeadLetter
from sasflow.twins import blocking

__all__ = ["Migration", "Operations", "actor_of"]

_ALL = 2**31 - 1  # every task of a listing
_OPERATE_TRIES = 10
OPERATOR = "operator"  # the history's actor for an operator who gave no name


@dataclass(frozen=True, slots=True)
class Migration:
    """What `App.migrate` did, or (dry run) would do, with one task."""

    task_id: str
    from_version: str
    to_version: str
    migrated: bool  # done (or possible, in a dry run)
    refused: str | None  # why not, in one line


def actor_of(by: str | None) -> str:
    """The history's actor for an action taken by `by` (a user's name)."""
    return OPERATOR if not by else f"{OPERATOR}:{by}"


class Operations:
    """The operator's verbs of a Client (mixed into it: client.py)."""

    _loop: BackgroundLoop
    _declared: Declarations
    _signals: InProcessSignals

    @property
    def _store(self) -> Store:
        raise NotImplementedError

    @property
    def _transport(self) -> Transport:
        raise NotImplementedError

    def _plans(self) -> dict[str, Plan]:
        raise NotImplementedError

    async def aget(self, task_id: str) -> Task:
        raise NotImplementedError

    # ------------------------------------------------------------ tasks (E8)
    async def _operate(self, task_id: str, decide: Callable[[Plan, Task, float], Transition],
                       by: str | None = None, reason: str | None = None) -> Task:
        """Apply the operator's action that `decide` plans, fenced; the task as the
        action left it. (Not read again after: the schedulers it wakes may already
        have moved the task on, and the caller asked what its action did.)"""
        plans = self._plans()
        for _ in range(_OPERATE_TRIES):  # the task may move under us: read again and retry
            task = await self.aget(task_id)
            plan = plans.get(task.workflow)
            if plan is None:
                raise UnknownWorkflowError(
                    f"task {task_id} belongs to workflow {task.workflow!r}, unknown to this app",
                    task_id=task_id)
            transition = decide(plan, task, self._store.now())
            transition = msgspec.structs.replace(
                transition, actor=actor_of(by),
                why=f"{transition.why}: {reason}" if reason else transition.why)
            if await self._store.apply(transition):
                self._signals.wake_schedulers()
                return applied(task, transition)
        raise InvalidTransitionError(f"task {task_id} keeps changing; try again",
                                     task_id=task_id)

    async def aretry(self, task_id: str, step: str | None = None, *, by: str | None = None,
                     reason: str | None = None) -> Task:
        """Resubmit a task's failed step (default: the one that failed), once fixed;
        `by` and `reason` go into its history."""
        return await self._operate(task_id, lambda p, t, now: p.retry(t, now, step),
                                   by, reason)

    async def acompensate(self, task_id: str, *, by: str | None = None,
                          reason: str | None = None) -> Task:
        """Undo a task: compensate its completed steps, last first."""
        return await self._operate(task_id, lambda p, t, now: p.compensate(t, now), by, reason)

    async def acancel(self, task_id: str, *, by: str | None = None,
                      reason: str | None = None) -> Task:
        """Stop a task where it is, undoing nothing."""
        return await self._operate(task_id, lambda p, t, now: p.cancel(t, now), by, reason)

    async def amigrate(self, workflow: str, *, from_version: str | None = None,
                       dry_run: bool = False) -> builtins.list[Migration]:
        """Move the pending and error tasks of other versions of `workflow` (or of
        `from_version` only) onto the version declared here, each where it is
        provably safe (plan.Plan.migrate), fenced like every operator action.

        Returns what became of each task, oldest first; with `dry_run` nothing is
        written and each says what would be done. Tasks being run are left to the
        workers of their own version.
        """
        self._declared.known(workflow)
        plan = self._plans()[workflow]
        target = plan.workflow.version
        if from_version == target:
            raise InvalidTransitionError(f"version {target} is the one this application"
                                         f" declares for {workflow!r}: nothing to migrate")
        done = []
        for state in (TaskState.PENDING, TaskState.ERROR):
            for found in await self._store.list_tasks(
                    TaskQuery(state=state, workflow=workflow, limit=_ALL)):
                if found.version == target or from_version not in (None, found.version):
                    continue
                done.append(await self._migrate_one(plan, found.task_id, dry_run))
        return done

    async def _migrate_one(self, plan: Plan, task_id: str, dry_run: bool) -> Migration:
        task = await self.aget(task_id)
        old = task_version(task)
        try:
            if dry_run:
                plan.migrate(task, self._store.now())
            else:
                await self._operate(task_id, lambda p, t, now: plan.migrate(t, now))
        except InvalidTransitionError as refused:
            return Migration(task_id, old, plan.workflow.version, False, str(refused))
        return Migration(task_id, old, plan.workflow.version, True, None)

    retry = blocking(aretry)
    compensate = blocking(acompensate)
    cancel = blocking(acancel)
    migrate = blocking(amigrate)

    # ------------------------------------------------------------ alerts (E8)
    async def aacknowledge(self, alert_id: int, *, by: str | None = None,
                           reason: str | None = None) -> Alert:
        """Record that the alert was seen and needs nothing more; it is then not
        delivered again. The first acknowledgement stands."""
        alert = await self._store.acknowledge_alert(alert_id, by=actor_of(by),
                                                    why=reason or "")
        if alert is None:
            raise UnknownAlertError(f"unknown alert {alert_id}")
        return alert

    acknowledge = blocking(aacknowledge)

    # ------------------------------------------------------------ dead letters (R3)
    async def adead_letters(self, *, limit: int = 100) -> builtins.list[DeadLetter]:
        """The messages no consumer could handle, oldest first: the broker's, or (for
        the in-process transport, whose queues die with their process) the store's."""
        return await self._transport.dead_letters(limit=limit)

    async def adead_letter(self, letter_id: str) -> DeadLetter | None:
        """One dead letter, whole; None if there is none by that id."""
        return await self._transport.dead_letter(letter_id)

    async def apurge_dead_letters(self) -> int:
        """Forget every dead letter; how many there were."""
        return await self._transport.purge_dead_letters()

    dead_letters = blocking(adead_letters)
    dead_letter = blocking(adead_letter)
    purge_dead_letters = blocking(apurge_dead_letters)
