"""`sasflow submit` + `sasflow worker` run tasks end to end; `tasks list/show` report them."""

from __future__ import annotations

import json
import signal
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import pytest

from support import APPS
from support.cli import SHOP, Cli

# CONTRACT.md "Command line": the fields of `tasks show --json` (more may be added)
TASK_KEYS = {"task_id", "workflow", "state", "locked_by", "complete_by", "failure_count",
             "epoch", "created_at", "updated_at", "error"}
STEP_KEYS = {"name", "agent", "state", "attempts", "failure_count", "complete_by",
             "idempotency_key", "result", "error"}


def aware(text: str) -> datetime:
    """An ISO-8601 time that carries its UTC offset."""
    moment = datetime.fromisoformat(text)
    assert moment.utcoffset() is not None, text
    return moment


def journal(path: Path) -> list[tuple[str, str]]:
    return [(e["task_id"], e["what"]) for e in map(json.loads, path.read_text().splitlines())]


def test_submitted_task_is_processed_by_a_worker_and_shown_per_contract(
        cli: Cli, tmp_path: Path) -> None:
    """The worker finds the app from the current directory (MODULE:ATTRIBUTE); each step runs
    once in order, and `tasks show --json` has the contract's shape."""
    calls = tmp_path / "calls.jsonl"
    submitted = cli("submit", SHOP, "order", "--task-id", "order-42",
                    "--input", json.dumps({"sku": "kettle", "journal": str(calls)}))
    assert (submitted.status, submitted.out, submitted.err) == (0, "order-42\n", "")
    assert cli.task("order-42")["state"] == "pending"

    worker = cli.worker("shopapp:app", "--instance-id", "w-accept-1", cwd=APPS)
    task = cli.wait_for("order-42", "processed", worker)
    assert worker.stop() == 0
    assert "worker w-accept-1 stopped" in worker.text()

    assert task.keys() >= TASK_KEYS and "input" not in task
    assert task["task_id"] == "order-42" and task["workflow"] == "order"
    assert (task["locked_by"], task["complete_by"], task["error"]) == (None, None, None)
    assert (task["failure_count"], task["epoch"]) == (0, 1)
    assert aware(task["created_at"]) <= aware(task["updated_at"])
    steps = task["steps"]
    assert [s["name"] for s in steps] == ["reserve", "charge", "ship"]
    assert [s["agent"] for s in steps] == ["inventory", "payments", "shipping"]
    assert [s["result"] for s in steps] == [
        {"reservation": "r-order-42"}, {"charge_id": "c-order-42"}, {"tracking": "t-order-42"}]
    for step in steps:
        assert step.keys() >= STEP_KEYS
        assert (step["state"], step["attempts"], step["failure_count"], step["error"]) == (
            "completed", 1, 0, None)
        aware(step["complete_by"])
    assert len({s["idempotency_key"] for s in steps}) == 3
    assert journal(calls) == [("order-42", "reserve"), ("order-42", "charge"),
                              ("order-42", "ship")]
    history = cli.task("order-42", history=True)["history"]
    assert {h["actor"] for h in history} == {"submit", "w-accept-1"}
    assert history[-1]["to_state"] in ("processed", "completed")


def test_tasks_show_prints_the_task_its_steps_and_history_as_tables(
        cli: Cli, submit: Callable[..., str]) -> None:
    submit("restock", {"sku": "kettle"}, task_id="r-1")
    shown = cli("tasks", "show", "r-1", "--history")
    assert shown.status == 0, shown.err
    lines = shown.out.splitlines()
    assert lines[0].split() == ["task", "r-1"]
    assert ["state", "pending"] in (line.split() for line in lines)
    header = next(line for line in lines if line.startswith("STEP"))
    assert header.split() == ["STEP", "AGENT", "STATE", "ATTEMPTS", "FAILURES", "COMPLETE",
                              "BY", "COMPENSATION", "DETAIL"]
    assert lines[lines.index(header) + 1].split() == [
        "reserve", "inventory", "pending", "0", "0", "-", "-"]
    assert any(line.split()[1:] == ["submit", "0", "task", "-", "->", "pending", "submitted"]
               for line in lines if line[:1].isdigit())


def test_resubmitting_the_same_task_id_and_input_is_a_no_op(
        cli: Cli, submit: Callable[..., str]) -> None:
    first = submit("order", {"sku": "kettle"})
    assert len(first) >= 16  # a fresh id when none is given
    before = cli.snapshot()
    assert submit("order", {"sku": "kettle"}, task_id=first) == first
    assert cli.snapshot() == before
    assert [t["task_id"] for t in cli.tasks()] == [first]


def test_input_can_come_from_a_file_or_stdin_and_reply_to_is_recorded(
        cli: Cli, tmp_path: Path) -> None:
    payload = tmp_path / "order.json"
    payload.write_text('{"sku": "toaster"}')
    from_file = cli("submit", SHOP, "order", "--task-id", "f-1", "--input", f"@{payload}",
                    "--reply-to", "order-status")
    from_stdin = cli("submit", SHOP, "order", "--task-id", "s-1", "--input", "-",
                     stdin='{"sku": "lamp"}')
    assert (from_file.status, from_stdin.status) == (0, 0)
    assert cli.task("f-1")["reply_to"] == "order-status"
    assert cli.task("s-1")["reply_to"] is None
    # same id and same input again is accepted: the input was stored as given
    again = cli("submit", SHOP, "order", "--task-id", "s-1", "--input", '{"sku": "lamp"}')
    assert again.status == 0, again.err
    conflict = cli("submit", SHOP, "order", "--task-id", "f-1", "--input", '{"sku": "lamp"}')
    assert conflict.status == 1


