"""The promise, checked after a simulated run against the store and the remote's ledger.

Each check returns the violations it found, one line each, naming the task.
What they check (docs/reliability.md, SPEC R6):

- every acknowledged task reached a terminal state (once faults stopped);
- one owner per committed unit: no unit of work is committed twice, and each
  commit comes from the scheduler that claimed the task under that epoch;
- each remote effect once per idempotency key, every attempt of a unit under
  the unit's one key, and a completed step's result is its effect's answer;
- compensation once per completed step, in reverse order: a compensated task
  left no effect of a compensable step undone, and undid them last to first;
  a processed task undid nothing;
- bounded retries: no dispatch made more attempts than its agent's policy,
  no unit was dispatched more often than its workflow's max_failures allows
  (plus the times a worker stopping cleanly handed it back, counting no
  failure, and again after each operator command);
- one alert per incident: one alert for each move of a task to error;
- no hot loop: a bound on gate passages per virtual second.
"""

from __future__ import annotations

import collections
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sasflow.model import Phase, StepState, Task, TaskState, idempotency_key
from sasflow.store.records import Alert, HistoryEntry
from sasflow.testing.remote import SimRemote

__all__ = ["HOT_LOOP_PASSAGES_PER_SECOND", "Policy", "check"]

# Far above what any simulated run needs (a few hundred at a burst of submissions),
# far below what a loop that retries without waiting makes.
HOT_LOOP_PASSAGES_PER_SECOND = 5000


@dataclass(frozen=True, slots=True)
class Policy:
    """What a task's workflow allows: the bounds the retries must keep."""

    max_failures: int
    retry_attempts: Mapping[str, int]  # agent -> attempts per dispatch
    compensable: frozenset[str]


def check(*, submitted: Sequence[str], tasks: Mapping[str, Task],
          history: Mapping[str, list[HistoryEntry]], alerts: Sequence[Alert],
          remote: SimRemote, policies: Mapping[str, Policy],
          busiest_second: int) -> list[str]:
    """Every violation of the invariants in a finished run (empty: the promise held)."""
    found: list[str] = []
    found += _all_terminal(submitted, tasks)
    for task_id in submitted:
        task = tasks.get(task_id)
        if task is None:
            continue
        policy = policies[task.workflow]
        entries = history.get(task_id, [])
        found += _one_owner_per_unit(task, entries)
        found += _effects_once(task, remote)
        found += _compensated_in_reverse(task, remote, policy)
        found += _bounded_retries(task, entries, remote, policy)
        found += _one_alert_per_incident(task, entries, alerts)
    if busiest_second > HOT_LOOP_PASSAGES_PER_SECOND:
        found.append(f"hot loop: {busiest_second} calls to the world in one virtual second"
                     f" (bound {HOT_LOOP_PASSAGES_PER_SECOND})")
    return found


def _all_terminal(submitted: Sequence[str], tasks: Mapping[str, Task]) -> list[str]:
    out = []
    for task_id in submitted:
        task = tasks.get(task_id)
        if task is None:
            out.append(f"{task_id}: acknowledged, then lost")
        elif not task.terminal:
            out.append(f"{task_id}: not terminal at the end ({task.state.value},"
                       f" locked by {task.locked_by}, cursor {task.cursor})")
    return out


def _one_owner_per_unit(task: Task, entries: list[HistoryEntry]) -> list[str]:
    out = []
    claims = {(e.actor, e.epoch) for e in entries
              if e.step is None and e.why is not None and "claimed" in e.why}
    commits: collections.Counter[tuple[str, str]] = collections.Counter()
    for e in entries:
        done = (e.phase == Phase.DO.value and e.to_state == StepState.COMPLETED.value) or (
            e.phase == Phase.UNDO.value and e.to_state == StepState.COMPENSATED.value)
        if e.step is None or not done:
            continue
        commits[(e.step, e.phase or "")] += 1
        if (e.actor, e.epoch) not in claims:
            out.append(f"{task.task_id}: {e.step}/{e.phase} committed by {e.actor} under epoch"
                       f" {e.epoch}, which it never claimed")
    out += [f"{task.task_id}: {step}/{phase} committed {n} times"
            for (step, phase), n in commits.items() if n > 1]
    return out


