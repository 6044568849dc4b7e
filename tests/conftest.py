"""Shared fixtures: a fresh SQLite store file per test, no retry backoff, real servers."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def db_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'sasflow.db'}"


@pytest.fixture
def no_backoff(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("SASFLOW_TESTING_NO_BACKOFF", "1")
    yield


# Tests of the distributed backends use the real servers. On a laptop without one
# they skip; in CI (CI=true) a missing server is a failure, never a skip.
_SERVERS = {"postgres": 5432, "redis": 6379, "rabbitmq": 5672, "amqp": 5672}
_reachable: dict[int, bool] = {}


def _server_up(port: int) -> bool:
    if port not in _reachable:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1.0).close()
            _reachable[port] = True
        except OSError:
            _reachable[port] = False
    return _reachable[port]


@pytest.fixture(autouse=True)
def _needs_servers(request: pytest.FixtureRequest) -> None:
    node = request.node.nodeid.lower()
    for name, port in _SERVERS.items():
        if name in node and not _server_up(port):
            message = f"{name} is not reachable on 127.0.0.1:{port}"
            if os.environ.get("CI") == "true":
                pytest.fail(message + " (CI needs it: .ci/run starts it)")
            pytest.skip(message)
