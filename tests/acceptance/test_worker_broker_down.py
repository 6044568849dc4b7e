"""A worker outwaits its broker, and stops on SIGTERM whatever its broker does (R2).

Real `sasflow worker` processes against real brokers: a private RabbitMQ or
Redis that is not running yet when the worker starts (it must wait, logging a
few lines, and then serve), and the machine's RabbitMQ behind a small TCP
proxy that black-holes the worker's connections (the bytes stop, the sockets
stay open: no error ever reaches the client), after which a SIGTERM must still
stop the worker, handing its tasks back.
"""

from __future__ import annotations

import contextlib
import signal
import sqlite3
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.cli import Cli
from support.faultproxy import FaultProxy
from support.servers import PrivateRabbit, PrivateRedis
from support.services import require

# the agent's name is the test run's own: its queue on the machine's RabbitMQ too
AGENT = f"echo_{uuid.uuid4().hex[:12]}"
AGENT_QUEUE = f"sasflow.agent.{AGENT}"
APP = f"""
from sasflow import App, Step

app = App()

@app.agent("{AGENT}")
async def echo(req):
    return {{"echoed": req.input}}

app.workflow("echo", steps=[Step("echo", agent="{AGENT}", timeout=120.0)])
"""
HANG_GUARD = 120.0  # seconds: a private RabbitMQ boots in ~10 s on a loaded machine
STOP_HANG_GUARD = 60.0  # seconds for a SIGTERM to stop a worker
# The worker's log while its broker is down and then comes back: the start-up
# line, one "unreachable" when it finds the broker down and one "reachable again"
# when it is back, and a reminder every 30 s. Not one per attempt.
MAX_LOG_LINES = 12


@pytest.fixture
def app_cli(cli: Cli) -> Cli:
    (cli.home / "echoapp.py").write_text(APP)
    return cli


@pytest.fixture(params=["rabbitmq", "redis"])
def down_broker(request: pytest.FixtureRequest, tmp_path: Path
                ) -> Iterator[PrivateRabbit | PrivateRedis]:
    """A private broker on a port of its own, not started: the test starts it."""
    require(request.param)
    server = (PrivateRabbit(tmp_path / "rabbitmq") if request.param == "rabbitmq"
              else PrivateRedis(tmp_path / "redis"))
    try:
        yield server
    finally:
        server.close()


def _wait(what: str, done: object, worker: subprocess.Popen[bytes] | None = None,
          log: Path | None = None) -> None:
    assert callable(done)
    deadline = time.monotonic() + HANG_GUARD
    while not done():
        if worker is not None and worker.poll() is not None:
            pytest.fail(f"the worker exited ({worker.returncode}) while waiting for {what}:"
                        f" {log.read_text() if log else ''}")
        if time.monotonic() > deadline:
            pytest.fail(f"no {what} within {HANG_GUARD:.0f}s: {log.read_text() if log else ''}")
        time.sleep(0.1)


def test_a_worker_started_while_its_broker_is_down_waits_then_serves(
        app_cli: Cli, down_broker: PrivateRabbit | PrivateRedis) -> None:
    """The worker neither exits nor logs per attempt while the broker is down; once the
    broker is up it runs the tasks submitted meanwhile (submitting needs only the
    store), and the broker health check fails until then."""
    url = down_broker.url
    submitted = [app_cli("submit", "echoapp:app", "echo", "--task-id", f"t{i}",
                         "--input", str(i)) for i in range(3)]
    assert all(s.status == 0 for s in submitted), [s.err for s in submitted]
    # a heartbeat lease far shorter than the outage: the worker keeps beating while it
    # waits, so once the broker is back nothing it claims looks orphaned
    worker = app_cli.worker("echoapp:app", "--transport", url, "--instance-id", "waits",
                            "--heartbeat", "0.1", "--heartbeat-lease", "0.5")
    worker.wait_for_log("transport is unreachable")  # it knows the broker is down, and waits
    _wait("beats renewed past three leases while the broker is down",
          lambda: _beating_for(app_cli, "waits") > 1.5, worker.popen, worker.log)
    assert worker.popen.poll() is None

    health = app_cli("healthcheck", "--transport", url, "--timeout", "2")
    assert health.status == 1, health
    assert health.one_error_line()

    down_broker.start()
    for i in range(3):
        task = app_cli.wait_for(f"t{i}", "processed", worker)
        assert task["steps"][0]["result"] == {"echoed": i}
        assert (task["failure_count"], task["epoch"]) == (0, 1), task  # never released
    assert app_cli("healthcheck", "--transport", url).status == 0
    worker.wait_for_log("transport is reachable again")
    assert worker.stop() == 0
    lines = worker.text().splitlines()
    assert len(lines) <= MAX_LOG_LINES, worker.text()
    assert "Traceback" not in worker.text()


