"""The store contract suite's world: its workflows and plans, and the few steps every
store test takes (a new task, submitted, claimed, applied, read back).

Shared by tests/contract/test_store_contract.py and the suites that add one
backend's own behaviour (test_postgres_store.py, test_postgres_faults.py, ...).
"""

from __future__ import annotations

from typing import Any, Protocol

import msgspec

from sasflow.model import Task, idempotency_key
from sasflow.plan import Plan
from sasflow.store import Store
from sasflow.store.records import NewTask
from sasflow.transition import Transition, applied
from sasflow.workflow import Step, Workflow


class Clock(Protocol):
    now: float

    def __call__(self) -> float: ...

    def advance(self, seconds: float) -> None: ...


class StoreFactory(Protocol):
    def __call__(self, clock: Clock | None = None) -> Store: ...


AGENTS = ("inventory", "payments", "shipping")
ORDER = Workflow.declare("order", [Step("reserve", "inventory", 5.0),
                                   Step("charge", "payments", 10.0),
                                   Step("ship", "shipping", 7.0)],
                         agents=AGENTS, max_failures=2, retry_backoff=0.5)
ALERTING = Workflow.declare("alerting", [Step("reserve", "inventory", 5.0),
                                         Step("charge", "payments", 10.0)],
                            agents=AGENTS, on_failure="error")
SLOW = Workflow.declare("slow", [Step("wait", "inventory", 50.0)], agents=AGENTS)
COMPENSABLE = frozenset({"inventory", "shipping"})
PLANS = {wf.name: Plan(wf, COMPENSABLE) for wf in (ORDER, ALERTING, SLOW)}


def new_task(task_id: str, workflow: str = "order", input: Any = None,
             reply_to: str | None = None) -> NewTask:
    steps = PLANS[workflow].workflow.steps
    return NewTask(task_id=task_id, workflow=workflow,
                   input_json=msgspec.json.encode({"order": task_id} if input is None
                                                  else input),
                   reply_to=reply_to,
                   steps=[(s.name, s.agent, idempotency_key(task_id, s.name)) for s in steps])


async def submitted(store: Store, *ids: str, workflow: str = "order",
                    reply_to: str | None = None) -> None:
    for task_id in ids:
        assert await store.submit(new_task(task_id, workflow, reply_to=reply_to))


async def claim_one(store: Store, owner: str, plans: dict[str, Plan] = PLANS) -> Task:
    [task] = await store.claim(owner, 1, plans)
    return task


async def fresh(store: Store, task_id: str) -> Task:
    task = await store.get(task_id)
    assert task is not None
    return task


async def applies(store: Store, task: Task, transition: Transition) -> Task:
    """Apply `transition`, planned from `task`: it must apply. The task as planned
    (transition.applied: what every store must now hold, see below)."""
    assert await store.apply(transition)
    return applied(task, transition)


def assert_stored_as_planned(stored: Task, planned: Task) -> None:
    """The store holds exactly what the planner decided the task became."""
    fields = ("task_id", "workflow", "input", "state", "phase", "cursor", "locked_by",
              "complete_by", "available_at", "failure_count", "epoch", "reply_to", "error",
              "version")
    assert {f: getattr(stored, f) for f in fields} == {f: getattr(planned, f) for f in fields}
    assert stored.steps == planned.steps
