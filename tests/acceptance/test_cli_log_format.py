"""`--log-format json` (U5): a worker's log is one JSON object a line, each naming the
task, step, epoch and instance it is about; a failed command's one error line is JSON."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from support.cli import SHOP, Cli

# A workflow of one step whose agent, a plain function (run in a thread), logs each
# call and fails its first: the task is released and claimed again under epoch 2.
APP = '''
import logging
import os

from sasflow import App, Step

app = App()
log = logging.getLogger("payments")


@app.agent("payments", attempts=1)
def charge(req):
    log.info("charging %s", req.task_id)
    marker = req.input["marker"]
    if not os.path.exists(marker):
        open(marker, "w").close()
        raise RuntimeError("the first charge fails")
    return {"charged": req.task_id}


app.workflow("pay", steps=[Step("charge", agent="payments", timeout=600.0)],
             max_failures=3, retry_backoff=0.01)
'''


def objects(stderr: str) -> list[dict[str, Any]]:
    """Every line of `stderr` as a JSON object with the base fields; fails on any other."""
    found = []
    for line in stderr.splitlines():
        entry = json.loads(line)
        assert isinstance(entry, dict), line
        assert {"ts", "level", "logger", "message"} <= entry.keys(), line
        assert datetime.fromisoformat(entry["ts"]).utcoffset() is not None, line
        found.append(entry)
    return found


def test_a_json_worker_log_names_the_task_step_epoch_and_instance(
        cli: Cli, tmp_path: Path) -> None:
    app = tmp_path / "payapp.py"
    app.write_text(APP)
    submitted = cli("submit", f"{app}:app", "pay", "--task-id", "pay-1",
                    "--input", json.dumps({"marker": str(tmp_path / "failed-once")}))
    assert submitted.status == 0, submitted.err
    worker = cli.worker(f"{app}:app", "--log-format", "json", "--instance-id", "w-json-1")
    task = cli.wait_for("pay-1", "processed", worker)
    assert worker.stop() == 0
    log = objects(worker.text())

    charges = [e for e in log if e["logger"] == "payments"]
    assert [e["message"] for e in charges] == ["charging pay-1"] * 2
    assert [(e["task_id"], e["step"], e["instance"]) for e in charges] == [
        ("pay-1", "charge", "w-json-1")] * 2
    # the first dispatch failed and was counted; the task was claimed again
    assert [e["epoch"] for e in charges] == [1, 2] and task["epoch"] == 2
    gave_up = [e for e in log if e["logger"] == "sasflow.agent" and "giving up" in e["message"]]
    assert [(e["task_id"], e["step"], e["epoch"]) for e in gave_up] == [("pay-1", "charge", 1)]
    assert {e["level"] for e in charges} == {"info"}
    lifecycle = [e for e in log if e["logger"] == "sasflow.cli"]
    assert "starting" in lifecycle[0]["message"] and "stopped" in lifecycle[-1]["message"]
    assert {e["instance"] for e in lifecycle} == {"w-json-1"}


def test_a_failed_command_prints_its_one_error_line_as_json(
        cli: Cli, submit: Callable[..., str]) -> None:
    """The same words as the text form's `sasflow: error:` line, from the option or its
    environment variable; the text form is left as it is."""
    submit("restock", task_id="r-1")
    text = cli("tasks", "show", "NOPE", "--store", cli.store)
    assert text.status == 1
    message = text.one_error_line().removeprefix("sasflow: error: ")
    for shown in (cli("--log-format", "json", "tasks", "show", "NOPE", "--store", cli.store),
                  cli("tasks", "show", "NOPE", env={"SASFLOW_LOG_FORMAT": "json"})):
        assert (shown.status, shown.out) == (1, "")
        [line] = objects(shown.err)
        assert (line["level"], line["message"]) == ("error", message)


def test_a_json_worker_that_cannot_start_logs_and_fails_in_json(cli: Cli) -> None:
    """The worker's own --log-format sets its error line's format too."""
    result = cli("worker", SHOP, "--log-format", "json", "--transport", "carrier-pigeon://loft")
    assert result.status == 1
    last = objects(result.err)[-1]
    assert (last["level"], last["message"]) == (
        "error", "unknown transport URL 'carrier-pigeon://loft':"
                 " expected memory, amqp://... or redis://...")
