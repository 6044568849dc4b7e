"""The store's state for Prometheus through the HTTP API (U5): tasks by state and the
running workers' heartbeats, for viewers only."""

from __future__ import annotations

from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from sasflow import App, TaskState
from support.web import AS_OPERATOR, AS_VIEWER


def samples(text: str) -> dict[tuple[str, str], float]:
    """(name, its one label's value) -> value, for every sample of the page."""
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            [label] = sample.labels.values()
            found[(sample.name, label)] = sample.value
    return found


async def test_metrics_count_the_stores_tasks_and_each_running_workers_heartbeat(
        api: httpx.AsyncClient, shop: App, tmp_path: Path) -> None:
    assert (await api.get("/api/v1/metrics")).status_code == 401
    for body in ({"workflow": "restock"}, {"workflow": "restock"},
                 {"workflow": "order", "input": {"decline_until": str(tmp_path / "never")}}):
        created = await api.post("/api/v1/tasks", headers=AS_OPERATOR, json=body)
        assert created.status_code == 201, created.text
        task = await shop.await_(created.json()["task_id"], timeout=120)
        assert task.state in (TaskState.PROCESSED, TaskState.ERROR)

    page = await api.get("/api/v1/metrics", headers=AS_VIEWER)
    assert page.status_code == 200, page.text
    assert page.headers["content-type"].startswith("text/plain")
    found = samples(page.text)
    counts = await shop.acount()
    assert counts[TaskState.PROCESSED] == 2 and counts[TaskState.ERROR] == 1
    assert {state: found[("sasflow_tasks", state.value)] for state in TaskState} == counts

    [worker] = [i for i in await shop.ainstances() if i.stopped_at is None]
    age = found[("sasflow_worker_heartbeat_age_seconds", worker.instance_id)]
    lease = found[("sasflow_worker_heartbeat_lease_seconds", worker.instance_id)]
    assert age >= 0 and lease == worker.lease
    assert found[("sasflow_worker_live", worker.instance_id)] == float(age <= lease)

    # where Prometheus looks by default, the same page
    again = await api.get("/metrics", headers=AS_VIEWER)
    assert again.status_code == 200
    assert samples(again.text)[("sasflow_tasks", "processed")] == 2
    assert (await api.get("/metrics")).status_code == 401
