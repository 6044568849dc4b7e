"""What the demo counts (`sasflow demo`), read through the App's client API.

The demo reads its tasks the way any application can: `App.list` for their
states and holders while the run goes on, and once the workers have stopped
`App.get` (each task's steps and compensations: their attempts and failures),
`App.history` (the supervisor's recoveries) and `App.alerts`. Only this run's
tasks count: their ids start with the run's own prefix, so a store used by an
earlier run is never mixed in.
"""

from __future__ import annotations

from sasflow.app import App
from sasflow.examples.orders.orders import WORKFLOW
from sasflow.model import Task

__all__ = ["Tally"]

# `App.list` pages from the oldest task: this reaches past every earlier run's
_EVERY_TASK = 2**62
_ALERTS_PAGE = 1000


class Tally:
    """Counts over this run's tasks (ids starting with `prefix`)."""

    def __init__(self, app: App, prefix: str) -> None:
        self.app, self.prefix = app, prefix

    def tasks(self) -> list[Task]:
        """This run's tasks, without their steps."""
        return [t for t in self.app.list(workflow=WORKFLOW, limit=_EVERY_TASK)
                if t.task_id.startswith(self.prefix)]

    def counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for task in self.tasks():
            counts[task.state.value] = counts.get(task.state.value, 0) + 1
        return counts

    def states(self) -> dict[str, str]:
        return {t.task_id: t.state.value for t in self.tasks()}

    def locked_by(self) -> list[str]:
        return [t.locked_by for t in self.tasks() if t.locked_by is not None]

    def units(self) -> tuple[int, int, int]:
        """Units (steps and compensations) started, their dispatches, their failures."""
        started = dispatches = failures = 0
        for task in self.tasks():
            for step in self.app.get(task.task_id).steps:
                for unit in (step, step.compensation):
                    if unit is not None and unit.attempts > 0:
                        started += 1
                        dispatches += unit.attempts
                        failures += unit.failure_count
        return started, dispatches, failures

    def recoveries(self) -> int:
        # the planner words a supervisor's expiry "<step>: expired (<n>x): <what it did>"
        return sum(1 for task in self.tasks() for entry in self.app.history(task.task_id)
                   if entry.step is None and ": expired (" in (entry.why or ""))

    def alerts(self) -> int:
        count, after = 0, 0
        while page := self.app.alerts(limit=_ALERTS_PAGE, after=after):
            count += sum(1 for a in page if (a.task_id or "").startswith(self.prefix))
            after = page[-1].id
        return count
