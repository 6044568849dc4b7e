"""The HTTP API tests' users: a viewer and an operator, with their tokens."""

from __future__ import annotations

from sasflow.web.auth import Users, new_token

__all__ = ["AS_OPERATOR", "AS_VIEWER", "OPERATOR_TOKEN", "USERS", "VIEWER_TOKEN"]

VIEWER_TOKEN, _VIEWER_LINE = new_token("vera", "viewer")
OPERATOR_TOKEN, _OPERATOR_LINE = new_token("otto", "operator")
USERS = Users.parse(f"{_VIEWER_LINE}\n{_OPERATOR_LINE}", "test users")
AS_VIEWER = {"Authorization": f"Bearer {VIEWER_TOKEN}"}
AS_OPERATOR = {"Authorization": f"Bearer {OPERATOR_TOKEN}"}
