"""The store's SQL: named blocks of .sql files, with named parameters.

Each statement is a block headed ``-- name: NAME``, its parameters ``:name``; a
block headed ``-- fragment: NAME`` is a piece of statement, written ``{NAME}``
where it is used.
What both databases say alike is in store/queries.sql; each dialect's own file
(sqlite/queries.sql, postgres/queries.sql) adds what only it says and replaces a
shared statement where its spelling differs. Column lists are written as
``{task_columns}`` and the like (columns.py), and the model's predicates as
``{claimable}`` and ``{unfinished}``, so that they are said once. For psycopg
the parameters become ``%(name)s`` once, when the file is loaded.
"""

from __future__ import annotations

import functools
import operator
import re
from collections.abc import Callable, Iterable, Mapping
from importlib import resources
from typing import Any, Literal, NamedTuple

from sasflow.model import (
    CLAIMABLE_TASK_STATES,
    TERMINAL_TASK_STATES,
    UNFINISHED_TASK_STATES,
    TaskState,
)
from sasflow.store import columns, listing

__all__ = ["CLAIMABLE_SQL", "ENDED_SQL", "UNFINISHED_SQL", "Positional", "load", "numbered",
           "positional"]


def _states(states: Iterable[TaskState]) -> str:
    return ", ".join(f"'{state.value}'" for state in states)


# model.claimable in SQL, word for word the WHERE of the partial index tasks_claimable
# (the migrations; tests/unit/test_model.py checks that they and model.py agree).
CLAIMABLE_SQL = f"locked_by IS NULL AND state IN ({_states(CLAIMABLE_TASK_STATES)})"
# model.UNFINISHED_TASK_STATES in SQL: the tasks some worker still has to run
UNFINISHED_SQL = f"state IN ({_states(UNFINISHED_TASK_STATES)})"
# model.terminal in SQL, word for word the WHERE of the partial index tasks_ended
ENDED_SQL = f"state IN ({_states(sorted(TERMINAL_TASK_STATES))})"

_HEAD = re.compile(r"^-- (name|fragment): (\w+)\s*$", re.MULTILINE)
_EXPANSION = re.compile(r"\{(\w+)\}")
# `:name`, not the second colon of a `::type` cast nor a colon inside a word
_PARAMETER = re.compile(r"(?<![:\w]):(\w+)")

Style = Literal["named", "pyformat"]  # sqlite3's :name, psycopg's %(name)s


@functools.cache
def load(dialect: str, style: Style) -> dict[str, str]:
    """The statements of `dialect` (a package under sasflow.store), by name."""
    statements, fragments = _blocks(
        resources.files("sasflow.store").joinpath("queries.sql").read_text())
    own, own_fragments = _blocks(
        resources.files(f"sasflow.store.{dialect}").joinpath("queries.sql").read_text())
    statements.update(own)
    statements.update(listing.statements())
    expansions = {**columns.expansions(), "claimable": CLAIMABLE_SQL,
                  "unfinished": UNFINISHED_SQL, "ended": ENDED_SQL}
    for name, text in {**fragments, **own_fragments}.items():
        expansions[name] = _expand(text, expansions)
    return {name: _finish(text, expansions, style) for name, text in statements.items()}


def _blocks(text: str) -> tuple[dict[str, str], dict[str, str]]:
    """The statements and the fragments of a file, by name, comments left out (they
    may hold colons and braces)."""
    parts = _HEAD.split(text)
    found: dict[str, dict[str, str]] = {"name": {}, "fragment": {}}
    for kind, name, body in zip(parts[1::3], parts[2::3], parts[3::3], strict=True):
        lines = [line for line in body.splitlines() if not line.lstrip().startswith("--")]
        found[kind][name] = "\n".join(lines).strip()
    return found["name"], found["fragment"]


def _expand(text: str, expansions: Mapping[str, str]) -> str:
    return _EXPANSION.sub(lambda m: expansions[m.group(1)], text)


def _finish(text: str, expansions: Mapping[str, str], style: Style) -> str:
    # one space for every run of blanks (no statement holds a literal or a comment
    # with two): psycopg parses a statement of more than 4,096 characters anew at
    # every call, instead of once (tests/unit/test_columns.py keeps them under)
    statement = " ".join(_expand(text, expansions).split())
    if style == "pyformat":
        statement = _PARAMETER.sub(r"%(\1)s", statement)
    return statement


class Positional(NamedTuple):
    """A statement with ``?`` for its named parameters, and the function that takes
    their values from a row by name, in that order (a name used twice is taken twice)."""

    text: str
    values: Callable[[Mapping[str, Any]], tuple[Any, ...]]


def positional(statement: str) -> Positional:
    """`statement` (sqlite3's ``:name`` style) bound by position. The writer's
    statements run once per row of every batch: sqlite3 looks each named parameter
    up in the row by a name it makes anew for every value, which cost a history row
    1.2 µs in 5 (bench: 3.8-4.1 µs a row by position, 5.1-5.4 by name)."""
    names = _PARAMETER.findall(statement)
    take = operator.itemgetter(*names)
    values = take if len(names) > 1 else (lambda row: (take(row),))
    return Positional(_PARAMETER.sub("?", statement), values)


def numbered(statement: str) -> Positional:
    """`statement` (``:name`` style) with PostgreSQL's own ``$1``, ``$2``... (a name
    used twice is one number), for psycopg's raw cursor, which sends it as it is.
    psycopg parses a statement longer than 4,096 characters anew at every call, some
    30 µs each; the one bulk statement that writes a whole batch is longer."""
    numbers: dict[str, int] = {}

    def number(match: re.Match[str]) -> str:
        return f"${numbers.setdefault(match.group(1), len(numbers) + 1)}"

    text = _PARAMETER.sub(number, statement)
    take = operator.itemgetter(*numbers)
    values = take if len(numbers) > 1 else (lambda row: (take(row),))
    return Positional(text, values)
