"""When a young PostgreSQL store has its statements planned again (plans.py)."""

from __future__ import annotations

from sasflow.store.postgres.plans import FreshPlans


def test_plans_are_made_again_once_as_the_writes_pass_each_mark() -> None:
    plans = FreshPlans(marks=(10, 100))
    assert [plans.due(4) for _ in range(2)] == [False, False]  # 8 writes
    assert plans.due(4)  # 12: past the first mark
    assert not plans.due(80)  # 92
    assert plans.due(8)  # 100: the second
    assert [plans.due(1_000) for _ in range(3)] == [False, False, False]  # grown up
    assert plans.replanned == 2


def test_a_batch_that_passes_several_marks_replans_once() -> None:
    plans = FreshPlans(marks=(10, 100, 1_000))
    assert plans.due(500)
    assert plans.replanned == 1
    assert plans.due(500)  # 1,000: the last
    assert not plans.due(1)
