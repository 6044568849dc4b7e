"""Which app and which store the command line uses, and what `db upgrade` says it did."""

from __future__ import annotations

import json
import sqlite3
import textwrap
import uuid
from pathlib import Path

import pytest

from support.cli import Cli

APP_WITH_ITS_OWN_STORE = """
    from sasflow import App, Step

    app = App(store={store!r}, transport={transport!r})

    @app.agent("echo")
    def echo(req):
        return {{"echoed": req.input}}

    app.workflow("echo", steps=[Step("echo", agent="echo", timeout=60.0)])
"""


def write_app(folder: Path, name: str, store: str, transport: str | None = None) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.py").write_text(textwrap.dedent(
        APP_WITH_ITS_OWN_STORE.format(store=store, transport=transport)))


@pytest.fixture
def own_store_app(cli: Cli, tmp_path: Path) -> tuple[Path, Path]:
    """An app declaring `App(store=...)`, a task in that store, and a decoy `sasflow.db`
    (the default store) in the current directory holding another task."""
    folder = tmp_path / "project"
    own = folder / "own.db"
    write_app(folder, "ownapp", f"sqlite:///{own}")
    env = {"SASFLOW_STORE": ""}  # neither --store nor $SASFLOW_STORE: the app's own store
    assert cli("submit", "ownapp:app", "echo", "--task-id", "in-own-store", env=env,
               cwd=folder).status == 0
    decoy = folder / "sasflow.db"
    assert cli("submit", "ownapp:app", "echo", "--task-id", "in-default-store",
               "--store", f"sqlite:///{decoy}", cwd=folder).status == 0
    return folder, own


@pytest.mark.parametrize("command", [
    ("tasks", "list", "--json"),
    ("tasks", "show", "in-own-store", "--json"),
    ("alerts", "list", "--json"),
])
@pytest.mark.parametrize("where", ["on the command", "on the group"])
def test_read_commands_with_app_read_the_apps_own_store(
        cli: Cli, own_store_app: tuple[Path, Path], command: tuple[str, ...],
        where: str) -> None:
    """With --app and no --store, a read command reads App(store=...), not sasflow.db."""
    folder, own = own_store_app
    args = ([*command, "--app", "ownapp:app"] if where == "on the command"
            else [command[0], "--app", "ownapp:app", *command[1:]])
    result = cli(*args, env={"SASFLOW_STORE": ""}, cwd=folder)
    assert result.status == 0, result.err
    shown = json.loads(result.out)
    if command[:2] == ("tasks", "list"):
        assert [t["task_id"] for t in shown] == ["in-own-store"]
    elif command[:2] == ("tasks", "show"):
        assert shown["task_id"] == "in-own-store"
    else:
        assert shown == []
    with sqlite3.connect(own) as db:  # and it was the app's store that was read
        assert db.execute("SELECT task_id FROM tasks").fetchall() == [("in-own-store",)]


def test_db_upgrade_names_the_migrations_it_applied_then_says_up_to_date(
        cli: Cli, tmp_path: Path) -> None:
    """A fresh store: `db upgrade` lists what it applied; run again, it is up to date."""
    url = f"sqlite:///{tmp_path / 'fresh.db'}"
    first = cli("db", "upgrade", "--store", url)
    assert first.status == 0, first.err
    with sqlite3.connect(tmp_path / "fresh.db") as db:
        applied = [r[0] for r in db.execute("SELECT version FROM schema_migrations"
                                            " ORDER BY version")]
    assert applied and first.out == (
        f"applied {len(applied)} migration{'s' * (len(applied) > 1)} to {url}:"
        f" {', '.join(applied)}\n")
    assert "up to date" not in first.out
    again = cli("db", "upgrade", "--store", url)
    assert (again.status, again.out) == (0, f"schema already up to date: {url}\n")


def test_a_module_in_the_current_directory_does_not_shadow_the_broker_client(
        cli: Cli, tmp_path: Path, redis_server: str) -> None:
    """A `redis.py` beside the app: `sasflow worker app:app` still runs tasks over the
    Redis transport (the installed redis-py, not the local file)."""
    folder = tmp_path / "project"
    transport = f"{redis_server}?prefix=shadow-{uuid.uuid4().hex}:"
    write_app(folder, "redisapp", cli.store, transport)
    (folder / "redis.py").write_text(
        'raise ImportError("the redis.py of the current directory was imported")\n')
    assert cli("submit", "redisapp:app", "echo", "--task-id", "over-redis",
               "--input", '"hello"', cwd=folder).status == 0
    worker = cli.worker("redisapp:app", cwd=folder)
    task = cli.wait_for("over-redis", "processed", worker)
    assert task["steps"][0]["result"] == {"echoed": "hello"}
    assert worker.stop() == 0
    assert "current directory was imported" not in worker.text()
