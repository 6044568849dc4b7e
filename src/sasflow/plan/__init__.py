"""The planner: pure functions that decide each task's next Transition.

Given a workflow, a snapshot of a task and what just happened (a claim, an
agent's reply, an expiry, an operator's request), the planner returns the one
Transition to apply: the task's new values and each touched unit's complete new
row, computed from the snapshot, which it leaves as it was
(`transition.applied(task, t)` is the task once it applies). No I/O and no clock
of its own: `now` is passed in. The scheduler, the
supervisor and the operator commands all decide here, so the rules of the
pattern (S2, S6, S8, S9, E8, E9) live in one place.

Forward (phase do) the cursor is the step being run. Backward (phase undo) it
is the highest step that may still need undoing; the planner walks it down over
the steps that completed, or whose outcome is in doubt, and have a compensator.

Versions (R4, M4). A task is planned for one shape of its workflow: the steps
(names and agents, in order) it was submitted with, which its version names.
Whatever runs a unit, or leads to running one (claim, reply, release, retry,
compensate), needs the declaration's step list to be the task's, and refuses
with InvalidTransitionError naming both versions otherwise: never an IndexError
or a step run again because the list moved under it. Expiry and cancel read
only the task's own steps, so the supervisor of any release can count an
expiry (the release leaves the task to schedulers of its own version). `migrate`
re-plans a task onto this declaration when that is provably safe.
"""

from __future__ import annotations

from dataclasses import dataclass

from sasflow.plan.draft import task_version
from sasflow.plan.forward import Forward
from sasflow.plan.migration import Migration
from sasflow.workflow import Workflow

__all__ = ["Plan", "task_version"]

# The planner's parts, one module each (every one a base of Plan, sharing its fields):
#   draft.py         how a decision is built: the draft, the fence, the unit rows
#   forward.py       the steps run forward, their replies, failures and recoveries
#   compensation.py  the undo of completed steps, last to first (S9)
#   migration.py     a task moved onto another version of its workflow (R4, M4)


@dataclass(frozen=True, slots=True)
class Plan(Forward, Migration):
    """A workflow plus which of its agents can undo their work: decides each of its
    tasks' Transitions, never changing the snapshot it is given.

    (Each decision works on a private draft of the snapshot: `draft.draft`.)
    """

    workflow: Workflow
    compensable: frozenset[str]  # agents that declared a compensator

    @property
    def version(self) -> str:
        """The workflow version it decides for: the only one its claims take (R4)."""
        return self.workflow.version
