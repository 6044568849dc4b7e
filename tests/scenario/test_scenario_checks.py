"""The scenario's per-order checks (invariants.check_order, check_expected) on hand-made
records.

A task that used up its retry budget ends as the policy says (compensated, or in
error once its compensation is out of budget too), which the exact outcome of a
declined or refused order cannot require; every other check still holds for it.
"""

from __future__ import annotations

from typing import Any

from scenarioapp import order_input

from support.invariants import check_expected, check_order

Units = dict[tuple[str, str, str], tuple[str, bool, Any, str]]
Committed = dict[tuple[str, str, str], list[tuple[str, int]]]

DECLINED = 3  # order_input: n % 10 == 3 has a declined card


def problems_of(state: str, applied: list[str], units: Units, committed: Committed, *,
                exhausted: bool = False) -> list[str]:
    """What the scenario's checks find wrong with order DECLINED so recorded."""
    task = f"order-{DECLINED}"
    return [*check_order(task, state, applied, units, committed),
            *check_expected(task, order_input(DECLINED), state, applied, exhausted=exhausted)]


def declined_given_up() -> tuple[Units, Committed]:
    """Order 3 as a loaded run left it: reserve completed; charge expired until the
    budget ran out, given up in doubt; its refund expired once and failed."""
    task = f"order-{DECLINED}"
    units: Units = {(task, "reserve", "do"): ("compensating", False, {"effect_id": "r"}, "k0"),
                    (task, "charge", "do"): ("failed", True, None, "k1"),
                    (task, "ship", "do"): ("pending", False, None, "k2"),
                    (task, "charge", "undo"): ("failed", False, None, "k3")}
    return units, {(task, "reserve", "do"): [("scheduler-1", 3)]}


def test_a_declined_order_out_of_retries_may_end_in_error() -> None:
    """Its budget used up, a declined order in error with its reservation is no problem."""
    units, committed = declined_given_up()
    assert problems_of("error", ["reserve"], units, committed,
                       exhausted=True) == []


def test_a_declined_order_in_error_with_retries_left_is_a_problem() -> None:
    """The same record without the budget used up: it had to end compensated."""
    units, committed = declined_given_up()
    [problem] = problems_of("error", ["reserve"], units,
                            committed)
    assert "a declined card must end compensated by a release" in problem


def test_an_order_out_of_retries_may_not_end_processed() -> None:
    units, committed = declined_given_up()
    problems = problems_of("processed", ["reserve"], units,
                           committed, exhausted=True)
    assert any("its retries ran out, yet it ended processed" in p for p in problems)


def test_an_order_out_of_retries_is_still_held_to_its_effects() -> None:
    """A committed reservation the remote never applied is a problem, budget or not."""
    units, committed = declined_given_up()
    [problem] = problems_of("error", [], units, committed,
                            exhausted=True)
    assert "the remote lacks ['reserve']" in problem
