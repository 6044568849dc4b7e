"""Fixtures of the command-line tests: a `Cli` per test, on its own store (support/cli.py)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from support.cli import SHOP, Cli


@pytest.fixture
def cli(tmp_path: Path) -> Iterator[Cli]:
    runner = Cli(tmp_path)
    try:
        yield runner
    finally:
        runner.close()


@pytest.fixture
def submit(cli: Cli) -> Callable[..., str]:
    """Submit to the shop with the command line; returns the printed task id."""

    def run(workflow: str = "order", payload: Any = None, task_id: str | None = None) -> str:
        args = ["submit", SHOP, workflow]
        if payload is not None:
            args += ["--input", json.dumps(payload)]
        if task_id is not None:
            args += ["--task-id", task_id]
        result = cli(*args)
        assert result.status == 0, result.err
        printed = result.out.strip()
        assert task_id is None or printed == task_id
        return printed

    return run
