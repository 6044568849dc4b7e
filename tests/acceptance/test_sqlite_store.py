"""The SQLite store as a user meets it: its files' modes (R5), a submission joining
the caller's transaction in a fresh process (E1), and a full disk."""

from __future__ import annotations

import os
import sqlite3
import stat
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from sasflow import App, Step, StoreError
from sasflow.agent import AgentRequest
from support.services import require_root

# the README's "join your own transaction" example, run as it is shown, in a process
# that has not used the store before
README_E1 = """
import sqlite3, sys, time
from sasflow import App, Step

app = App(store="sqlite:///orders.db")

@app.agent("inventory")
def reserve(req):
    return {{}}

app.workflow("process-order", steps=[Step("reserve", agent="inventory", timeout=5.0)])

{prepare}
with sqlite3.connect("orders.db") as conn:        # the store's own file
    conn.execute("INSERT INTO orders VALUES (?, ?)", (42, "new"))
    app.submit("process-order", {{"order_id": 42}}, task_id="order-42", connection=conn)
print(app.get("order-42").state.value)
app.close()
"""

MAKE_ORDERS = """
with sqlite3.connect("orders.db") as conn:
    conn.execute("CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY, state TEXT)")
"""


def app_on(url: str) -> App:
    app = App(store=url)

    @app.agent("echo")
    def echo(req: AgentRequest) -> dict[str, str]:
        return {}

    app.workflow("wf", steps=[Step("s", agent="echo", timeout=60.0)])
    return app


def test_a_new_store_and_its_wal_and_shm_files_are_readable_by_their_owner_only(
        tmp_path: Path) -> None:
    """Whatever the umask, the file, its -wal and its -shm are created 0600."""
    old = os.umask(0o022)
    try:
        app = app_on(f"sqlite:///{tmp_path / 'tasks.db'}")
        app.submit("wf", {}, task_id="t1")
        files = [tmp_path / name for name in ("tasks.db", "tasks.db-wal", "tasks.db-shm")]
        modes = {f.name: oct(stat.S_IMODE(f.stat().st_mode)) for f in files}
        app.close()
    finally:
        os.umask(old)
    assert modes == {"tasks.db": "0o600", "tasks.db-wal": "0o600", "tasks.db-shm": "0o600"}


@pytest.mark.parametrize("store_before", [
    pytest.param("", id="fresh-file"),
    pytest.param("App(store='sqlite:///orders.db').get", id="store-made-by-another-process"),
])
def test_readme_submit_in_the_callers_transaction_works_in_a_fresh_process(
        tmp_path: Path, store_before: str) -> None:
    """E1 exactly as the README shows it, the store not yet opened in that process: the
    task commits with the order (no 'database is locked' after 30 s)."""
    prepare = MAKE_ORDERS
    if store_before:  # another process made the store (and its schema) before
        subprocess.run([sys.executable, "-c", textwrap.dedent("""
            from sasflow import App
            from sasflow.errors import UnknownTaskError
            app = App(store="sqlite:///orders.db")
            try:
                app.get("none")
            except UnknownTaskError:
                pass
            app.close()
        """)], cwd=tmp_path, check=True, timeout=60)
    script = tmp_path / "e1.py"
    script.write_text(README_E1.format(prepare=prepare))
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=25)  # a hang guard below the 30 s lock wait
    assert (done.returncode, done.stdout, done.stderr) == (0, "pending\n", "")
    with sqlite3.connect(tmp_path / "orders.db") as db:
        assert db.execute("SELECT id FROM orders").fetchall() == [(42,)]
        assert db.execute("SELECT task_id FROM tasks").fetchall() == [("order-42",)]


def test_a_rolled_back_caller_transaction_takes_the_task_and_the_schema_with_it(
        tmp_path: Path) -> None:
    """The schema brought up inside the caller's transaction rolls back with it; the
    store brings it up again on its next use."""
    path = tmp_path / "orders.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY)")
    app = app_on(f"sqlite:///{path}")
    conn = sqlite3.connect(path)
    conn.execute("INSERT INTO orders VALUES (1)")
    app.submit("wf", {}, task_id="rolled-back", connection=conn)
    conn.rollback()
    conn.close()
    app.submit("wf", {}, task_id="kept")
    app.close()
    assert task_ids(path) == ["kept"]


# ---------------------------------------------------------------- a full disk
@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs mounted for this test (root only: skip elsewhere, fail in CI)."""
    require_root("mounting a tmpfs")
    mount = tmp_path / "disk"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)],
                   check=True, timeout=30)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=True, timeout=30)


def fill(folder: Path) -> Path:
    """Fill the file system of `folder` to the last byte; returns the filler file."""
    filler = folder / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for size in (65536, 4096, 1):
            try:
                while True:
                    os.write(fd, b"\0" * size)
            except OSError:
                pass
    finally:
        os.close(fd)
    return filler


def task_ids(path: Path) -> list[str]:
    with sqlite3.connect(path) as db:
        return [r[0] for r in db.execute("SELECT task_id FROM tasks ORDER BY task_id")]


def test_a_full_disk_is_a_store_error_naming_it_writes_nothing_and_work_resumes(
        small_disk: Path) -> None:
    """Submit on a full disk: StoreError saying so (not sqlite3's own error), no row
    of the refused task; with space again, submitting works."""
    app = app_on(f"sqlite:///{small_disk / 'tasks.db'}")
    app.submit("wf", {"n": 0}, task_id="before")
    filler = fill(small_disk)
    refused: list[StoreError] = []
    for n in range(200):  # the WAL may still hold free pages: write till it is full
        try:
            app.submit("wf", {"padding": "x" * 1500}, task_id=f"full-{n}")
        except StoreError as error:
            refused.append(error)
            break
    assert refused, "the disk never filled up"
    message = str(refused[0])
    assert "out of disk space" in message and str(small_disk / "tasks.db") in message
    assert not isinstance(refused[0], sqlite3.Error)
    refused_id = f"full-{n}"
    filler.unlink()
    app.submit("wf", {}, task_id="after")
    task = app.get("after")
    assert [s.state.value for s in task.steps] == ["pending"]
    app.close()
    ids = task_ids(small_disk / "tasks.db")
    assert {"before", "after"} <= set(ids) and refused_id not in ids
