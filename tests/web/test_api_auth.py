"""Nobody reaches the API without a token or a session, and a viewer cannot act
(SPEC U4): checked for every route of the OpenAPI document, so a route added
later without its role fails here."""

from __future__ import annotations

import re
from typing import Any

import httpx
import pytest

from sasflow.web.api import ROLE_KEY
from sasflow.web.auth import OPERATOR, VIEWER
from support.web import AS_OPERATOR, AS_VIEWER

pytestmark = pytest.mark.usefixtures("shop")

_METHODS = ("get", "post", "put", "patch", "delete")


def _routes(document: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(method, path with its parameters filled in, role) of every operation."""
    found = []
    for path, item in document["paths"].items():
        for method in _METHODS:
            if method in item:
                role = item[method].get(ROLE_KEY)
                assert role in ("none", VIEWER, OPERATOR), f"{method} {path} declares no role"
                found.append((method, re.sub(r"\{[^}]+\}", "1", path), role))
    return found


async def _call(api: httpx.AsyncClient, method: str, path: str,
                headers: dict[str, str] | None = None) -> httpx.Response:
    body = {"reason": "walking the routes"} if method != "get" else None
    return await api.request(method.upper(), path, json=body, headers=headers)


async def test_every_route_refuses_anonymous_callers_and_viewers_where_it_must(
        api: httpx.AsyncClient) -> None:
    document = (await api.get("/api/v1/openapi.json")).json()
    routes = _routes(document)
    assert len(routes) >= 12  # the document lists the API, not an empty shell
    for method, path, role in routes:
        anonymous = await _call(api, method, path)
        viewer = await _call(api, method, path, AS_VIEWER)
        where = f"{method.upper()} {path}"
        if role == "none":
            assert anonymous.status_code not in (401, 403), where
            continue
        assert anonymous.status_code == 401, where
        assert anonymous.headers["www-authenticate"] == "Bearer", where
        assert anonymous.json()["error"]["code"] == "unauthenticated", where
        if role == OPERATOR:
            assert viewer.status_code == 403, where
            assert "operator role" in viewer.json()["error"]["message"], where
        else:
            assert viewer.status_code not in (401, 403), where
        operator = await _call(api, method, path, AS_OPERATOR)
        assert operator.status_code not in (401, 403), where


async def test_a_wrong_or_malformed_token_is_refused(api: httpx.AsyncClient) -> None:
    for header in ("Bearer sf_not-a-token", "Bearer", "Basic dXNlcjpwYXNz", "sf_x"):
        response = await api.get("/api/v1/tasks", headers={"Authorization": header})
        assert response.status_code == 401, header


async def test_the_health_check_is_anonymous(api: httpx.AsyncClient) -> None:
    response = await api.get("/api/v1/health")
    assert response.status_code == 200
    assert response.json() == {"status": "ok", "store": "ok"}
