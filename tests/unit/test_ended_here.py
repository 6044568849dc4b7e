"""The final ends a process's schedulers wrote, kept within a byte budget
(ended_here.py): what is kept, what is let go, and that each answer is a copy."""

from __future__ import annotations

import pytest

from sasflow.ended_here import EndedHere, encode_task
from sasflow.model import StepRecord, StepState, Task, TaskState


def ended(task_id: str, state: TaskState = TaskState.PROCESSED, size: int = 10) -> Task:
    return Task(task_id=task_id, workflow="wf", input={"pad": "x" * size}, state=state,
                steps=[StepRecord(name="s", agent="a", state=StepState.COMPLETED,
                                    result={"ok": True})])


def keep(kept: EndedHere, task: Task) -> int:
    encoded = encode_task(task)
    kept.keep(task, encoded)
    return len(encoded)


@pytest.mark.parametrize("state", [TaskState.PROCESSED, TaskState.COMPENSATED,
                                   TaskState.CANCELLED])
def test_a_final_end_is_kept_and_each_answer_is_a_copy(state: TaskState) -> None:
    kept = EndedHere()
    task = ended("t-1", state)
    keep(kept, task)
    first, second = kept.get("t-1"), kept.get("t-1")
    assert first == second == task
    assert first is not None and second is not None
    first.steps[0].result["ok"] = False
    assert second.steps[0].result == {"ok": True}
    assert kept.get("t-1") == task


@pytest.mark.parametrize("state", [TaskState.ERROR, TaskState.PENDING,
                                   TaskState.PROCESSING, TaskState.COMPENSATING])
def test_an_end_that_may_still_change_is_not_kept(state: TaskState) -> None:
    kept = EndedHere()
    keep(kept, ended("t-1", state))
    assert kept.get("t-1") is None
    assert len(kept) == 0


def test_the_oldest_ends_are_let_go_beyond_the_budget() -> None:
    one = len(encode_task(ended("t-00", size=1000)))
    kept = EndedHere(budget_bytes=10 * (one + 200))  # ten of them, entry overhead included
    for n in range(25):
        keep(kept, ended(f"t-{n:02}", size=1000))
    assert len(kept) == 10
    assert [n for n in range(25) if kept.get(f"t-{n:02}") is not None] == list(range(15, 25))


def test_an_end_larger_than_the_budget_is_not_kept() -> None:
    kept = EndedHere(budget_bytes=500)
    keep(kept, ended("small", size=10))
    keep(kept, ended("large", size=2000))
    assert kept.get("large") is None
    assert len(kept) == 0  # (it pushed out what was there, then itself)


def test_an_id_ended_again_replaces_its_entry_and_its_size() -> None:
    one = len(encode_task(ended("t-00", size=1000)))
    kept = EndedHere(budget_bytes=3 * (one + 200))
    for _ in range(5):
        keep(kept, ended("same", size=1000))
    keep(kept, ended("other", size=1000))
    assert len(kept) == 2  # counted once: nothing let go
    assert kept.get("same") is not None and kept.get("other") is not None
