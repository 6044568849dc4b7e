"""Guessing is slow and a session cannot be ridden (SPEC U4): failed attempts are
rate-limited per address, and a session's changes need its CSRF token."""

from __future__ import annotations

import httpx

from sasflow.web.session import COOKIE, CSRF_HEADER, FAILURE_WINDOW_S, FAILURES_ALLOWED, Guard
from support.web import AS_VIEWER, OPERATOR_TOKEN


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _guard(api: httpx.AsyncClient) -> Guard:
    guard: Guard = api._transport.app.state.guard  # type: ignore[attr-defined]
    return guard


async def test_an_address_that_keeps_failing_is_refused_until_the_window_passes(
        api: httpx.AsyncClient) -> None:
    clock = _Clock()
    _guard(api).clock = clock
    for _ in range(FAILURES_ALLOWED):
        bad = await api.get("/api/v1/tasks", headers={"Authorization": "Bearer sf_guess"})
        assert bad.status_code == 401
    blocked = await api.get("/api/v1/tasks", headers=AS_VIEWER)  # even a good token
    assert blocked.status_code == 429
    assert int(blocked.headers["retry-after"]) >= 1
    assert blocked.json()["error"]["code"] == "too_many_requests"
    clock.now += FAILURE_WINDOW_S + 1
    assert (await api.get("/api/v1/tasks", headers=AS_VIEWER)).status_code == 200


async def test_a_session_reads_with_its_cookie_and_changes_only_with_its_csrf_token(
        api: httpx.AsyncClient) -> None:
    made = _guard(api).login("127.0.0.1", "otto", OPERATOR_TOKEN)
    assert made is not None
    session_id, session = made
    api.cookies.set(COOKIE, session_id)
    assert (await api.get("/api/v1/tasks")).status_code == 200
    body = {"workflow": "restock"}
    forged = await api.post("/api/v1/tasks", json=body)
    assert forged.status_code == 403 and "CSRF" in forged.json()["error"]["message"]
    wrong = await api.post("/api/v1/tasks", json=body, headers={CSRF_HEADER: "guess"})
    assert wrong.status_code == 403
    done = await api.post("/api/v1/tasks", json=body, headers={CSRF_HEADER: session.csrf})
    assert done.status_code == 201
    _guard(api).logout(session_id)
    assert (await api.get("/api/v1/tasks")).status_code == 401


async def test_a_login_with_a_wrong_token_or_name_makes_no_session(
        api: httpx.AsyncClient) -> None:
    guard = _guard(api)
    assert guard.login("10.0.0.1", "vera", OPERATOR_TOKEN) is None  # otto's token
    assert guard.login("10.0.0.1", "otto", "sf_guess") is None
    assert guard.sessions == {}
    assert len(guard.failures["10.0.0.1"]) == 2
