"""`sasflow worker --alert-webhook URL`: a real worker process on a SQLite store POSTs the
alert of a task that failed for good to a receiver on 127.0.0.1, signed; a worker
started again on the same store sends it no second time (SPEC E8)."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sasflow.store import open_store
from sasflow.store.records import DeliveryRecord
from sasflow.webhooks import verify_signature
from support import APPS
from support.cli import SHOP, WAIT, Cli
from support.receiver import Receiver
from support.waiting import wait_for

SECRET = "whsec-acceptance-0123456789"


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with Receiver() as started:
        yield started


def deliveries(cli: Cli, alert_id: int) -> list[DeliveryRecord]:
    async def read() -> list[DeliveryRecord]:
        store = open_store(cli.store, create=False)
        try:
            return await store.alert_deliveries(alert_id)
        finally:
            await store.close()

    return asyncio.run(read())


def test_a_failed_tasks_alert_reaches_the_webhook_once_across_a_restart(
        cli: Cli, submit: Callable[..., str], receiver: Receiver, tmp_path: Path) -> None:
    declined = {"decline_until": str(tmp_path / "never")}  # the card is declined for good
    cli.env["SASFLOW_ALERT_WEBHOOK_SECRET"] = SECRET
    worker = cli.worker("shopapp:app", "--alert-webhook", receiver.url, cwd=APPS)
    first = submit("order", declined, task_id="declined-1")
    [post] = receiver.wait_for(1)
    assert verify_signature(SECRET, post.headers["x-sasflow-signature"], post.body)
    alert = post.json()
    assert (alert["task_id"], alert["step"], alert["agent"]) == (first, "charge", "payments")
    assert "card declined" in alert["message"] and alert["at"].endswith("+00:00")
    assert post.alert_id == alert["id"]
    assert cli.wait_for(first, "error", worker)["state"] == "error"
    wait_for("the POST recorded as delivered",
             lambda: any(r.delivered_at for r in deliveries(cli, alert["id"])),
             timeout=WAIT, explain=worker.text)
    assert worker.stop(signal.SIGTERM) == 0
    assert SECRET not in worker.text()

    # configured by the environment alone this time
    cli.env["SASFLOW_ALERT_WEBHOOKS"] = receiver.url
    again = cli.worker("shopapp:app", cwd=APPS)
    second = submit("order", declined, task_id="declined-2")
    _, later = receiver.wait_for(2)
    assert later.json()["task_id"] == second
    # both alerts were taken, if at all, by the one look that sent the second
    assert receiver.alert_ids == [alert["id"], later.alert_id]
    [record] = deliveries(cli, alert["id"])
    assert (record.url, record.tries) == (receiver.url, 1)
    assert again.stop(signal.SIGTERM) == 0


def test_bad_webhook_settings_are_one_line_showing_no_secret(cli: Cli) -> None:
    refused = cli("worker", SHOP, "--log-level", "warning",
                  "--alert-webhook", "ftp://ops:hunter22@hooks.example.org/alerts")
    assert refused.status != 0
    line = refused.one_error_line()
    assert "bad alert webhook URL 'ftp://ops:***@hooks.example.org/alerts'" in line
    assert "hunter22" not in refused.err
    unsigned = cli("worker", SHOP, "--log-level", "warning",
                   env={"SASFLOW_ALERT_WEBHOOKS": "https://hooks.example.org/a,"})
    assert unsigned.status != 0
    assert "alert webhooks need a secret" in unsigned.one_error_line()


def test_worker_help_names_the_webhook_variables(cli: Cli) -> None:
    text = " ".join(cli("worker", "--help").out.split())
    for name in ("SASFLOW_ALERT_WEBHOOKS", "SASFLOW_ALERT_WEBHOOK_SECRET"):
        assert f"env var: {name}" in text
    assert "--alert-webhook URL" in text and "--alert-webhook-secret SECRET" in text