def break_link(proxy: FaultProxy, fault: str) -> None:
    """`silence` the link (no byte carried any more, every socket kept open: a
    partition, as the client sees it) or `cut` it (every connection reset). Either
    way, a connection opened afterwards is accepted and never answered, as a
    partitioned or hung broker would leave it."""
    if fault == "cut":
        proxy.set_mode("reset")
    proxy.set_mode("black-hole")


@pytest.mark.parametrize("fault", ["silence", "cut"])
def test_a_worker_whose_broker_is_lost_stops_on_sigterm_and_hands_its_tasks_back(
        app_cli: Cli, rabbitmq_server: str, fault: str) -> None:
    """One task waits for its reply and one for its request to be sent when the link to
    the broker goes silent or is cut, and the client is reconnecting to a broker that
    does not answer; SIGTERM then stops the worker (exit 0) and both tasks are pending
    and unlocked again, ready for another worker. (The client's reconnect loop used
    to swallow the cancellation that ends the process: it never exited.)"""
    proxy = FaultProxy(5672)
    try:
        # a scheduler alone: nobody answers, so its task is held, waiting for the reply;
        # heartbeats every 2 s, so the client notices a silent link within seconds
        url = f"amqp://guest:guest@127.0.0.1:{proxy.port}/?queue_expires=60&heartbeat=2"
        worker = app_cli.worker("echoapp:app", "--roles", "scheduler", "--transport", url)
        app_cli("submit", "echoapp:app", "echo", "--task-id", "waiting-for-reply")
        instance = _locked_by(app_cli, "waiting-for-reply", worker.popen, worker.log)
        # its request went through the proxy (the queue holds it): the link carried
        # everything up to now
        _wait("request in the agent's queue", lambda: _queued(AGENT_QUEUE) >= 1,
              worker.popen, worker.log)
        break_link(proxy, fault)
        _wait("reconnection", lambda: "reconnecting" in worker.text().lower(),
              worker.popen, worker.log)
        # claimed while the client reconnects: its request waits to be sent (for up to
        # 15 s, long enough for the signal to find it waiting)
        app_cli("submit", "echoapp:app", "echo", "--task-id", "waiting-to-send")
        assert _locked_by(app_cli, "waiting-to-send", worker.popen,
                          worker.log) == instance

        worker.popen.send_signal(signal.SIGTERM)
        try:
            status = worker.popen.wait(timeout=STOP_HANG_GUARD)
        except subprocess.TimeoutExpired:
            worker.popen.kill()
            pytest.fail(f"the worker ignored SIGTERM: {worker.text()}")
        assert status == 0, worker.text()
        for task_id in ("waiting-for-reply", "waiting-to-send"):
            task = app_cli.task(task_id)
            assert (task["state"], task["locked_by"]) == ("pending", None), task
    finally:
        proxy.close()
        _delete(AGENT_QUEUE)


def _beating_for(cli: Cli, instance_id: str) -> float:
    """How long the instance's beats span so far (its last beat since its first)."""
    with contextlib.closing(sqlite3.connect(cli.db)) as conn:
        row = conn.execute("SELECT beat_at - started_at FROM instances WHERE instance_id = ?",
                           (instance_id,)).fetchone()
    return float(row[0]) if row is not None else 0.0


def _locked_by(cli: Cli, task_id: str, worker: subprocess.Popen[bytes], log: Path) -> str:
    """The instance that claimed the task, once one has."""
    _wait(f"claim of {task_id}", lambda: cli.task(task_id)["locked_by"], worker, log)
    locked_by: str = cli.task(task_id)["locked_by"]
    return locked_by


def _queued(queue: str) -> int:
    """Messages ready in one of the machine's RabbitMQ queues (0 if it does not exist)."""
    done = subprocess.run(["rabbitmqctl", "list_queues", "-q", "--no-table-headers",
                           "name", "messages_ready"], capture_output=True, text=True,
                          timeout=60, check=True)
    counts = dict(line.split("\t") for line in done.stdout.splitlines() if "\t" in line)
    return int(counts.get(queue, "0"))


def _delete(queue: str) -> None:
    subprocess.run(["rabbitmqctl", "delete_queue", queue], capture_output=True, timeout=60,
                   check=False)
