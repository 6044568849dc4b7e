"""`sasflow worker` serves a process-isolated agent, with the app given either way."""

from __future__ import annotations

import pytest

from support import APPS
from support.cli import Cli


@pytest.mark.parametrize("app", ["isolatedapp:app", f"{APPS / 'isolatedapp.py'}:app"])
def test_a_worker_runs_a_process_isolated_agent_outside_its_own_process(
        cli: Cli, app: str) -> None:
    """The worker process imports the app module again, by its name or its path,
    finds the agent function there, and the step's result comes from that process."""
    submitted = cli("submit", app, "label", "--task-id", "label-1", cwd=APPS)
    assert submitted.status == 0, submitted.err
    worker = cli.worker(app, cwd=APPS)
    task = cli.wait_for("label-1", "processed", worker)
    assert worker.stop() == 0
    result = task["steps"][0]["result"]
    assert result["pid"] != worker.pid
    assert result["parent"] != worker.pid  # the forkserver's child, not a fork of it
    assert "Traceback" not in worker.text()
