"""`sasflow worker --metrics-port` serves the worker's own Prometheus metrics (U5)."""

from __future__ import annotations

import json
import re

import httpx
from prometheus_client.parser import text_string_to_metric_families

from support import APPS
from support.cli import SHOP, Cli


def test_a_worker_serves_its_metrics_on_its_port_once_a_task_ran(cli: Cli) -> None:
    """Port 0 takes a free port, which the log names; after a task, each of its three
    agents shows one request that ended ok, and the workflows' series are there at 0."""
    worker = cli.worker("shopapp:app", "--instance-id", "w-metrics", "--metrics-port", "0",
                        cwd=APPS, ready="serving metrics on")
    [url] = re.findall(r"serving metrics on (http://127\.0\.0\.1:\d+/metrics)", worker.text())
    submitted = cli("submit", SHOP, "order", "--task-id", "order-1",
                    "--input", json.dumps({"sku": "kettle"}))
    assert submitted.status == 0, submitted.err
    cli.wait_for("order-1", "processed", worker)

    page = httpx.get(url, timeout=30)
    assert page.status_code == 200
    found = {(s.name, tuple(sorted(s.labels.items()))): s.value
             for family in text_string_to_metric_families(page.text) for s in family.samples}
    for agent in ("inventory", "payments", "shipping"):
        key = ("sasflow_step_duration_seconds_count", (("agent", agent), ("outcome", "ok")))
        assert found[key] == 1, agent
        assert found[("sasflow_breaker_state", (("agent", agent),))] == 0
    for workflow in ("order", "restock"):
        assert found[("sasflow_step_retries_total", (("workflow", workflow),))] == 0
    assert found[("sasflow_alerts_total", (("kind", "task"),))] == 0
    assert worker.stop() == 0
    assert "worker w-metrics stopped" in worker.text()
