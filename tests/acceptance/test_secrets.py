"""No password or token is printed or logged, whatever form the URL gives it in (R5).

Every command of the command line, and a worker, run as real processes against
URLs that carry one unique secret, in the userinfo (``user:SECRET@``) and as a
query parameter (``?password=SECRET``), for PostgreSQL, Redis and RabbitMQ:
reachable servers (a private Redis that requires the password), unreachable
ports (every error path), URLs malformed around the secret, and a broker
connection cut under a running worker (the client library's reconnect
warnings). Their stdout and stderr, and the worker's whole log, must not hold
the secret. The errors the Python API raises are checked the same way.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psycopg
import pytest
import redis

from sasflow import App, SasflowError
from sasflow.store import open_store
from sasflow.transport import open_transport
from support.cli import COMMAND, WAIT
from support.faultproxy import FaultProxy
from support.ports import free_port
from support.process import Process
from support.servers import PrivateRedis

SECRET = f"Zq{uuid.uuid4().hex[:20]}"  # unique: found anywhere, it leaked
LOCAL_PG = "postgresql://postgres{userinfo}@127.0.0.1:{port}/test"

APP = """
from sasflow import App, Step

app = App()

@app.agent("echo")
def echo(req):
    return {"echoed": req.input}

app.workflow("echo", steps=[Step("echo", agent="echo", timeout=60.0)])
"""


class Outputs:
    """Runs commands in one folder and keeps everything they wrote, to search it."""

    def __init__(self, home: Path) -> None:
        self.home = home
        (home / "secretapp.py").write_text(APP)
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("SASFLOW_")}
        self.seen: list[tuple[str, str]] = []
        self.logs: dict[int, Path] = {}

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([*COMMAND, *args], cwd=self.home, env=self.env,
                              capture_output=True, text=True, timeout=120)
        self.seen.append((" ".join(args), done.stdout + done.stderr))
        return done

    def worker(self, *args: str) -> Process:
        started = Process.spawn(
            f"worker-{len(self.logs)}",
            [*COMMAND, "worker", "secretapp:app", "--supervisor-interval", "0.1", *args],
            self.home / f"worker-{len(self.logs)}.log", env=self.env, cwd=self.home)
        self.logs[started.pid] = started.log
        return started

    def stop(self, worker: Process, what: str) -> None:
        worker.stop(timeout=WAIT)
        self.seen.append((what, self.worker_log(worker)))

    def worker_log(self, worker: Process) -> str:
        return worker.text()

    def wait_for_log(self, worker: Process, *fragments: str) -> str:
        """Until the worker's log holds one of `fragments`, or the worker has exited."""
        return worker.wait_for_line(*fragments, timeout=WAIT, exited_ok=True)

    def assert_no_secret(self) -> None:
        assert self.seen
        leaks = [what for what, text in self.seen if SECRET in text]
        assert not leaks, f"the secret was shown by: {leaks}"


@pytest.fixture
def outputs(tmp_path: Path) -> Outputs:
    return Outputs(tmp_path)


