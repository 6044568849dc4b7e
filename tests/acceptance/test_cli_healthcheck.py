"""`sasflow healthcheck` answers through its exit status, against the real servers."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


def sasflow(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sasflow.cli", *args], capture_output=True,
                          text=True, timeout=60)


@pytest.fixture
def store(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'tasks.db'}"
    assert sasflow("db", "upgrade", "--store", url).returncode == 0
    return url


@pytest.fixture(params=["memory", "redis", "rabbitmq"])
def transport(request: pytest.FixtureRequest) -> str:
    """A reachable transport's URL (the machine's broker, for redis and rabbitmq)."""
    if request.param == "memory":
        return "memory"
    url: str = request.getfixturevalue(f"{request.param}_server")
    return url


def test_healthy_store_and_transport_exit_0(store: str, transport: str) -> None:
    """Both answer: exit 0, `ok`."""
    done = sasflow("healthcheck", "--store", store, "--transport", transport)
    assert (done.returncode, done.stdout.strip(), done.stderr) == (0, "ok", "")


@pytest.mark.parametrize("transport, says", [
    pytest.param("redis://127.0.0.1:1/0", "cannot reach Redis", id="redis-down"),
    pytest.param("amqp://guest:guest@127.0.0.1:1/", "cannot connect to RabbitMQ",
                 id="rabbitmq-down"),
])
def test_an_unreachable_transport_exits_1_with_one_line(store: str, transport: str,
                                                        says: str) -> None:
    """Nothing listens on port 1: exit 1 and one line naming the transport."""
    done = sasflow("healthcheck", "--store", store, "--transport", transport, "--timeout", "5")
    assert done.returncode == 1
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert says in done.stderr


def test_a_missing_store_exits_1_and_creates_nothing(tmp_path: Path) -> None:
    """A probe never creates the store it checks."""
    done = sasflow("healthcheck", "--store", f"sqlite:///{tmp_path / 'none.db'}")
    assert done.returncode == 1
    assert "no SQLite store" in done.stderr
    assert not (tmp_path / "none.db").exists()
