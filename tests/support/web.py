"""The HTTP API tests' users (a viewer and an operator, with their tokens), and the
API served on a real loopback port."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import uvicorn
from fastapi import FastAPI

from sasflow.web.auth import Users, new_token
from support.ports import free_port
from support.waiting import wait_for

__all__ = ["AS_OPERATOR", "AS_VIEWER", "OPERATOR_TOKEN", "USERS", "VIEWER_TOKEN", "serving"]

VIEWER_TOKEN, _VIEWER_LINE = new_token("vera", "viewer")
OPERATOR_TOKEN, _OPERATOR_LINE = new_token("otto", "operator")
USERS = Users.parse(f"{_VIEWER_LINE}\n{_OPERATOR_LINE}", "test users")
AS_VIEWER = {"Authorization": f"Bearer {VIEWER_TOKEN}"}
AS_OPERATOR = {"Authorization": f"Bearer {OPERATOR_TOKEN}"}


@contextlib.contextmanager
def serving(app: FastAPI) -> Iterator[str]:
    """`app` served by uvicorn on a free loopback port, in a thread; its base URL."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None,
                                           access_log=False))
    thread = threading.Thread(target=server.run, name=f"http-{port}", daemon=True)
    thread.start()
    wait_for("the server to listen", lambda: server.started, timeout=60)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=60)