@pytest.fixture
def pg_schema(postgres_server: str) -> Iterator[str]:
    """A fresh schema in the local server's `test` database (trust: any password goes)."""
    name = f"secrets_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgres_server, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {name}")
    try:
        yield name
    finally:
        with psycopg.connect(postgres_server, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {name} CASCADE")


@pytest.fixture
def guarded_redis(tmp_path: Path) -> Iterator[int]:
    """A private Redis that requires SECRET as its password; yields its port."""
    server = PrivateRedis(tmp_path / "redis", persistent=False).start()
    try:
        redis.Redis(port=server.port).config_set("requirepass", SECRET)
        yield server.port
    finally:
        server.close()


def pg_urls(port: int, schema: str = "public") -> list[str]:
    options = f"options=-csearch_path%3D{schema}"
    return [LOCAL_PG.format(userinfo=f":{SECRET}", port=port) + f"?{options}",
            LOCAL_PG.format(userinfo="", port=port) + f"?password={SECRET}&{options}"]


def run_every_command(outputs: Outputs, store: str, transport: str) -> None:
    """Every command of the command line against `store` and `transport`, side by side
    (against an unreachable server each waits out its connect budget)."""
    app = ("--app", "secretapp:app")
    commands = [
        ("db", "upgrade", "--store", store),
        ("healthcheck", "--store", store, "--transport", transport, "--timeout", "3"),
        ("submit", "secretapp:app", "echo", "--task-id", "t-secret", "--store", store),
        ("tasks", "list", "--store", store),
        ("tasks", "show", "t-secret", "--history", "--store", store),
        ("alerts", "list", "--store", store),
        ("tasks", "retry", "t-secret", *app, "--store", store),
        ("tasks", "cancel", "t-secret", *app, "--store", store),
    ]
    with ThreadPoolExecutor(max_workers=len(commands)) as pool:
        list(pool.map(lambda args: outputs.run(*args), commands))


def test_no_command_shows_a_secret_of_reachable_postgres_and_redis(
        outputs: Outputs, pg_schema: str, guarded_redis: int) -> None:
    """Reachable servers, both forms of each secret: the commands work and show none."""
    redis_urls = [f"redis://:{SECRET}@127.0.0.1:{guarded_redis}/0",
                  f"redis://127.0.0.1:{guarded_redis}/0?password={SECRET}"]
    for n, (store, transport) in enumerate(zip(pg_urls(5432, pg_schema), redis_urls,
                                               strict=True)):
        assert outputs.run("db", "upgrade", "--store", store).returncode == 0
        assert outputs.run("healthcheck", "--store", store,
                           "--transport", transport).returncode == 0
        task_id = f"t-{n}"
        assert outputs.run("submit", "secretapp:app", "echo", "--task-id", task_id,
                           "--input", '"hi"', "--store", store).returncode == 0
        worker = outputs.worker("--store", store, "--transport", transport,
                                "--log-level", "debug")
        deadline = time.monotonic() + WAIT
        while json.loads(outputs.run("tasks", "show", task_id, "--json", "--store", store)
                         .stdout)["state"] != "processed":
            assert worker.alive, outputs.worker_log(worker)
            assert time.monotonic() < deadline, outputs.worker_log(worker)
            time.sleep(0.1)
        outputs.stop(worker, f"worker on {n}")
        assert "starting" in outputs.worker_log(worker)
        run_every_command(outputs, store, transport)
    outputs.assert_no_secret()


def test_no_error_shows_a_secret_of_an_unreachable_or_refusing_server(
        outputs: Outputs, tmp_path: Path, rabbitmq_server: str) -> None:
    """Nothing listens (PostgreSQL, Redis, RabbitMQ), RabbitMQ refuses the password, or
    the URL is malformed around the secret: every error line and log is clean."""
    down = free_port()
    sqlite = f"sqlite:///{tmp_path / 'tasks.db'}"
    cases = [
        *[(store, "memory") for store in pg_urls(down)],
        (sqlite, f"redis://:{SECRET}@127.0.0.1:{down}/0"),
        (sqlite, f"redis://127.0.0.1:{down}/0?password={SECRET}"),
        (sqlite, f"amqp://guest:{SECRET}@127.0.0.1:{down}/"),
        (sqlite, f"amqp://guest:guest@127.0.0.1:{down}/?password={SECRET}"),
        (sqlite, f"amqp://guest:{SECRET}@127.0.0.1:5672/"),  # refused: wrong password
        (f"postgresql://postgres:{SECRET} x@127.0.0.1:{down}/test", "memory"),  # malformed
        (f"postgres://u:{SECRET}@127.0.0.1:notaport/test", "memory"),
        (f"mysql://u:{SECRET}@127.0.0.1/test", f"kafka://u:{SECRET}@127.0.0.1/"),
        (sqlite, f"redis://127.0.0.1:{down}/0?password={SECRET}&maxlen=many"),
    ]
    for store, transport in cases:
        run_every_command(outputs, store, transport)
        worker = outputs.worker("--store", store, "--transport", transport)
        outputs.wait_for_log(worker, "rror", "ailed", "efused", "annot")
        outputs.stop(worker, f"worker on {store} {transport}")
    outputs.run("demo", "--orders", "1", "--workers", "1", "--store", pg_urls(down)[1])
    outputs.assert_no_secret()


def test_the_broker_clients_reconnect_warnings_show_no_secret(
        outputs: Outputs, tmp_path: Path, rabbitmq_server: str) -> None:
    """A running worker's RabbitMQ connections are cut: aio-pika logs its reconnect
    warnings with the URL, whose ?password= stays masked."""
    proxy = FaultProxy(5672)
    store = f"sqlite:///{tmp_path / 'tasks.db'}"
    try:
        transport = f"amqp://guest:guest@127.0.0.1:{proxy.port}/?password={SECRET}"
        assert outputs.run("submit", "secretapp:app", "echo", "--task-id", "t-up",
                           "--store", store).returncode == 0
        worker = outputs.worker("--store", store, "--transport", transport)
        # every connection is up once a task has gone through them all
        deadline = time.monotonic() + WAIT
        while json.loads(outputs.run("tasks", "show", "t-up", "--json", "--store", store)
                         .stdout)["state"] != "processed":
            assert worker.alive and time.monotonic() < deadline, (
                outputs.worker_log(worker))
            time.sleep(0.1)
        proxy.set_mode("reset")  # every connection cut; the next ones go through
        proxy.set_mode("pass")
        text = outputs.wait_for_log(worker, "Reconnect", "reconnect")
        assert "password=***" in text, text  # the warning was logged, masked
        # killed, not stopped: how a worker stops while its broker is away is not the
        # point here (it can outwait a SIGTERM), what it logged is
        worker.kill()
        outputs.stop(worker, "worker whose broker connection was cut")
    finally:
        proxy.close()
    outputs.assert_no_secret()


@pytest.mark.parametrize("url", [
    f"postgresql://postgres:{SECRET} x@127.0.0.1:1/test",
    f"postgresql://u@h/db?password={SECRET}&bogus=1",
    f"mysql://u:{SECRET}@h/db",
    f"sqlite://u:{SECRET}@h/db",
], ids=lambda url: url.replace(SECRET, "SECRET"))  # the same ids in every run
def test_store_errors_from_the_python_api_show_no_secret(url: str) -> None:
    """open_store / App refuse a bad store URL without showing its secret."""
    with pytest.raises(SasflowError) as refused:
        open_store(url)
    assert SECRET not in str(refused.value)
    with pytest.raises(SasflowError) as refused_by_app:
        App(store=url).get("t")
    assert SECRET not in str(refused_by_app.value)


@pytest.mark.parametrize("url", [
    f"kafka://u:{SECRET}@h/",
    f"redis://:{SECRET}@h/0?maxlen=many",
    f"redis://h/0?password={SECRET}&visibility_timeout=soon",
], ids=lambda url: url.replace(SECRET, "SECRET"))
def test_transport_errors_from_the_python_api_show_no_secret(url: str) -> None:
    """open_transport refuses a bad transport URL without showing its secret."""
    with pytest.raises(SasflowError) as refused:
        open_transport(url)
    assert SECRET not in str(refused.value)
    assert "***" in str(refused.value)



async def test_an_applications_own_log_shows_no_secret_of_a_reconnecting_broker(
        caplog: pytest.LogCaptureFixture, rabbitmq_server: str) -> None:
    """Used as a library, with the application's own logging: aio-pika's reconnect
    warnings reach the application's handlers with ?password= masked."""
    proxy = FaultProxy(5672)
    transport = open_transport(f"amqp://guest:guest@127.0.0.1:{proxy.port}/?password={SECRET}")
    try:
        with caplog.at_level(logging.INFO):
            await transport.ping()
            proxy.set_mode("reset")  # every connection cut; the next ones go through
            proxy.set_mode("pass")
            async with asyncio.timeout(WAIT):
                while "econnect" not in caplog.text:
                    await asyncio.sleep(0.02)
        assert "password=***" in caplog.text
        assert SECRET not in caplog.text
    finally:
        proxy.close()
        await transport.close()
