"""Operator commands on a task that ended in error: alerts, retry, compensate, cancel (E8, S9).

Each test lets a worker take a declined order to error (and a good one to
processed), stops it, acts with the command line, then, where the action hands
the task back to the workers, starts one again to see the action through.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from support.cli import SHOP, Cli

FAILURE = 1


class Shop:
    """The store after a worker ran: `declined` in error, `ok` processed."""

    declined = "declined-1"
    ok = "ok-1"

    def __init__(self, cli: Cli, tmp_path: Path) -> None:
        self.cli = cli
        self.fixed = tmp_path / "card-fixed"  # the cause of the decline, fixed once it exists
        self.calls = tmp_path / "calls.jsonl"

    def journal(self, task_id: str) -> list[str]:
        entries = map(json.loads, self.calls.read_text().splitlines())
        return [e["what"] for e in entries if e["task_id"] == task_id]

    def refused(self, *args: str, message: str) -> None:
        """The command fails with `message` and changes nothing."""
        before = self.cli.snapshot()
        result = self.cli(*args, "--app", SHOP)
        assert result.status == FAILURE
        assert message in result.one_error_line()
        assert self.cli.snapshot() == before


@pytest.fixture
def shop(cli: Cli, submit: Callable[..., str], tmp_path: Path) -> Shop:
    world = Shop(cli, tmp_path)
    submit("order", {"decline_until": str(world.fixed), "journal": str(world.calls)},
           task_id=world.declined)
    submit("order", {"journal": str(world.calls)}, task_id=world.ok)
    worker = cli.worker(SHOP)
    cli.wait_for(world.declined, "error", worker)
    cli.wait_for(world.ok, "processed", worker)
    assert worker.stop() == 0
    return world


def test_task_in_error_raises_an_alert_listed_as_json(cli: Cli, shop: Shop) -> None:
    task = cli.task(shop.declined)
    assert task["error"] == "step charge failed: card declined"
    assert [s["state"] for s in task["steps"]] == ["completed", "failed", "pending"]

    alerts = cli("alerts", "list", "--json").json()
    assert len(alerts) == 1
    alert = alerts[0]
    assert set(alert) == {"id", "task_id", "step", "agent", "at", "message"}
    assert (alert["task_id"], alert["step"], alert["agent"]) == (
        shop.declined, "charge", "payments")
    assert "card declined" in alert["message"]
    assert datetime.fromisoformat(alert["at"]).utcoffset() is not None
    assert isinstance(alert["id"], int)
    assert cli("alerts", "list", "--json", "--after", str(alert["id"])).json() == []

    table = cli("alerts", "list").out.splitlines()
    assert table[0].split() == ["ID", "AT", "TASK", "ID", "STEP", "AGENT", "MESSAGE"]
    assert table[1].split()[2:5] == [shop.declined, "charge", "payments"]


def test_retry_is_refused_unless_the_task_has_a_failed_step_then_resubmits_it(
        cli: Cli, shop: Shop) -> None:
    """A refused retry writes nothing; an accepted one puts the failed step back to pending
    with its failure count reset and the operator in the history; a worker then finishes
    the task without running the completed step again."""
    shop.refused("tasks", "retry", shop.ok,
                 message=f"cannot retry task {shop.ok}: it is processed")
    shop.refused("tasks", "retry", shop.declined, "--step", "ship",
                 message="step 'ship' is not the failed step 'charge'")

    # the app from the environment, as an operator's shell would have it
    retried = cli("tasks", "retry", shop.declined, "--step", "charge",
                  env={"SASFLOW_APP": SHOP})
    assert (retried.status, retried.out) == (0, f"task {shop.declined}: pending\n")
    task = cli.task(shop.declined, history=True)
    assert (task["state"], task["failure_count"], task["error"], task["locked_by"]) == (
        "pending", 0, None, None)
    charge = task["steps"][1]
    assert (charge["name"], charge["state"], charge["failure_count"]) == ("charge", "pending", 0)
    last = task["history"][-2:]
    assert {h["actor"] for h in last} == {"operator"}
    assert any(h["why"] == "operator retry of charge" and h["from_state"] == "error"
               and h["to_state"] == "pending" for h in last)
    shop.refused("tasks", "retry", shop.declined, message="it is pending")

    shop.fixed.touch()  # the operator fixed the cause
    worker = cli.worker(SHOP)
    done = cli.wait_for(shop.declined, "processed", worker)
    assert worker.stop() == 0
    assert [s["state"] for s in done["steps"]] == ["completed"] * 3
    assert shop.journal(shop.declined) == ["reserve", "charge", "charge", "ship"]


def test_compensate_undoes_the_completed_steps_of_a_task_in_error(
        cli: Cli, shop: Shop) -> None:
    shop.refused("tasks", "compensate", shop.ok,
                 message=f"cannot compensate task {shop.ok}: it is processed")

    # --app given to the group rather than to the command
    started = cli("tasks", "--app", SHOP, "compensate", shop.declined, "--json")
    task = started.json()
    assert task["task_id"] == shop.declined and task["state"] == "compensating"
    shop.refused("tasks", "compensate", shop.declined, message="it is already compensating")

    worker = cli.worker(SHOP)
    done = cli.wait_for(shop.declined, "compensated", worker)
    assert worker.stop() == 0
    reserve, charge, ship = done["steps"]
    assert reserve["state"] == "compensated"
    assert reserve["compensation"]["state"] == "compensated"
    assert reserve["compensation"]["idempotency_key"] != reserve["idempotency_key"]
    assert (charge["state"], ship["state"]) == ("failed", "pending")
    # the declined charge did nothing, so only the reservation is undone, once
    assert shop.journal(shop.declined) == ["reserve", "charge", "release"]
    assert any(h["actor"] == "operator" and h["to_state"] == "compensating"
               for h in cli.task(shop.declined, history=True)["history"])

    shown = cli("tasks", "show", shop.declined).out.splitlines()
    row = next(line for line in shown if line.startswith("reserve "))
    assert row.split()[2] == "compensated" and row.split()[6] == "compensated"


def test_cancel_stops_a_task_in_error_or_pending_and_is_then_final(
        cli: Cli, shop: Shop, submit: Callable[..., str]) -> None:
    shop.refused("tasks", "cancel", shop.ok,
                 message=f"cannot cancel task {shop.ok}: it is processed")

    cancelled = cli("tasks", "cancel", shop.declined, "--app", SHOP)
    assert (cancelled.status, cancelled.out) == (0, f"task {shop.declined}: cancelled\n")
    task: dict[str, Any] = cli.task(shop.declined, history=True)
    assert task["state"] == "cancelled" and task["locked_by"] is None
    assert task["history"][-1]["actor"] == "operator"
    assert task["history"][-1]["why"] == "operator cancelled"
    for action in ("cancel", "retry", "compensate"):
        shop.refused("tasks", action, shop.declined, message="it is cancelled")

    submit("order", {"sku": "lamp"}, task_id="p-1")
    assert cli("tasks", "cancel", "p-1", "--app", SHOP).status == 0
    assert cli.task("p-1")["state"] == "cancelled"
    assert sorted(t["task_id"] for t in cli.tasks("--state", "cancelled")) == [
        shop.declined, "p-1"]
