"""The HTTP API over a running shop (SPEC U4, E8): submit, list, show, and the
operator's actions, each recorded in the task's history with who and why."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from sasflow import App, TaskState
from support.web import AS_OPERATOR, AS_VIEWER


async def _submit(api: httpx.AsyncClient, workflow: str = "order", input: Any = None,
                  task_id: str | None = None) -> str:
    response = await api.post("/api/v1/tasks", headers=AS_OPERATOR,
                              json={"workflow": workflow, "input": input, "task_id": task_id})
    assert response.status_code == 201, response.text
    task_id = response.json()["task_id"]
    assert isinstance(task_id, str)
    return task_id


async def _ended(shop: App, task_id: str, state: TaskState) -> None:
    task = await shop.await_(task_id, timeout=120)
    assert task.state is state, (task.state, task.error)


async def test_a_task_submitted_through_the_api_runs_and_shows_its_steps_and_history(
        api: httpx.AsyncClient, shop: App) -> None:
    task_id = await _submit(api, input={"order": 7}, task_id="order-7")
    assert task_id == "order-7"
    await _ended(shop, task_id, TaskState.PROCESSED)
    shown = (await api.get(f"/api/v1/tasks/{task_id}", headers=AS_VIEWER)).json()
    assert shown["state"] == "processed" and shown["input"] == {"order": 7}
    assert [s["name"] for s in shown["steps"]] == ["reserve", "charge", "ship"]
    assert all(s["state"] == "completed" and s["attempts"] == 1 for s in shown["steps"])
    assert shown["steps"][1]["result"] == {"charge_id": "c-order-7"}
    assert shown["history"][0]["to_state"] == "pending"
    task_moves = [h["to_state"] for h in shown["history"] if h["step"] is None]
    assert task_moves == ["pending", "processing", "processing", "processing", "processed"]
    again = await api.post("/api/v1/tasks", headers=AS_OPERATOR,
                           json={"workflow": "order", "input": {"order": 7},
                                 "task_id": "order-7"})
    assert again.status_code == 201  # idempotent on the id


async def test_an_operator_retries_a_failed_step_once_its_cause_is_fixed(
        api: httpx.AsyncClient, shop: App, tmp_path: Path) -> None:
    fixed = tmp_path / "card-replaced"
    task_id = await _submit(api, input={"decline_until": str(fixed)})
    await _ended(shop, task_id, TaskState.ERROR)
    failed = (await api.get(f"/api/v1/tasks/{task_id}", headers=AS_VIEWER)).json()
    assert failed["steps"][1]["state"] == "failed"
    assert failed["steps"][1]["error"] == "card declined"
    no_reason = await api.post(f"/api/v1/tasks/{task_id}/retry", headers=AS_OPERATOR,
                               json={})
    assert no_reason.status_code == 422
    assert "reason" in no_reason.json()["error"]["message"]
    fixed.touch()
    retried = await api.post(f"/api/v1/tasks/{task_id}/retry", headers=AS_OPERATOR,
                             json={"reason": "the customer replaced the card"})
    assert retried.status_code == 200, retried.text
    await _ended(shop, task_id, TaskState.PROCESSED)
    history = (await api.get(f"/api/v1/tasks/{task_id}", headers=AS_VIEWER)).json()["history"]
    [retry] = [h for h in history if h["actor"] == "operator:otto" and h["step"] is None]
    assert retry["from_state"] == "error" and retry["to_state"] == "pending"
    assert retry["why"] == "operator retry of charge: the customer replaced the card"
    assert retry["at"] is not None


async def test_compensate_and_cancel_record_who_and_why(api: httpx.AsyncClient, shop: App,
                                                        tmp_path: Path) -> None:
    never = str(tmp_path / "never")
    first = await _submit(api, input={"decline_until": never})
    second = await _submit(api, input={"decline_until": never})
    await _ended(shop, first, TaskState.ERROR)
    await _ended(shop, second, TaskState.ERROR)
    undo = await api.post(f"/api/v1/tasks/{first}/compensate", headers=AS_OPERATOR,
                          json={"reason": "order withdrawn"})
    assert undo.status_code == 200, undo.text
    await _ended(shop, first, TaskState.COMPENSATED)
    shown = (await api.get(f"/api/v1/tasks/{first}", headers=AS_VIEWER)).json()
    assert shown["steps"][0]["compensation"]["state"] == "compensated"
    assert any(h["actor"] == "operator:otto" and h["why"].endswith(": order withdrawn")
               for h in shown["history"])
    cancel = await api.post(f"/api/v1/tasks/{second}/cancel", headers=AS_OPERATOR,
                            json={"reason": "duplicate order"})
    assert cancel.status_code == 200 and cancel.json()["state"] == "cancelled"
    refused = await api.post(f"/api/v1/tasks/{second}/retry", headers=AS_OPERATOR,
                             json={"reason": "try again"})
    assert refused.status_code == 409
    assert refused.json()["error"]["code"] == "invalid_transition"


async def test_the_list_pages_by_cursor_filters_and_counts(api: httpx.AsyncClient,
                                                           shop: App, tmp_path: Path) -> None:
    ids = [await _submit(api, "restock") for _ in range(5)]
    failing = await _submit(api, input={"decline_until": str(tmp_path / "never")})
    for task_id in ids:
        await _ended(shop, task_id, TaskState.PROCESSED)
    await _ended(shop, failing, TaskState.ERROR)
    seen: list[str] = []
    cursor = None
    while True:
        params: dict[str, Any] = {"limit": 2, "workflow": "restock"}
        if cursor:
            params["cursor"] = cursor
        page = (await api.get("/api/v1/tasks", params=params, headers=AS_VIEWER)).json()
        seen += [t["task_id"] for t in page["tasks"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == list(reversed(ids))  # newest first
    oldest = (await api.get("/api/v1/tasks", params={"order": "oldest", "limit": 10},
                            headers=AS_VIEWER)).json()["tasks"]
    assert [t["task_id"] for t in oldest] == [*ids, failing]
    errors = (await api.get("/api/v1/tasks", params={"state": "error"},
                            headers=AS_VIEWER)).json()["tasks"]
    assert [t["task_id"] for t in errors] == [failing]
    found = (await api.get("/api/v1/tasks", params={"task_id": ids[2]},
                           headers=AS_VIEWER)).json()["tasks"]
    assert [t["task_id"] for t in found] == [ids[2]]
    # between the first two tasks' times (a time shown is rounded to the microsecond)
    first, second = (datetime.fromisoformat(t["created_at"]) for t in oldest[:2])
    between = (first + (second - first) / 2).isoformat()
    later = (await api.get("/api/v1/tasks", params={"created_from": between,
                                                    "order": "oldest"},
                           headers=AS_VIEWER)).json()["tasks"]
    assert [t["task_id"] for t in later] == [*ids[1:], failing]
    counts = (await api.get("/api/v1/tasks/counts", headers=AS_VIEWER)).json()
    assert counts["counts"]["processed"] == 5 and counts["counts"]["error"] == 1
    assert counts["total"] == 6 and set(counts["counts"]) == {s.value for s in TaskState}


async def test_an_alert_is_listed_and_acknowledged_once(api: httpx.AsyncClient, shop: App,
                                                        tmp_path: Path) -> None:
    task_id = await _submit(api, input={"decline_until": str(tmp_path / "never")})
    await _ended(shop, task_id, TaskState.ERROR)
    [alert] = (await api.get("/api/v1/alerts", headers=AS_VIEWER)).json()["alerts"]
    assert alert["task_id"] == task_id and alert["step"] == "charge"
    assert alert["acknowledged_at"] is None
    acked = await api.post(f"/api/v1/alerts/{alert['id']}/acknowledge", headers=AS_OPERATOR,
                           json={"reason": "customer called"})
    assert acked.status_code == 200
    assert acked.json()["acknowledged_by"] == "operator:otto"
    assert acked.json()["acknowledged_why"] == "customer called"
    unknown = await api.post("/api/v1/alerts/999999/acknowledge", headers=AS_OPERATOR,
                             json={"reason": "x"})
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "unknown_alert"


async def test_instances_show_the_running_worker_with_its_heartbeat(
        api: httpx.AsyncClient, shop: App) -> None:
    await _ended(shop, await _submit(api, "restock"), TaskState.PROCESSED)
    instances = (await api.get("/api/v1/instances", headers=AS_VIEWER)).json()["instances"]
    [me] = [i for i in instances if i["live"]]
    assert set(me["roles"]) == {"scheduler", "agent", "supervisor"}
    assert me["workflows"].keys() == {"order", "restock"}
    assert me["heartbeat_age_s"] >= 0
