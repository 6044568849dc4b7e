"""Shared fixtures: a fresh SQLite store file per test, no retry backoff, real servers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from support.services import POSTGRES, RABBITMQ, REDIS, require

# Tests that kill, freeze and partition processes and servers, and wait for what a
# replacement does in its own time: `make test` runs them after the rest, two files at
# a time (docs/testing.md).
_FAULTS = ("chaos", "scenario")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    tests = Path(__file__).parent
    for item in items:
        if item.path.relative_to(tests).parts[0] in _FAULTS:
            item.add_marker(pytest.mark.faults)


@pytest.fixture
def db_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'sasflow.db'}"


@pytest.fixture
def no_backoff(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("SASFLOW_TESTING_NO_BACKOFF", "1")
    yield


# The machine's servers, for the tests that use them (support/services.py says
# when such a test skips and when it fails).
@pytest.fixture
def postgres_server() -> str:
    require("postgres")
    return POSTGRES


@pytest.fixture
def redis_server() -> str:
    require("redis")
    return REDIS


@pytest.fixture
def rabbitmq_server() -> str:
    require("rabbitmq")
    return RABBITMQ
