"""Shared fixtures: a fresh SQLite store file per test, and no retry backoff."""

from __future__ import annotations

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
