"""The shape of the store wing and of the package, kept true (docs/architecture.md,
"One store, two dialects"): the dialects side by side with the same parts, a store
that knows nothing of the planner, one blocking verb, and small modules."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

from sasflow.store.interfaces import Store

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "sasflow"
STORE = PACKAGE / "store"
MAX_LINES = 400


def imported_modules(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def test_the_dialects_have_the_same_parts() -> None:
    def parts(dialect: str) -> set[str]:
        return {p.name for p in (STORE / dialect).iterdir() if not p.name.startswith("__py")}

    shared = {"__init__.py", "store.py", "connections.py", "wake.py", "migrations.py",
              "queries.sql", "migrations"}
    assert shared <= parts("sqlite")
    assert shared <= parts("postgres")


def test_the_store_does_not_import_the_planner() -> None:
    for path in STORE.rglob("*.py"):
        planner = {m for m in imported_modules(path)
                   if m == "sasflow.plan" or m.startswith("sasflow.plan.")}
        assert planner == set(), f"{path.relative_to(PACKAGE)} imports {sorted(planner)}"


def test_the_one_blocking_verb_joins_the_callers_transaction() -> None:
    """Every verb is a coroutine but the clock, the subscription to endings (which
    only registers a callback), the loop closing needs (`closes_on`: a question about
    where the connections live, no I/O) and `submit_in` (E1)."""
    verbs = {name: member for name, member in inspect.getmembers(Store)
             if not name.startswith("_") and callable(member)}
    blocking = {name for name, member in verbs.items()
                if not inspect.iscoroutinefunction(member)}
    assert blocking == {"now", "on_finished", "closes_on", "submit_in"}


def test_no_module_is_over_400_lines() -> None:
    long = {path.relative_to(PACKAGE).as_posix(): n for path in PACKAGE.rglob("*.py")
            if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert long == {}