def test_list_filters_by_state_and_workflow(
        cli: Cli, submit: Callable[..., str], tmp_path: Path) -> None:
    declined = {"decline_until": str(tmp_path / "never")}
    submit("order", {"sku": "kettle"}, task_id="a-ok")
    submit("order", declined, task_id="b-declined")
    submit("restock", {"sku": "kettle"}, task_id="c-restock")
    worker = cli.worker(SHOP)
    for task_id, state in (("a-ok", "processed"), ("b-declined", "error"),
                           ("c-restock", "processed")):
        cli.wait_for(task_id, state, worker)
    assert worker.stop() == 0
    submit("order", {"sku": "lamp"}, task_id="d-pending")

    everything = cli.tasks()
    assert sorted(t["task_id"] for t in everything) == [
        "a-ok", "b-declined", "c-restock", "d-pending"]
    for task in everything:
        assert task.keys() >= TASK_KEYS and "steps" not in task

    def ids(*args: str) -> list[str]:
        return sorted(t["task_id"] for t in cli.tasks(*args))

    assert ids("--state", "error") == ["b-declined"]
    assert ids("--state", "pending") == ["d-pending"]
    assert ids("--workflow", "restock") == ["c-restock"]
    assert ids("--state", "processed", "--workflow", "order") == ["a-ok"]
    assert ids("--state", "cancelled") == []
    assert ids("--workflow", "nothing-like-this") == []
    assert len(ids("--limit", "2")) == 2

    table = cli("tasks", "list", "--state", "error").out.splitlines()
    assert table[0].split() == ["TASK", "ID", "WORKFLOW", "STATE", "FAILURES", "LOCKED", "BY",
                                "UPDATED"]
    assert table[1].split()[:5] == ["b-declined", "order", "error", "0", "-"]
    assert cli("tasks", "list", "--state", "cancelled").out == "no tasks\n"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_worker_exits_0_on_signal(cli: Cli, sig: int) -> None:
    worker = cli.worker(SHOP, "--log-level", "debug")
    worker.wait_for_log("leading")  # its roles are running, not only starting
    assert worker.stop(sig) == 0
    assert "stopped" in worker.text() and "Traceback" not in worker.text()
    assert cli.snapshot()["leases"], "the supervisor role took its lease"


def test_worker_settings_come_from_environment_variables(
        cli: Cli, submit: Callable[..., str]) -> None:
    """SASFLOW_INSTANCE_ID, SASFLOW_ROLES and SASFLOW_LOG_LEVEL work like their options."""
    submit("restock", task_id="env-1")
    cli.env.update(SASFLOW_INSTANCE_ID="w-from-env", SASFLOW_ROLES="scheduler,agent",
                   SASFLOW_LOG_LEVEL="warning")
    worker = cli.worker(SHOP, ready=None)
    cli.wait_for("env-1", "processed", worker)
    assert worker.stop() == 0
    actors = {h["actor"] for h in cli.task("env-1", history=True)["history"]}
    assert actors == {"submit", "w-from-env"}
    assert "INFO" not in worker.text()
    assert cli.snapshot()["leases"] == [], "no supervisor role, so no supervisor lease"


def test_worker_that_cannot_start_exits_1_with_one_error_line(
        cli: Cli, submit: Callable[..., str]) -> None:
    submit("restock", task_id="x-1")
    before = cli.snapshot()
    result = cli("worker", SHOP, "--transport", "carrier-pigeon://loft")
    assert result.status == 1
    assert result.err.splitlines()[-1] == (
        "sasflow: error: unknown transport URL 'carrier-pigeon://loft':"
        " expected memory, amqp://... or redis://...")
    assert cli.snapshot() == before


PROBE_APP = """
import gc

from sasflow import App, Step

app = App()


@app.agent("probe")
def probe(req):
    return {"threshold": gc.get_threshold()[0], "frozen": gc.get_freeze_count()}


app.workflow("probe", steps=[Step("probe", agent="probe", timeout=60.0)])
"""


@pytest.mark.parametrize(("args", "threshold"), [((), 10_000),
                                                 (("--gc-threshold", "2500"), 2500)])
def test_a_worker_sets_the_garbage_collector_for_a_process_that_only_runs_roles(
        cli: Cli, tmp_path: Path, args: tuple[str, ...], threshold: int) -> None:
    """What the worker loaded at start is frozen out of collections, and the youngest
    generation is collected every --gc-threshold allocations, as its agents see."""
    app = tmp_path / "probeapp.py"
    app.write_text(PROBE_APP)
    assert cli("submit", f"{app}:app", "probe", "--task-id", "p-1").status == 0
    worker = cli.worker(f"{app}:app", *args)
    task = cli.wait_for("p-1", "processed", worker)
    assert worker.stop() == 0
    result = task["steps"][0]["result"]
    assert result["threshold"] == threshold
    assert result["frozen"] > 10_000  # sasflow, the app and their libraries
