"""The planner's migration: a task moved onto another version of its workflow.

A task is planned for one shape of its workflow (R4, M4): the steps, names and
agents in order, that its version names. `migrate` re-plans it onto this
declaration, an operator's explicit action (`sasflow tasks migrate`), and only
when that is provably safe; anything else is refused saying why.
"""

from __future__ import annotations

from sasflow.errors import InvalidTransitionError
from sasflow.model import Phase, StepState, Task, TaskState, idempotency_key
from sasflow.plan.draft import Drafting, Fence, draft, task_version
from sasflow.transition import Transition, UnitChange, put_unit

__all__ = ["Migration"]


class Migration(Drafting):
    """A Plan's decision to move a task onto this declaration's version."""

    __slots__ = ()

    def migrate(self, task: Task, now: float) -> Transition:
        """Re-plan a task of another version of this workflow onto this declaration.

        Only when it is provably safe: the task is unlocked and moving forward
        (pending, or error at a failed step); every step it has started keeps its
        place, name and agent in this declaration (a prefix of both lists); and
        this declaration has a step at the task's cursor to resume from. The steps
        after that prefix, none of which ever ran, become this declaration's.
        Anything else is refused with InvalidTransitionError saying why.
        """
        target, current = self.workflow.version, task_version(task)
        what = (f"cannot migrate task {task.task_id} from version {current} to {target}"
                f" of workflow {self.workflow.name!r}")
        if task.workflow != self.workflow.name:
            raise InvalidTransitionError(f"{what}: it is a task of workflow {task.workflow!r}",
                                         task_id=task.task_id)
        if current == target and self._shape_of(task) == self._shape():
            raise InvalidTransitionError(f"{what}: it is of that version already",
                                         task_id=task.task_id)
        if task.locked_by is not None or task.phase is not Phase.DO or task.state not in (
                TaskState.PENDING, TaskState.ERROR):
            where = " while compensating" if task.phase is Phase.UNDO else ""
            raise InvalidTransitionError(
                f"{what}: it is {task.state.value}{where}; only unlocked pending or error"
                " tasks moving forward can be migrated", task_id=task.task_id)
        declared, held = self._shape(), self._shape_of(task)
        kept = next((i for i, (a, b) in enumerate(zip(held, declared, strict=False)) if a != b),
                    min(len(held), len(declared)))
        for index in range(kept, len(task.steps)):
            record = task.steps[index]
            if record.state is not StepState.PENDING or record.attempts or record.in_doubt or (
                    record.compensation is not None):
                raise InvalidTransitionError(
                    f"{what}: step {record.name!r} (agent {record.agent!r}, position"
                    f" {index + 1}) has run and version {target} has no such step there",
                    task_id=task.task_id, step=record.name)
        if task.cursor >= len(declared):
            raise InvalidTransitionError(
                f"{what}: version {target} has no step left to run after"
                f" {', '.join(n for n, _ in declared)}; finish it on a worker of version"
                f" {current}, or cancel it", task_id=task.task_id)
        task = draft(task)
        fence = Fence(task, owner=None)
        units = [UnitChange(index=i, phase=Phase.DO, name=step.name, agent=step.agent,
                            idempotency_key=idempotency_key(task.task_id, step.name),
                            state=StepState.PENDING)
                 for i, step in enumerate(self.workflow.steps) if i >= kept]
        del task.steps[len(declared):]
        for unit in units:
            put_unit(task.steps, unit)
        task.version = target
        transition = self._move(task, fence, task.state, "operator", now, units=units,
                                why=f"operator migrated it from version {current} to {target}")
        if len(held) > len(declared):
            transition.steps_from = len(declared)
        return transition
