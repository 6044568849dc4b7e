"""`sasflow demo` end to end: real worker processes, a real flaky HTTP service, SIGKILL.

Each run starts its own remote service and worker processes, kills one worker
mid-run (--chaos) and must still finish every order with no effect applied
twice at the service.
"""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from sasflow.examples.orders.demo import run_demo

ORDERS = 60


def run(argv: list[str], timeout: float = 300.0) -> subprocess.CompletedProcess[str]:
    """Run a command in its own session; on a timeout kill it and its workers. The
    timeout is a hang guard, past the demo's own 90 s: the demo says when it ran late."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SASFLOW_")}
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{argv} did not finish in {timeout}s:\n{out}\n{err}")
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def row(output: str, label: str) -> list[str]:
    """The fields after `label` on its line of the final table."""
    match = re.search(rf"^ +{re.escape(label)} +(.*)$", output, re.MULTILINE)
    assert match, f"no {label!r} row in:\n{output}"
    return match.group(1).split()


def assert_clean_chaos_run(result: subprocess.CompletedProcess[str]) -> None:
    output = result.stdout
    assert result.returncode == 0, f"exit {result.returncode}\n{output}\n{result.stderr}"
    assert re.search(r"^chaos: SIGKILL worker pid \d+ .* started pid \d+ in its place$",
                     output, re.MULTILINE), output
    orders = row(output, "orders")
    assert orders[:3] == [str(ORDERS), str(ORDERS), "finished"], output
    assert row(output, "duplicate effects")[0] == "0", output
    assert int(row(output, "remote effects")[0]) > 0, output
    assert "OK: every order finished" in output


@pytest.mark.chaos
def test_run_demo_with_a_worker_killed_finishes_every_order_without_duplicate_effects() -> None:
    result = run([sys.executable, "-c",
                  "from sasflow.examples.orders.demo import run_demo;"
                  f" raise SystemExit(run_demo(orders={ORDERS}, workers=2, chaos=True))"])
    assert_clean_chaos_run(result)


@pytest.mark.chaos
def test_sasflow_demo_command_with_chaos_leaves_every_order_terminal_in_its_store(
        tmp_path: Path) -> None:
    db = tmp_path / "demo.db"
    result = run([sys.executable, "-m", "sasflow.cli", "demo", "--orders", str(ORDERS),
                  "--workers", "2", "--chaos", "--store", f"sqlite:///{db}"])
    assert_clean_chaos_run(result)
    # read the store the command was given, independently of what it printed
    with sqlite3.connect(db) as conn:
        states = dict(conn.execute("SELECT state, COUNT(*) FROM tasks GROUP BY state"))
        declined = conn.execute(
            "SELECT t.state FROM tasks t JOIN orders o ON o.order_ref = t.task_id"
            " WHERE o.card = 'declined'").fetchall()
        orphans = conn.execute(  # E1: no order without its task, no task without its order
            "SELECT (SELECT COUNT(*) FROM orders WHERE order_ref NOT IN"
            " (SELECT task_id FROM tasks)) + (SELECT COUNT(*) FROM tasks WHERE task_id NOT IN"
            " (SELECT order_ref FROM orders))").fetchone()[0]
        locked = conn.execute("SELECT COUNT(*) FROM tasks WHERE locked_by IS NOT NULL"
                              ).fetchone()[0]
    assert sum(states.values()) == ORDERS
    assert set(states) <= {"processed", "compensated", "error", "cancelled"}, states
    assert declined and {s for (s,) in declined} == {"compensated"}, declined
    assert locked == 0
    assert orphans == 0


def test_run_demo_refuses_bad_sizes_and_non_sqlite_stores(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert run_demo(orders=0) == 2
    assert run_demo(workers=0) == 2
    assert run_demo(store="postgresql://localhost/x") == 2
    assert "--orders and --workers must be >= 1" in capsys.readouterr().err
