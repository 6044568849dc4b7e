"""Task and step records: allowed transitions, idempotency keys, the JSON shape."""

from __future__ import annotations

import itertools
import json
import sqlite3
import subprocess
import sys
import uuid
from datetime import UTC, datetime, timedelta
from importlib import resources

import pytest

from sasflow.model import (
    CLAIMABLE_TASK_STATES,
    FINAL_TASK_STATES,
    TERMINAL_TASK_STATES,
    UNFINISHED_TASK_STATES,
    CompensationRecord,
    Phase,
    StepRecord,
    StepState,
    Task,
    TaskState,
    can_move,
    claimable,
    final,
    idempotency_key,
    isoformat,
    terminal,
)
from sasflow.store import queries as sql

T, S = TaskState, StepState

# The task lifecycle as SPEC (E2, E3, E6, E8, E9, S9) and CONTRACT "States" describe it,
# written out pair by pair so a change to the rules shows up here.
ALLOWED_TASK_MOVES = {
    (T.PENDING, T.PROCESSING),  # claimed (E3)
    (T.PENDING, T.COMPENSATING),  # operator compensates a released task
    (T.PENDING, T.COMPENSATED),  # ... which had nothing to undo
    (T.PENDING, T.ERROR),
    (T.PENDING, T.CANCELLED),
    (T.PROCESSING, T.PENDING),  # released by the supervisor (E9)
    (T.PROCESSING, T.PROCESSED),  # all steps done (E6)
    (T.PROCESSING, T.ERROR),  # nontransient fault or retries exhausted (E8, E9)
    (T.PROCESSING, T.COMPENSATING),  # saga (S9)
    (T.PROCESSING, T.COMPENSATED),  # saga with nothing to undo
    (T.PROCESSING, T.CANCELLED),
    (T.COMPENSATING, T.COMPENSATING),  # the next compensation
    (T.COMPENSATING, T.COMPENSATED),
    (T.COMPENSATING, T.ERROR),  # a compensation failed for good
    (T.ERROR, T.PENDING),  # operator retry (E8)
    (T.ERROR, T.COMPENSATING),
    (T.ERROR, T.COMPENSATED),  # operator compensates, nothing to undo
    (T.ERROR, T.CANCELLED),
}

ALLOWED_STEP_MOVES = {
    (S.PENDING, S.RUNNING),
    (S.PENDING, S.FAILED),  # operator undoes a task whose released step had run: in doubt
    (S.RUNNING, S.RUNNING),
    (S.RUNNING, S.PENDING),
    (S.RUNNING, S.COMPLETED),
    (S.RUNNING, S.FAILED),
    (S.RUNNING, S.COMPENSATED),  # a compensation unit finishing
    (S.FAILED, S.PENDING),
    (S.FAILED, S.RUNNING),  # a failed compensation tried again
    (S.FAILED, S.COMPENSATING),
    (S.COMPLETED, S.COMPENSATING),
    (S.COMPENSATING, S.COMPENSATING),
    (S.COMPENSATING, S.COMPENSATED),
}


def test_state_names_are_the_contracts() -> None:
    """CONTRACT "States": the exact task and step state names, and which are terminal."""
    assert [s.value for s in TaskState] == [
        "pending", "processing", "processed", "error", "compensating", "compensated",
        "cancelled"]
    assert [s.value for s in StepState] == [
        "pending", "running", "completed", "failed", "compensating", "compensated"]
    assert {s.value for s in TERMINAL_TASK_STATES} == {
        "processed", "error", "compensated", "cancelled"}


@pytest.mark.parametrize(("current", "target"), sorted(itertools.product(TaskState, TaskState)))
def test_task_move_allowed_exactly_per_lifecycle(current: TaskState, target: TaskState) -> None:
    """can_move allows a task move iff the lifecycle allows it."""
    assert can_move(current, target) is ((current, target) in ALLOWED_TASK_MOVES)


@pytest.mark.parametrize(("current", "target"), sorted(itertools.product(StepState, StepState)))
def test_step_move_allowed_exactly_per_lifecycle(current: StepState, target: StepState) -> None:
    """can_move allows a step move iff the lifecycle allows it."""
    assert can_move(current, target) is ((current, target) in ALLOWED_STEP_MOVES)


