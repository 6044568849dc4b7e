"""Liveness under faults, with real `sasflow worker` processes (R1, R2, issue part 4).

- one clock: a worker whose host clock is 5 minutes ahead, or behind, runs tasks
  on PostgreSQL as if it were right, and stops a step at its real deadline;
- a worker started while PostgreSQL is down waits for it as long as it takes,
  with a few log lines, and works once it is back;
- a worker's heartbeat: its health check passes while it runs, fails once it is
  frozen (SIGSTOP) past its lease, and passes again when it is thawed;
- a worker SIGKILLed in a step whose timeout is 300 s: its task is released by the
  heartbeat lease, not the step's complete-by, and finished by the survivor.

Every wait is for a positive signal, with a generous hang guard.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest
from livenessapp import LONG, NAMESPACE_ENV, QUICK, RETRY_BACKOFF, SLOW_ENV, STUCK, build_app

from sasflow import App
from sasflow.store import open_store
from sasflow.store.records import HistoryEntry, Instance
from support import APPS, waiting
from support.dist import postgres_schema
from support.faultproxy import FaultProxy
from support.ports import free_port
from support.process import HANG_GUARD, Process, kill_all
from support.servers import PrivatePostgres

pytestmark = pytest.mark.chaos

T = TypeVar("T")

APP = f"{APPS / 'livenessapp.py'}:app"
SASFLOW = Path(sys.executable).parent / "sasflow"
SKEW_HOOK = APPS / "skewed_clock"
# short enough for a quick test, long enough that a loaded machine's stalls do not
# make a live worker look gone
HEARTBEAT = 0.5
LEASE = 3.0
INTERVAL = 0.25
SUPERVISOR_LEASE = max(3 * INTERVAL, 1.0)  # Supervisor.lease_ttl


class World:
    """The worker processes of one test; all killed at the end, whatever happened."""

    def __init__(self, root: Path, store: str) -> None:
        self.root, self.store = root, store
        self.procs: list[Process] = []

    def spawn(self, name: str, *, env: dict[str, str] | None = None,
              short_lease: bool = True, transport: str | None = None) -> Process:
        """A worker with every role; with `short_lease`, beating every HEARTBEAT s
        with a LEASE s lease, else with the defaults."""
        lease = ["--heartbeat", str(HEARTBEAT), "--heartbeat-lease", str(LEASE)]
        over = ["--transport", transport] if transport else []
        proc = Process.spawn(
            name, [str(SASFLOW), "worker", APP, "--instance-id", name, "--store", self.store,
                   "--supervisor-interval", str(INTERVAL), *(lease if short_lease else []),
                   *over],
            self.root / f"{name}.log", env=clean_env(**(env or {})))
        self.procs.append(proc)
        return proc

    def close(self) -> None:
        kill_all(self.procs)


def clean_env(**values: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SASFLOW_", "PG"))}
    env.update(values)
    return env


def wait_for(what: str, condition: Callable[[], T | None], procs: list[Process],
             timeout: float = HANG_GUARD) -> T:
    return waiting.wait_for(
        what, condition, timeout=timeout, poll=0.05,
        explain=lambda: "\n".join(f"--- {p.name}\n{p.text()[-4000:]}" for p in procs))


def failing(done: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str] | None:
    return done if done.returncode == 1 else None


def healthcheck(store: str, instance_id: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(SASFLOW), "healthcheck", "--store", store, "--instance-id",
                           instance_id, "--timeout", "10"], env=clean_env(),
                          capture_output=True, text=True, timeout=HANG_GUARD)


def terminal(app: App, task_ids: list[str]) -> bool:
    return all(app.get(t).state.value in ("processed", "error", "compensated")
               for t in task_ids)


async def _read(store_url: str, task_ids: list[str]
                ) -> tuple[dict[str, list[HistoryEntry]], list[Instance]]:
    store = open_store(store_url)
    try:
        return ({t: await store.history(t) for t in task_ids}, await store.instances())
    finally:
        await store.close()


def read(store_url: str, task_ids: list[str]
         ) -> tuple[dict[str, list[HistoryEntry]], dict[str, Instance]]:
    """Every task's history and every instance's row, from the store."""
    history, instances = asyncio.run(_read(store_url, task_ids))
    return history, {i.instance_id: i for i in instances}


@pytest.fixture
def sqlite_world(tmp_path: Path) -> Iterator[tuple[World, App]]:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    app = build_app(url)
    assert app._store is not None  # creates and migrates the file before any worker
    world = World(tmp_path, url)
    try:
        yield world, app
    finally:
        world.close()
        app.close()


# ---------------------------------------------------------------- one clock (R1)
@pytest.mark.parametrize("skew", [300.0, -300.0], ids=["5min-ahead", "5min-behind"])
def test_a_worker_whose_host_clock_is_off_runs_tasks_on_the_databases_clock(
        skew: float, tmp_path: Path) -> None:
    """A host clock 5 minutes off changes nothing on PostgreSQL: every task is processed
    (ahead, agents used to drop every request), and a step that never finishes is
    stopped at its real complete-by (behind, it used to run 5 minutes more)."""
    with postgres_schema() as url:
        app = build_app(url)
        world = World(tmp_path, url)
        try:
            path = os.pathsep.join(p for p in (str(SKEW_HOOK), os.environ.get("PYTHONPATH"))
                                   if p)
            worker = world.spawn("skewed", short_lease=False,
                                 env={"PYTHONPATH": path, "SASFLOW_TEST_CLOCK_SKEW": str(skew)})
            quick = [app.submit(QUICK, {"n": n}) for n in range(5)]
            stuck = app.submit(STUCK)
            wait_for("every task to end", lambda: terminal(app, [*quick, stuck]), [worker])
            assert [app.get(t).state.value for t in quick] == ["processed"] * 5
            for task_id in quick:  # the agent saw the whole budget, not 5 minutes more or less
                remaining = app.get(task_id).steps[0].result["remaining"]
                assert 0 < remaining <= 60.0, remaining
            wait_for("the stuck step's agent to fall silent at its complete-by",
                     lambda: "complete-by passed, falling silent" in worker.text(), [worker])
            task = app.get(stuck)
            assert (task.state.value, task.steps[0].error) == ("error", "expired 1 times")
        finally:
            world.close()
            app.close()


# ---------------------------------------------------------------- reconnect (R2)
DOWN_AT_START = 32.0  # seconds: past the 30 s after which the pool used to be closed for good


def test_a_worker_started_while_postgres_is_down_works_once_it_is_back(
        tmp_path: Path) -> None:
    """The database unreachable for more than 30 s at start-up: the worker waits, logs a
    few lines (no traceback storm), and processes tasks once the database is back; its
    health check then passes."""
    server = PrivatePostgres()
    try:
        server.start()
        url = server.create_database("liveness")
        upgrade = subprocess.run([str(SASFLOW), "db", "upgrade", "--store", url],
                                 env=clean_env(), capture_output=True, text=True,
                                 timeout=HANG_GUARD)
        assert upgrade.returncode == 0, upgrade.stderr
        server.stop()
        world = World(tmp_path, url)
        try:
            started = time.monotonic()
            worker = world.spawn("patient", short_lease=False)
            wait_for("the worker to start", lambda: "starting" in worker.text(), [worker])
            time.sleep(max(0.0, started + DOWN_AT_START - time.monotonic()))  # the fault
            server.start()
            app = build_app(url)
            try:
                tasks = [app.submit(QUICK, {"n": n}) for n in range(5)]
                wait_for("the tasks to end", lambda: terminal(app, tasks), [worker])
                assert [app.get(t).state.value for t in tasks] == ["processed"] * 5
            finally:
                app.close()
            check = healthcheck(url, "patient")
            assert (check.returncode, check.stdout.strip()) == (0, "ok"), check.stderr
            log = worker.text()
            assert "Traceback" not in log, log
            assert len(log.splitlines()) <= 10, log  # 5: start, down, still down, back, lead
            assert "is unreachable" in log and "reachable again" in log, log
        finally:
            world.close()
    finally:
        server.close()


def test_a_worker_started_while_rabbitmq_is_down_works_once_it_is_back(
        sqlite_world: tuple[World, App], rabbitmq_server: str) -> None:
    """The broker refuses connections at start-up: the worker waits for it (its client
    alone used to give up, and the worker exited), then runs tasks once it answers."""
    world, _ = sqlite_world
    namespace = f"-{uuid.uuid4().hex[:8]}"
    # a door to the machine's RabbitMQ on a port of its own, closed until it listens:
    # until then a connection to it is refused, as to a broker that is down
    broker = FaultProxy(5672, port=free_port(), listening=False)
    try:
        worker = world.spawn("waiting", env={NAMESPACE_ENV: namespace}, short_lease=False,
                             transport=f"amqp://guest:guest@127.0.0.1:{broker.port}/"
                                       "?queue_expires=60")
        # its own line, whatever words the event loop gives the refusal
        wait_for("the worker to find the broker down",
                 lambda: "transport is unreachable" in worker.text(), [worker])
        broker.listen()
        app = build_app(world.store, namespace)
        try:
            tasks = [app.submit(QUICK, {"n": n}) for n in range(3)]
            wait_for("the tasks to end", lambda: terminal(app, tasks), [worker])
            assert [app.get(t).state.value for t in tasks] == ["processed"] * 3
        finally:
            app.close()
    finally:
        world.close()
        broker.close()


# ---------------------------------------------------------------- heartbeats (R2)
def test_healthcheck_fails_for_a_frozen_worker_and_passes_once_it_is_thawed(
        sqlite_world: tuple[World, App]) -> None:
    """--instance-id: ok while the worker beats; one clear line once SIGSTOP kept it
    silent past its lease; ok again after SIGCONT; then 'stopped' after SIGTERM."""
    world, _ = sqlite_world
    worker = world.spawn("probed")
    wait_for("the healthcheck to pass", lambda: healthcheck(world.store, "probed").returncode
             == 0, [worker])
    worker.freeze()
    try:
        failed = wait_for("the healthcheck to fail for the frozen worker",
                          lambda: failing(healthcheck(world.store, "probed")), [worker])
    finally:
        worker.thaw()
    assert failed.stderr.count("\n") == 1 and "no heartbeat for" in failed.stderr, failed.stderr
    assert f"its lease is {LEASE:g}s" in failed.stderr
    wait_for("the healthcheck to pass again", lambda: healthcheck(
        world.store, "probed").returncode == 0, [worker])

    missing = healthcheck(world.store, "nobody")
    assert missing.returncode == 1 and "has no heartbeat" in missing.stderr

    worker.popen.send_signal(signal.SIGTERM)
    assert worker.popen.wait(timeout=HANG_GUARD) == 0
    stopped = healthcheck(world.store, "probed")
    assert stopped.returncode == 1 and "stopped" in stopped.stderr, stopped.stderr


def test_under_systemd_a_worker_is_ready_after_its_first_beat_then_pings_the_watchdog(
        sqlite_world: tuple[World, App], tmp_path: Path) -> None:
    """Type=notify units: READY=1 once the first heartbeat is recorded, then WATCHDOG=1
    with each later one, on the socket systemd names in $NOTIFY_SOCKET."""
    world, _ = sqlite_world
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as listener:
        listener.bind(str(tmp_path / "notify.sock"))
        listener.settimeout(HANG_GUARD)
        worker = world.spawn("notified", env={"NOTIFY_SOCKET": str(tmp_path / "notify.sock")})
        said = [listener.recv(256).decode() for _ in range(3)]
    assert said == ["READY=1", "WATCHDOG=1", "WATCHDOG=1"], worker.text()
    assert healthcheck(world.store, "notified").returncode == 0


# ---------------------------------------------------------------- recovery by lease
def test_a_sigkilled_workers_300s_step_is_released_by_its_heartbeat_lease(
        sqlite_world: tuple[World, App]) -> None:
    """The victim holds steps whose timeout is 300 s and is SIGKILLed: the survivor's
    supervisor releases them once the victim's heartbeat lease lapses (the history says
    so), well before their complete-by, and the survivor finishes them under a new
    epoch. Bounds on the store's clock: release within lease + supervisor lease +
    interval of the victim's last beat; done within the retry backoff + the step's run
    time of the release (+ slack for a loaded machine)."""
    world, app = sqlite_world
    victim = world.spawn("victim", env={SLOW_ENV: "3600"})
    tasks = [app.submit(LONG, {"n": n}) for n in range(5)]
    wait_for("the victim to hold every task",
             lambda: all(app.get(t).locked_by == "victim" for t in tasks), [victim])
    survivor = world.spawn("survivor", env={SLOW_ENV: "0.5"})
    wait_for("the survivor to beat",
             lambda: healthcheck(world.store, "survivor").returncode == 0, [survivor])
    victim.kill()
    wait_for("every task to end", lambda: terminal(app, tasks), [survivor])

    history, instances = read(world.store, tasks)
    last_beat = instances["victim"].beat_at
    slack = 10.0  # a loaded 2-core machine: process scheduling, SQLite lock waits
    for task_id in tasks:
        task = app.get(task_id)
        assert task.state.value == "processed" and task.failure_count >= 1
        rows = history[task_id]
        [release] = [h for h in rows if h.step is None
                     and "holder victim lost its heartbeat lease" in (h.why or "")]
        assert release.actor == "survivor"
        assert not [h for h in rows if "expired" in (h.why or "")]
        [done] = [h for h in rows if h.step is None and h.to_state == "processed"]
        assert done.actor == "survivor" and done.epoch > release.epoch
        assert release.at - last_beat <= LEASE + SUPERVISOR_LEASE + INTERVAL + slack
        assert done.at - release.at <= RETRY_BACKOFF + 0.5 + slack
