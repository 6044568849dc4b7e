"""Bad input gets a 4xx with a JSON body saying what was wrong, never a stack trace,
and changes nothing (SPEC U4, U7)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from sasflow import App, TaskState
from support.web import AS_OPERATOR, AS_VIEWER


def _error(response: httpx.Response, status: int, code: str | None = None) -> str:
    assert response.status_code == status, response.text
    assert "Traceback" not in response.text
    error = response.json()["error"]
    assert error["status"] == status
    if code is not None:
        assert error["code"] == code
    assert isinstance(error["message"], str) and "\n" not in error["message"]
    return str(error["message"])


async def test_unknown_ids_are_404(api: httpx.AsyncClient) -> None:
    _error(await api.get("/api/v1/tasks/nope", headers=AS_VIEWER), 404, "unknown_task")
    _error(await api.post("/api/v1/tasks/nope/cancel", headers=AS_OPERATOR,
                          json={"reason": "x"}), 404, "unknown_task")
    _error(await api.get("/api/v1/dead-letters/nope", headers=AS_VIEWER), 404)
    _error(await api.get("/api/v1/no-such-route", headers=AS_VIEWER), 404)


async def test_bad_parameters_name_what_was_wrong(api: httpx.AsyncClient) -> None:
    said = _error(await api.get("/api/v1/tasks", params={"state": "lost"},
                                headers=AS_VIEWER), 422)
    assert "state" in said
    said = _error(await api.get("/api/v1/tasks", params={"limit": 0}, headers=AS_VIEWER), 422)
    assert "limit" in said
    said = _error(await api.get("/api/v1/tasks", params={"cursor": "not-a-cursor"},
                                headers=AS_VIEWER), 400, "bad_payload")
    assert "cursor" in said
    said = _error(await api.get("/api/v1/tasks", params={"created_from": "yesterday"},
                                headers=AS_VIEWER), 422)
    assert "created_from" in said


async def test_bad_bodies_are_refused_and_change_nothing(api: httpx.AsyncClient,
                                                          shop: App) -> None:
    said = _error(await api.post("/api/v1/tasks", headers=AS_OPERATOR,
                                 json={"workflow": "nope"}), 400, "unknown_workflow")
    assert "nope" in said
    _error(await api.post("/api/v1/tasks", headers=AS_OPERATOR,
                          json={"workflow": "order", "surprise": 1}), 422)
    _error(await api.post("/api/v1/tasks", headers={**AS_OPERATOR,
                                                    "Content-Type": "application/json"},
                          content=b"{not json"), 422)
    said = _error(await api.post("/api/v1/tasks", headers=AS_OPERATOR,
                                 json={"workflow": "order", "input": "x" * 5000}),
                  400, "bad_payload")
    assert "4096" in said  # the shop's payload limit
    _error(await api.post("/api/v1/tasks", headers=AS_OPERATOR,
                          json={"workflow": "order", "task_id": "a" * 201}), 422)
    assert (await shop.acount())[TaskState.PENDING] == 0
    assert await shop.alist() == []


async def test_a_body_over_the_limit_is_413_whether_announced_or_streamed(
        api: httpx.AsyncClient) -> None:
    big = b'{"workflow": "order", "input": "' + b"x" * 2_000_000 + b'"}'
    _error(await api.post("/api/v1/tasks", headers={**AS_OPERATOR,
                                                    "Content-Type": "application/json"},
                          content=big), 413, "payload_too_large")

    async def chunks() -> AsyncIterator[bytes]:
        for start in range(0, len(big), 65536):
            yield big[start:start + 65536]

    _error(await api.post("/api/v1/tasks", headers={**AS_OPERATOR,
                                                    "Content-Type": "application/json"},
                          content=chunks()), 413, "payload_too_large")


@pytest.mark.parametrize("path", ["/api/v1/tasks/x/retry", "/api/v1/alerts/1/acknowledge",
                                  "/api/v1/dead-letters/purge"])
async def test_an_operator_action_needs_a_reason(api: httpx.AsyncClient, path: str) -> None:
    said = _error(await api.post(path, headers=AS_OPERATOR, json={"reason": ""}), 422)
    assert "reason" in said