@pytest.mark.parametrize("state", [T.PROCESSED, T.COMPENSATED, T.CANCELLED])
def test_finished_tasks_never_move_again(state: TaskState) -> None:
    """processed, compensated and cancelled have no way out at all."""
    assert not any(can_move(state, target) for target in TaskState)


def test_the_final_states_are_exactly_those_with_no_way_out() -> None:
    """What ended_here.py keeps rests on this: a final task reads the same forever."""
    assert {T.PROCESSED, T.COMPENSATED, T.CANCELLED} == FINAL_TASK_STATES
    assert {s for s in TaskState if final(s)} == {
        s for s in TaskState if not any(can_move(s, target) for target in TaskState)}
    assert FINAL_TASK_STATES < TERMINAL_TASK_STATES  # error is terminal, not final


def test_error_leaves_only_by_an_operator_action() -> None:
    """error is terminal until an operator retries, compensates or cancels (E8)."""
    assert {t for t in TaskState if can_move(T.ERROR, t)} == {
        T.PENDING, T.COMPENSATING, T.COMPENSATED, T.CANCELLED}


def test_can_move_refuses_to_mix_task_and_step_states() -> None:
    """Comparing a task state with a step state is a programming error, not False."""
    with pytest.raises(TypeError):
        can_move(T.PENDING, S.RUNNING)
    with pytest.raises(TypeError):
        can_move(S.RUNNING, T.PENDING)


def test_idempotency_key_is_stable_across_calls() -> None:
    """The same step of the same task always gets the same key (S3)."""
    assert idempotency_key("order-42", "charge") == idempotency_key("order-42", "charge")
    assert idempotency_key("order-42", "charge") == idempotency_key(
        "order-42", "charge", Phase.DO)


