"""Fault matrix row 5: an operator's action racing the supervisor's recovery of the same
task (SPEC R6, E8, S8, M3).

A worker claims orders and is SIGKILLed holding them; the supervisor recovers each
as its step's complete-by passes, and at that very moment the operator cancels,
compensates or retries the same tasks through the API. Each is a fenced
compare-and-set on the task as read, so for each task exactly one of the two moves
it out of the state both read (the history chains), the loser either re-reads and
applies its action to the new state (the operator) or writes nothing (the
supervisor), a retry of a task with no failed step is refused with a clear error,
and a new worker then finishes what is left with every invariant.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from scenarioapp import STALL_ENV

from sasflow.errors import InvalidTransitionError
from sasflow.examples.orders.remote import Faults, RemoteService
from sasflow.model import Task
from support.matrix import RECOVERY, Backend, Run, open_run, wait_started

pytestmark = pytest.mark.chaos

EACH = 8  # tasks per operator action
ACTIONS = ("cancel", "compensate", "retry")


@pytest.fixture
def run(backend: Backend, tmp_path: Path) -> Iterator[Run]:
    # a remote that always answers: every task is in flight when the worker dies
    with RemoteService(faults=Faults()) as remote, \
            open_run(tmp_path, backend.store_url, backend.broker, remote) as found:
        yield found


def healthy(n: int) -> dict[str, Any]:
    return {"order_id": n, "card": "ok", "refuse_ship": False}


@pytest.mark.timeout(240)
# the race is between two writers of the store: each store, the in-process transport
@pytest.mark.parametrize("backend", ["sqlite", "postgres-memory"], indirect=True)
def test_operator_actions_racing_the_supervisor_recovery_one_wins(run: Run) -> None:
    """Cancel, compensate and retry fired at the complete-by of tasks a SIGKILLed worker
    held, while the supervisor recovers them: one transition per state, no effect twice."""
    cluster = run.cluster
    total = EACH * len(ACTIONS)
    run.submit(total, healthy)
    # it reserves each order, then hangs holding it until it is killed
    victim = cluster.spawn("victim", "scheduler,agent", extra_env={STALL_ENV: "reserve"})
    cluster.wait_for(f"the victim to hold all {total} tasks",
                     lambda: len(run.held_by(victim)) == total, timeout=RECOVERY)
    victim.kill()
    supervisor = cluster.spawn("sup-1", "supervisor")
    wait_started(cluster, [supervisor])
    due = dict(cluster.db.must("SELECT task_id, complete_by FROM tasks"))
    tasks = sorted(due, key=lambda t: int(t.split("-")[1]))
    action = {t: ACTIONS[i % len(ACTIONS)] for i, t in enumerate(tasks)}

    def operate(task: str) -> str:
        """Wait for the task's complete-by, then act at once: the supervisor acts now too."""
        while time.time() < due[task]:
            time.sleep(0.0005)
        try:
            act: Callable[[str], Task] = getattr(run.submitter, action[task])
            return act(task).state.value
        except InvalidTransitionError as error:
            return f"refused: {error}"

    with ThreadPoolExecutor(max_workers=total) as pool:
        answers = dict(zip(tasks, pool.map(operate, tasks), strict=True))
    for task in tasks:
        if action[task] == "retry":
            assert answers[task].startswith("refused: cannot retry task"), answers[task]
        else:
            assert answers[task] in {"cancel": {"cancelled"},
                                     "compensate": {"compensating", "compensated"}
                                     }[action[task]], (task, answers[task])

    finisher = cluster.spawn("finisher", "scheduler,agent")
    run.wait_all_terminal()
    outcome = run.conclude(quiet=[finisher, supervisor], inputs=healthy)
    ended = {t: outcome.states[t] for t in tasks}
    for task in tasks:
        want = {"cancel": "cancelled", "compensate": "compensated", "retry": "processed"}
        assert ended[task] == want[action[task]], (task, ended[task])
    # who moved each task out of the state the victim left it in: one of the two, once
    first: dict[str, str] = {}
    for task, actor in cluster.db.must(
            "SELECT task_id, actor FROM history_entries WHERE step IS NULL AND epoch = 1"
            " AND from_state = 'processing' AND actor <> %s ORDER BY id, part", (victim.name,)):
        assert task not in first, f"{task} moved out of processing twice"
        first[task] = actor
    print(f"\nfirst to move each task: {Counter(first.values())}")
    assert set(first) == set(tasks)
