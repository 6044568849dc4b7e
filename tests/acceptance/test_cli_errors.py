"""Bad input gets one clear error line and the right exit status, and writes nothing (U7).

Usage errors exit 2; anything else that fails exits 1. The store is seeded once
per module with one task; each test checks every table is exactly as it was.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from support import APPS
from support.cli import SHOP, Cli

USAGE, FAILURE = 2, 1


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cli]:
    # shared: every command here must leave the store as it is, which each test checks
    cli = Cli(tmp_path_factory.mktemp("seeded"))
    assert cli("submit", SHOP, "order", "--input", '{"sku": "kettle"}', "--task-id", "t-1"
               ).out == "t-1\n"
    yield cli
    cli.close()


@pytest.mark.parametrize(("args", "message"), [
    (["submit", SHOP, "nope", "--input", "{}"], "unknown workflow 'nope' (declared: order,"),
    (["submit", SHOP, "order", "--input", "{bad"], "--input is not valid JSON"),
    (["submit", SHOP, "order", "--input", "NaN"], "--input is not valid JSON"),
    (["submit", SHOP, "order", "--input", json.dumps("x" * 3000)],
     "input of 3002 bytes is over the limit of 2048 bytes"),
    (["submit", SHOP, "order", "--input", "@missing.json"], "cannot read --input file"),
    (["submit", SHOP, "order", "--task-id", "x" * 201], "task id must be 1-200 printable"),
    (["submit", SHOP, "order", "--reply-to", ""], "reply_to must be a queue name"),
    # the same id with other input: a conflict, not a silent no-op
    (["submit", SHOP, "order", "--task-id", "t-1", "--input", '{"sku": "toaster"}'],
     "task t-1 exists with another workflow or input"),
], ids=["unknown-workflow", "not-json", "nan", "oversized", "missing-input-file",
        "long-task-id", "empty-reply-to", "conflicting-task-id"])
def test_refused_submission_fails_with_one_line_and_writes_nothing(
        seeded: Cli, args: list[str], message: str) -> None:
    before = seeded.snapshot()
    result = seeded(*args)
    assert result.status == FAILURE
    assert message in result.one_error_line()
    assert result.out == ""
    assert seeded.snapshot() == before
    assert [t["task_id"] for t in seeded.tasks()] == ["t-1"]


def test_oversized_input_from_a_file_is_refused(seeded: Cli, tmp_path: Path) -> None:
    """--input @FILE reads the file, and its size is checked like any input."""
    big = tmp_path / "big.json"
    big.write_text(json.dumps({"note": "y" * 4000}))
    before = seeded.snapshot()
    result = seeded("submit", SHOP, "order", "--input", f"@{big}")
    assert result.status == FAILURE
    assert "over the limit of 2048 bytes" in result.one_error_line()
    assert seeded.snapshot() == before


@pytest.mark.parametrize(("args", "message"), [
    (["tasks", "list", "--bogus"], "No such option '--bogus' (see 'sasflow tasks list --help')"),
    (["tasks", "frobnicate", "t-1"], "No such command 'frobnicate'"),
    (["tasks", "show"], "Missing argument 'TASK_ID'"),
    (["tasks", "list", "--state", "finished"], "Invalid value for '--state'"),
    (["tasks", "list", "--limit", "0"], "Invalid value for '--limit'"),
    (["submit", "shopapp", "order"], "'shopapp' is not MODULE:ATTRIBUTE or PATH.py:ATTRIBUTE"),
    (["submit", "shop app:app", "order"], "'shop app' is not a module name"),
    (["submit", "apps/shopapp.txt:app", "order"], "a path must name a .py file"),
    (["tasks", "--app", "shopapp", "list"], "Invalid value for '--app'"),
    (["tasks", "retry", "t-1"], "'sasflow tasks retry' needs the application"),
    (["tasks", "cancel", "t-1"], "'sasflow tasks cancel' needs the application"),
    (["worker", SHOP, "--roles", "scheduler,planner"], "unknown 'planner'"),
    (["worker", SHOP, "--concurrency", "0"], "Invalid value for '--concurrency'"),
    (["worker", SHOP, "--supervisor-interval", "0"], "Invalid value for '--supervisor-interval'"),
    (["worker", SHOP, "--agents", "inventory,couriers"], "'couriers' not declared by"),
    # it names a queue on the broker: a space or a slash would be another queue's name
    (["worker", SHOP, "--instance-id", "pod 1/a"], "instance id 'pod 1/a' must be 1-100"),
    (["worker", SHOP, "--instance-id", "p" * 101], "must be 1-100 characters"),
    (["demo", "--orders", "0"], "Invalid value for '--orders'"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_usage_error_exits_2_with_one_line_and_writes_nothing(
        seeded: Cli, args: list[str], message: str) -> None:
    before = seeded.snapshot()
    result = seeded(*args)
    assert result.status == USAGE
    assert message in result.one_error_line()
    assert result.out == ""
    assert seeded.snapshot() == before


@pytest.mark.parametrize(("app", "message"), [
    ("nosuchmodule:app", "no module named 'nosuchmodule'"),
    (f"{APPS / 'absent.py'}:app", "no such file"),
    (f"{APPS / 'shopapp.py'}:not_an_app", "it is a dict, not a sasflow App"),
    (f"{APPS / 'shopapp.py'}:nothing", "module 'shopapp' has no attribute 'nothing'"),
    (f"{APPS / 'broken.py'}:app",
     "importing 'broken' failed: RuntimeError: the settings file is missing"),
], ids=["unknown-module", "missing-file", "not-an-app", "missing-attribute", "import-fails"])
def test_app_that_cannot_be_loaded_exits_1_with_one_line(
        seeded: Cli, app: str, message: str) -> None:
    before = seeded.snapshot()
    for args in (["submit", app, "order"], ["tasks", "retry", "t-1", "--app", app]):
        result = seeded(*args)
        assert result.status == FAILURE
        assert message in result.one_error_line()
    assert seeded.snapshot() == before


@pytest.mark.parametrize("args", [
    ["tasks", "show", "nope"],
    ["tasks", "show", "nope", "--json", "--history"],
    ["tasks", "retry", "nope", "--app", SHOP],
    ["tasks", "compensate", "nope", "--app", SHOP],
    ["tasks", "cancel", "nope", "--app", SHOP],
], ids=["show", "show-json", "retry", "compensate", "cancel"])
def test_unknown_task_id_exits_1_with_one_line_and_writes_nothing(
        seeded: Cli, args: list[str]) -> None:
    before = seeded.snapshot()
    result = seeded(*args)
    assert result.status == FAILURE
    assert result.one_error_line() == "sasflow: error: unknown task 'nope'"
    assert result.out == ""
    assert seeded.snapshot() == before


def test_unreachable_store_exits_1_with_one_line(cli: Cli, tmp_path: Path) -> None:
    """Reading a store that is not there is an error, and creates nothing."""
    missing = tmp_path / "no-such-dir" / "tasks.db"
    result = cli("tasks", "list", "--store", f"sqlite:///{missing}")
    assert result.status == FAILURE
    assert f"no SQLite store at {missing}" in result.one_error_line()
    assert not missing.parent.exists()
    bad_url = cli("tasks", "list", "--store", "mysql://localhost/tasks")
    assert bad_url.status == FAILURE
    assert "unknown store URL 'mysql://localhost/tasks'" in bad_url.one_error_line()


def test_bare_group_shows_its_help_and_exits_2(cli: Cli) -> None:
    result = cli("tasks")
    assert result.status == USAGE
    assert "Usage: sasflow tasks [OPTIONS] COMMAND" in result.err
    for command in ("list", "show", "retry", "compensate", "cancel"):
        assert command in result.err
