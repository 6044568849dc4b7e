"""The machine's own servers, and the one rule for a test that needs one.

A test reaches a server only through a fixture that first calls `require`: on a
laptop without the server the test skips; in CI (CI=true) a missing server is
a failure, never a skip. Tests that need no server never depend on one of these
fixtures, so they run whatever is down.
"""

from __future__ import annotations

import os
import socket

import pytest

__all__ = ["POSTGRES", "RABBITMQ", "REDIS", "require", "require_root"]

POSTGRES = "postgresql://postgres@127.0.0.1:5432/test"
REDIS = "redis://127.0.0.1:6379/15"
RABBITMQ = "amqp://guest:guest@127.0.0.1:5672/"

_PORTS = {"postgres": 5432, "redis": 6379, "rabbitmq": 5672}
_reachable: dict[str, bool] = {}


def require(server: str) -> None:
    """Skip the calling test (fail it in CI) unless `server` answers on its port."""
    port = _PORTS[server]
    if server not in _reachable:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1.0).close()
            _reachable[server] = True
        except OSError:
            _reachable[server] = False
    if not _reachable[server]:
        message = f"{server} is not reachable on 127.0.0.1:{port}"
        if os.environ.get("CI") == "true":
            pytest.fail(message + " (CI needs it: .ci/run starts it)")
        pytest.skip(message)


def require_root(what: str) -> None:
    """Skip the calling test (fail it in CI, which runs as root) unless this process is
    root, for what only root may do (mounting a tmpfs, say)."""
    if os.geteuid() != 0:
        message = f"{what} needs root"
        if os.environ.get("CI") == "true":
            pytest.fail(message + " (CI runs as root)")
        pytest.skip(message)
