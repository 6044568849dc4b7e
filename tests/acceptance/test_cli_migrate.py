"""`sasflow tasks migrate` (R4, M4): tasks of an old workflow version onto the new one.

A worker of the first release takes a declined order to error at its second step.
The next release adds a step: the task moves onto it, is retried with the next
release's application and finishes on its worker, the step that completed not run
again. A release that dropped the step the task ran refuses, saying why, and a dry
run writes nothing.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from support import APPS
from support.cli import SHOP, Cli

NEXT = f"{APPS / 'shopapp_next.py'}:app"
SHRUNK = f"{APPS / 'shopapp_next.py'}:shrunk"
FAILURE = 1


@pytest.fixture
def declined(cli: Cli, submit: Callable[..., str], tmp_path: Path) -> tuple[Path, Path]:
    """A task of the first release in error at charge; (the fix's file, the journal)."""
    fixed, journal = tmp_path / "card-fixed", tmp_path / "calls.jsonl"
    submit("order", {"decline_until": str(fixed), "journal": str(journal)}, task_id="d-1")
    worker = cli.worker(SHOP)
    cli.wait_for("d-1", "error", worker)
    assert worker.stop() == 0
    return fixed, journal


def test_a_task_in_error_moves_onto_the_next_release_and_finishes_there(
        cli: Cli, declined: tuple[Path, Path]) -> None:
    """Dry run first (nothing written), then the migration, the retry and the next
    release's worker: every step of the new list done, reserve run once."""
    fixed, journal = declined
    old = cli.task("d-1")
    before = cli.snapshot()
    dry = cli("tasks", "migrate", "--app", NEXT, "--workflow", "order", "--dry-run")
    assert dry.status == 0, dry.err
    assert f"task d-1: would migrate from {old['version']} to " in dry.out
    assert cli.snapshot() == before
    done = cli("tasks", "migrate", "--app", NEXT, "--workflow", "order", "--json")
    [moved] = done.json()
    assert (moved["task_id"], moved["from_version"], moved["migrated"]) == (
        "d-1", old["version"], True)
    task = cli.task("d-1")
    assert (task["state"], task["version"]) == ("error", moved["to_version"])
    assert [s["name"] for s in task["steps"]] == ["reserve", "charge", "ship", "notify"]
    again = cli("tasks", "migrate", "--app", NEXT, "--workflow", "order")
    assert again.status == 0 and "0 task(s) migrated, 0 refused" in again.out
    fixed.touch()
    assert cli("tasks", "retry", "d-1", "--app", NEXT).status == 0
    worker = cli.worker(NEXT)
    finished = cli.wait_for("d-1", "processed", worker)
    assert [s["state"] for s in finished["steps"]] == ["completed"] * 4
    calls = [json.loads(line)["what"] for line in journal.read_text().splitlines()]
    assert calls == ["reserve", "charge", "charge", "ship", "ship"]  # notify: the ship agent


def test_a_migration_that_would_drop_a_step_that_ran_is_refused(
        cli: Cli, declined: tuple[Path, Path]) -> None:
    """One line per refused task, one error line, exit 1, nothing written; and the
    first release's retry is refused by the next release's app, naming both versions."""
    before = cli.snapshot()
    refused = cli("tasks", "migrate", "--app", SHRUNK, "--workflow", "order")
    assert refused.status == FAILURE
    assert "task d-1: refused:" in refused.out and "'charge'" in refused.out
    assert "could not be migrated" in refused.one_error_line()
    retry = cli("tasks", "retry", "d-1", "--app", NEXT)
    assert retry.status == FAILURE
    version = cli.task("d-1")["version"]
    assert version in retry.one_error_line() and "migrate" in retry.one_error_line()
    assert cli.snapshot() == before