def _effects_once(task: Task, remote: SimRemote) -> list[str]:
    out = []
    applied: collections.Counter[str] = collections.Counter(
        e.key for e in remote.effects if e.task_id == task.task_id)
    out += [f"{task.task_id}: effect of key {key} applied {n} times"
            for key, n in applied.items() if n > 1]
    for attempt in remote.attempts:
        if attempt.task_id != task.task_id:
            continue
        expected = idempotency_key(task.task_id, attempt.step, Phase(attempt.phase))
        if attempt.key != expected:
            out.append(f"{task.task_id}: {attempt.step}/{attempt.phase} called with key"
                       f" {attempt.key}, not its own {expected}")
    for step in task.steps:
        if step.state is not StepState.COMPLETED and step.compensation is None:
            continue
        if step.result is None:
            continue
        effect = remote.effect(step.idempotency_key)
        if effect is None or effect.result != step.result:
            out.append(f"{task.task_id}: {step.name} recorded {step.result!r}, but the remote"
                       f" applied {None if effect is None else effect.result!r}")
    return out


def _compensated_in_reverse(task: Task, remote: SimRemote, policy: Policy) -> list[str]:
    out = []
    undos = [e for e in remote.effects if e.task_id == task.task_id and e.undoes is not None]
    if task.state is TaskState.PROCESSED:
        out += [f"{task.task_id}: processed, yet {e.step} was undone" for e in undos]
        for step in task.steps:
            if remote.effect(step.idempotency_key) is None:
                out.append(f"{task.task_id}: processed without the effect of {step.name}")
    if task.state is TaskState.COMPENSATED:
        for step in task.steps:
            effect = remote.effect(step.idempotency_key)
            if effect is None or not effect.applied or step.agent not in policy.compensable:
                continue
            undo = remote.undo_of(step.idempotency_key)
            if undo is None or (undo.applied and undo.seq < effect.seq):
                out.append(f"{task.task_id}: compensated, but the effect of {step.name}"
                           f" stands")
    index = {step.name: i for i, step in enumerate(task.steps)}
    order = [index[e.step] for e in undos]
    if order != sorted(order, reverse=True):
        out.append(f"{task.task_id}: steps undone in the order {order}, not last to first")
    return out


def _bounded_retries(task: Task, entries: list[HistoryEntry], remote: SimRemote,
                     policy: Policy) -> list[str]:
    out = []
    # a worker stopping cleanly hands its unit back without counting a failure
    handed_back = sum(1 for e in entries
                      if e.step is None and e.why is not None and e.why.endswith("on shutdown"))
    # and each operator command (retry, compensate) may start a unit again
    retried = sum(1 for e in entries if e.step is None and e.actor == "operator")
    allowed_dispatches = (policy.max_failures + handed_back) * (1 + retried)
    for attempt in remote.attempts:
        allowed = policy.retry_attempts.get(attempt.agent, 0)
        if attempt.task_id == task.task_id and attempt.attempt > allowed:
            out.append(f"{task.task_id}: {attempt.step}/{attempt.phase} attempt"
                       f" {attempt.attempt} of a dispatch (policy: {allowed})")
    for step in task.steps:
        units = [("do", step.attempts)]
        if step.compensation is not None:
            units.append(("undo", step.compensation.attempts))
        out += [f"{task.task_id}: {step.name}/{phase} dispatched {n} times"
                f" (max_failures {policy.max_failures}, handed back {handed_back})"
                for phase, n in units if n > allowed_dispatches]
    # forward and undo each have the workflow's budget; an operator command starts afresh
    if task.failure_count > policy.max_failures:
        out.append(f"{task.task_id}: {task.failure_count} failures counted"
                   f" (max_failures {policy.max_failures})")
    return out


def _one_alert_per_incident(task: Task, entries: list[HistoryEntry],
                            alerts: Sequence[Alert]) -> list[str]:
    incidents = sum(1 for e in entries
                    if e.step is None and e.to_state == TaskState.ERROR.value)
    raised = sum(1 for a in alerts if a.task_id == task.task_id)
    if incidents != raised:
        return [f"{task.task_id}: {raised} alert(s) for {incidents} move(s) to error"]
    return []