def test_idempotency_key_is_stable_across_processes() -> None:
    """A key computed in another interpreter is identical: no per-process salt."""
    code = ("from sasflow.model import Phase, idempotency_key as k;"
            "print(k('order-42', 'charge'), k('order-42', 'charge', Phase.UNDO))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=30).stdout.split()
    assert out == [idempotency_key("order-42", "charge"),
                   idempotency_key("order-42", "charge", Phase.UNDO)]


def test_idempotency_key_differs_per_task_step_and_phase() -> None:
    """Different tasks, steps, or a step and its compensation never share a key."""
    keys = {idempotency_key(task, step, phase)
            for task in ("order-1", "order-2", "order-12")
            for step in ("reserve", "charge", "1")
            for phase in Phase}
    assert len(keys) == 3 * 3 * 2


def test_idempotency_key_is_the_name_based_uuid_keys_were_always_given() -> None:
    """Keys stored before stay valid: the key is uuid5 of phase, task and step."""
    namespace = uuid.UUID("6f1c1c0e-5a5f-4d0e-9a57-5a5f10e5a5f1")
    for task, step in (("order-42", "charge"), ("ü-漢-\t", "s"), ("x" * 200, "1")):
        for phase in Phase:
            assert idempotency_key(task, step, phase) == str(
                uuid.uuid5(namespace, f"{phase.value}\x00{task}\x00{step}"))


def test_idempotency_key_does_not_confuse_task_and_step_boundaries() -> None:
    """("order-1", "2x") and ("order-12", "x") are different units, so different keys."""
    assert idempotency_key("order-1", "2x") != idempotency_key("order-12", "x")


def test_isoformat_has_a_utc_offset_and_round_trips() -> None:
    """Store timestamps render as ISO-8601 with +00:00 and parse back to the same instant."""
    ts = 1_700_000_000.25
    text = isoformat(ts)
    assert text is not None
    assert text.endswith("+00:00")
    parsed = datetime.fromisoformat(text)
    assert parsed.utcoffset() == timedelta(0)
    assert parsed.timestamp() == ts
    assert isoformat(None) is None


def _task() -> Task:
    charge = StepRecord(name="charge", agent="payments", state=S.COMPENSATING, attempts=2,
                        failure_count=1, complete_by=1_700_000_010.0,
                        idempotency_key=idempotency_key("order-42", "charge"),
                        result={"charge_id": "c-1"})
    charge.compensation = CompensationRecord(
        state=S.RUNNING, attempts=1, complete_by=1_700_000_020.0,
        idempotency_key=idempotency_key("order-42", "charge", Phase.UNDO))
    ship = StepRecord(name="ship", agent="shipping", state=S.FAILED, attempts=1,
                      idempotency_key=idempotency_key("order-42", "ship"), error="declined")
    return Task(task_id="order-42", workflow="process-order", input={"order_id": 42},
                state=T.COMPENSATING, locked_by="s-1", complete_by=1_700_000_020.0,
                failure_count=1, epoch=3, created_at=1_700_000_000.0,
                updated_at=1_700_000_015.5, error="step ship failed: declined",
                steps=[charge, ship])


def _is_iso_utc(value: object) -> bool:
    if not isinstance(value, str):
        return False
    parsed = datetime.fromisoformat(value)
    return parsed.tzinfo is not None and parsed.utcoffset() == timedelta(0)


def test_task_to_json_has_the_contract_shape() -> None:
    """`tasks show --json`: every key CONTRACT lists, with JSON types and UTC times."""
    out = _task().to_json()
    contract_keys = {"task_id", "workflow", "state", "locked_by", "complete_by",
                     "failure_count", "epoch", "created_at", "updated_at", "error", "steps"}
    assert contract_keys <= set(out)
    assert out["task_id"] == "order-42"
    assert out["workflow"] == "process-order"
    assert out["state"] == "compensating"
    assert out["locked_by"] == "s-1"
    assert out["failure_count"] == 1
    assert out["epoch"] == 3
    assert out["error"] == "step ship failed: declined"
    for key in ("complete_by", "created_at", "updated_at"):
        assert _is_iso_utc(out[key]), key
    assert datetime.fromisoformat(out["created_at"]) == datetime.fromtimestamp(
        1_700_000_000.0, UTC)
    assert json.loads(json.dumps(out)) == out  # plain JSON all the way down


def test_step_to_json_has_the_contract_shape() -> None:
    """Each step: the CONTRACT keys, state names, UTC times, and its compensation if any."""
    charge, ship = _task().to_json()["steps"]
    contract_keys = {"name", "agent", "state", "attempts", "failure_count", "complete_by",
                     "idempotency_key", "result", "error"}
    assert contract_keys <= set(charge)
    assert contract_keys <= set(ship)
    assert charge["name"] == "charge"
    assert charge["agent"] == "payments"
    assert charge["state"] == "compensating"
    assert charge["attempts"] == 2
    assert charge["result"] == {"charge_id": "c-1"}
    assert charge["idempotency_key"] == idempotency_key("order-42", "charge")
    assert _is_iso_utc(charge["complete_by"])
    assert charge["compensation"]["state"] == "running"
    assert charge["compensation"]["idempotency_key"] == idempotency_key(
        "order-42", "charge", Phase.UNDO)
    assert _is_iso_utc(charge["compensation"]["complete_by"])
    assert ship["state"] == "failed"
    assert ship["error"] == "declined"
    assert ship["complete_by"] is None
    assert "compensation" not in ship


def test_task_to_json_without_steps_is_the_list_shape() -> None:
    """`tasks list --json` objects are the same without `steps`."""
    task = _task()
    listed = task.to_json(steps=False)
    assert "steps" not in listed
    full = task.to_json()
    del full["steps"]
    assert listed == full


def test_unset_times_render_as_null() -> None:
    """A fresh, unlocked task has null locked_by and complete_by (E2)."""
    out = Task(task_id="t", workflow="w", input=None, state=T.PENDING).to_json()
    assert out["locked_by"] is None
    assert out["complete_by"] is None
    assert out["failure_count"] == 0


def test_terminal_and_step_lookup() -> None:
    """Task.terminal follows the terminal states; Task.step finds a step by name."""
    task = _task()
    assert not task.terminal
    assert task.step("ship").error == "declined"
    with pytest.raises(KeyError):
        task.step("nope")
    for state in TaskState:
        task.state = state
        assert task.terminal is (state in TERMINAL_TASK_STATES)


# ---------------------------------------------------------------- claimable, terminal
def _sqlite_says(predicate: str, state: TaskState, locked_by: str | None) -> bool:
    """What `predicate` (a WHERE over a task row) says of one row, asked of SQLite."""
    conn = sqlite3.connect(":memory:")
    try:
        row = conn.execute(f"WITH tasks(state, locked_by) AS (VALUES (?, ?))"
                           f" SELECT COUNT(*) FROM tasks WHERE {predicate}",
                           (state.value, locked_by)).fetchone()
        return bool(row[0])
    finally:
        conn.close()


@pytest.mark.parametrize("locked_by", [None, "sched-1"])
@pytest.mark.parametrize("state", list(TaskState))
def test_the_sql_predicates_say_what_the_model_says(state: TaskState,
                                                    locked_by: str | None) -> None:
    """sql.CLAIMABLE_SQL and sql.UNFINISHED_SQL agree with model.claimable and
    model.UNFINISHED_TASK_STATES on every state, held or not."""
    assert _sqlite_says(sql.CLAIMABLE_SQL, state, locked_by) is claimable(state, locked_by)
    assert _sqlite_says(sql.UNFINISHED_SQL, state, locked_by) is (
        state in UNFINISHED_TASK_STATES)


def test_every_state_is_terminal_or_unfinished_and_only_unfinished_ones_are_claimable() -> None:
    """Terminal as CONTRACT.md lists it; every other state is work still to do."""
    assert {s for s in TaskState if terminal(s)} == {T.PROCESSED, T.ERROR, T.COMPENSATED,
                                                     T.CANCELLED}
    for state in TaskState:
        assert terminal(state) is (state not in UNFINISHED_TASK_STATES), state
        assert Task(task_id="t", workflow="w", input=None, state=state).terminal is (
            terminal(state))
    assert set(CLAIMABLE_TASK_STATES) <= set(UNFINISHED_TASK_STATES)


@pytest.mark.parametrize("dialect", ["sqlite", "postgres"])
def test_the_claimable_index_covers_exactly_the_claimable_predicate(dialect: str) -> None:
    """The partial index tasks_claimable (its latest definition in the migrations) has
    sql.CLAIMABLE_SQL as its WHERE, word for word: what the claim queries say, so the
    index serves them (SQLite matches a partial index's terms textually)."""
    folder = resources.files(f"sasflow.store.{dialect}") / "migrations"
    scripts = sorted((f.name, f.read_text()) for f in folder.iterdir()
                     if f.name.endswith(".sql"))
    definitions = [statement for _, script in scripts for statement in script.split(";")
                   if "CREATE INDEX tasks_claimable" in statement]
    assert definitions
    where = " ".join(definitions[-1].split("WHERE", 1)[1].split())
    assert where == sql.CLAIMABLE_SQL


def test_the_records_a_step_makes_are_kept_out_of_the_collector() -> None:
    """model.py: the records made and dropped at every step are not tracked by the
    garbage collector, even holding decoded inputs and results (dicts, which are)."""
    import gc

    from sasflow.messages import Reply, Request
    from sasflow.store.records import HistoryEntry, NewTask
    from sasflow.transition import Transition, UnitChange

    for record in (Task, StepRecord, CompensationRecord, Transition, UnitChange, Request,
                   Reply, NewTask, HistoryEntry):
        assert record.__struct_config__.gc is False, record.__name__
    undo = CompensationRecord(state=StepState.PENDING, result={"undone": [1]})
    step = StepRecord(name="s", agent="a", state=StepState.COMPLETED,
                      result={"reserved": {"items": ["a"]}}, compensation=undo)
    task = Task(task_id="t", workflow="w", input={"n": [1, 2]},
                state=TaskState.PROCESSING, steps=[step])
    assert gc.is_tracked(task.input) and gc.is_tracked(step.result)
    assert not any(gc.is_tracked(r) for r in (task, step, undo))
