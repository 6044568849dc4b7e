"""The dashboard's pages as a browser gets them (SPEC U4): a visitor without a
session is sent to the login page, a login makes an HttpOnly SameSite session, and
every user-supplied string is escaped. (tests/web/test_browser.py drives the same
pages in a real Chromium.)"""

from __future__ import annotations

import httpx

from sasflow import App, TaskState
from support.web import AS_OPERATOR, OPERATOR_TOKEN, VIEWER_TOKEN

HOSTILE = "<script>alert('x')</script>"


async def _login(api: httpx.AsyncClient, name: str, token: str) -> httpx.Response:
    return await api.post("/login", data={"name": name, "token": token, "next": "/tasks"})


async def test_an_anonymous_visitor_is_sent_to_the_login_page(api: httpx.AsyncClient) -> None:
    for page in ("/", "/tasks", "/tasks/x", "/alerts", "/instances", "/dead-letters"):
        response = await api.get(page)
        assert response.status_code == 303, page
        assert response.headers["location"].startswith("/login?next="), page
    form = await api.get("/login")
    assert form.status_code == 200 and 'name="token"' in form.text


async def test_a_login_makes_a_strict_http_only_session(api: httpx.AsyncClient) -> None:
    wrong = await _login(api, "otto", VIEWER_TOKEN)
    assert wrong.status_code == 401 and "wrong token" in wrong.text
    assert "sasflow_session" not in wrong.headers.get("set-cookie", "")
    made = await _login(api, "otto", OPERATOR_TOKEN)
    assert made.status_code == 303 and made.headers["location"] == "/tasks"
    cookie = made.headers["set-cookie"].lower()
    assert "httponly" in cookie and "samesite=strict" in cookie and "secure" not in cookie
    overview = await api.get("/")
    assert overview.status_code == 200 and "open alerts" in overview.text
    away = await api.post("/login", data={"name": "otto", "token": OPERATOR_TOKEN,
                                          "next": "//evil.example/"})
    assert away.headers["location"] == "/"  # never a redirect to another site


async def test_user_supplied_strings_are_shown_as_text(api: httpx.AsyncClient,
                                                       shop: App) -> None:
    submitted = await api.post("/api/v1/tasks", headers=AS_OPERATOR,
                               json={"workflow": "restock", "task_id": HOSTILE,
                                     "input": {"note": HOSTILE}})
    assert submitted.status_code == 201
    assert (await shop.await_(HOSTILE, timeout=120)).state is TaskState.PROCESSED
    await _login(api, "otto", OPERATOR_TOKEN)
    listed = await api.get("/tasks", params={"workflow": "restock"})
    page = await api.get("/tasks/" + httpx.URL(path=HOSTILE).raw_path.decode())
    for response in (listed, page):
        assert response.status_code == 200
        assert HOSTILE not in response.text
        assert "&lt;script&gt;" in response.text


async def test_a_page_refreshes_its_main_part_alone(api: httpx.AsyncClient) -> None:
    await _login(api, "otto", OPERATOR_TOKEN)
    whole = await api.get("/tasks")
    part = await api.get("/tasks", params={"fragment": "1"})
    assert "<html" in whole.text and 'id="live"' in whole.text
    assert "<html" not in part.text and "<table" in part.text


async def test_a_task_page_links_to_its_trace_when_told_where(shop: App) -> None:
    from sasflow.tracing import trace_id_of
    from sasflow.web.app import create_app
    from support.web import USERS

    web = create_app(shop, USERS, trace_url="http://traces.test/trace/{trace_id}")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=web),
                                 base_url="http://sasflow.test") as api:
        task_id = await shop.asubmit("restock", None)
        await _login(api, "otto", OPERATOR_TOKEN)
        page = await api.get(f"/tasks/{task_id}")
    assert f'href="http://traces.test/trace/{trace_id_of(task_id)}"' in page.text
    assert len(trace_id_of(task_id)) == 32
