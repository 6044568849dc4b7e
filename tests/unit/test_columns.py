"""A unit field is declared once: the record types, columns.STEP and the planner rule
that sets it. No statement names the columns of a unit row, and no mapping between
rows, records and transitions lists the fields (docs/architecture.md, "Adding a
field")."""

from __future__ import annotations

import re
from importlib import resources

import msgspec
from psycopg import _queries as psycopg_queries

from sasflow.model import CompensationRecord, Phase, StepRecord, StepState, Task, TaskState
from sasflow.store import columns, queries
from sasflow.store.postgres import bulk
from sasflow.store.rows import attach_steps, unit_row
from sasflow.transition import UnitChange, put_unit, unit_of

KEY = {"task_id", "phase", "idx", "updated_at"}  # the row's own, not a record's
# columns only a unit row has: a statement naming one spells out a unit's columns
UNIT_ONLY = set(columns.STEP) - set(columns.TASK) - {"phase", "idx", "name", "agent"}


def statement_files() -> dict[str, str]:
    store = resources.files("sasflow.store")
    return {path: (store / path).read_text()
            for path in ("queries.sql", "sqlite/queries.sql", "postgres/queries.sql")}


def test_every_record_field_is_a_column_and_every_column_a_unit_field() -> None:
    fields = set(StepRecord.__struct_fields__) - {"compensation"}
    assert fields == set(columns.STEP) - KEY
    assert set(CompensationRecord.__struct_fields__) <= fields
    assert fields <= set(UnitChange.__struct_fields__)


def test_no_statement_names_a_unit_column() -> None:
    assert {"attempts", "idempotency_key", "result", "in_doubt"} <= UNIT_ONLY
    for path, text in statement_files().items():
        code = "\n".join(line for line in text.splitlines()
                         if not line.lstrip().startswith("--"))
        named = {column for column in UNIT_ONLY if re.search(rf"\b{column}\b", code)}
        assert named == set(), f"{path} names unit columns itself: {sorted(named)}"


def distinct_unit() -> UnitChange:
    """A unit whose every field has a value of its own, none a default."""
    return UnitChange(index=0, phase=Phase.DO, name="reserve", agent="inventory",
                      idempotency_key="key-1", state=StepState.FAILED, attempts=3,
                      failure_count=2, complete_by=1234.5, result={"n": 1},
                      error="boom", in_doubt=True)


def test_a_unit_goes_to_its_record_and_back_field_by_field() -> None:
    unit = distinct_unit()
    steps: list[StepRecord] = []
    put_unit(steps, unit)
    [record] = steps
    again = unit_of(record, index=0, phase=Phase.DO, name=record.name, agent=record.agent)
    skip = {"from_state", "in_history"}
    assert {f: getattr(again, f) for f in UnitChange.__struct_fields__ if f not in skip} == {
        f: getattr(unit, f) for f in UnitChange.__struct_fields__ if f not in skip}


def test_a_unit_goes_to_its_row_and_back_field_by_field() -> None:
    """Rows are made by column name and read at their columns' places in columns.STEP
    (as the stores select them), whatever the columns are."""
    unit = distinct_unit()
    row = unit_row("t-1", unit, now=99.0)
    assert set(row) == set(columns.STEP)
    task = Task(task_id="t-1", workflow="w", input=None, state=TaskState.PENDING)
    attach_steps({"t-1": task}, [tuple(row[name] for name in columns.STEP)])
    expected = StepRecord(name="reserve", agent="inventory", state=StepState.FAILED,
                          attempts=3, failure_count=2, complete_by=1234.5,
                          idempotency_key="key-1", result={"n": 1}, error="boom",
                          in_doubt=True)
    assert msgspec.structs.asdict(task.steps[0]) == msgspec.structs.asdict(expected)


def test_every_postgresql_statement_is_short_enough_for_psycopg_to_parse_once() -> None:
    """psycopg keeps how it parsed a statement only up to a length: a longer one (the
    bulk transition was) is parsed again at every call, some 30 µs each. The one
    longer statements, a batch's writes, go by the raw cursor, which parses nothing."""
    limit = psycopg_queries.MAX_CACHED_STATEMENT_LENGTH
    statements = queries.load("postgres", "pyformat")
    long = {name for name, text in statements.items() if len(text) > limit}
    assert long == bulk.RAW == {"write_batch", "apply_transitions"}


def test_a_statement_numbered_for_the_raw_cursor_takes_each_name_once() -> None:
    numbered = queries.numbered("SELECT :a, :b::int WHERE x = :a")
    assert numbered.text == "SELECT $1, $2::int WHERE x = $1"
    assert numbered.values({"a": 1, "b": 2, "c": 3}) == (1, 2)
    assert queries.numbered("SELECT :only").values({"only": 7}) == (7,)
