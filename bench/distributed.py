"""Throughput, latency and recovery on the PostgreSQL store, for one transport.

The workload is the one of bench/workload.py (wf3: 3 steps, no-op or 10 ms).
Every measurement runs in a child process of its own, on a database of its own
(``CREATE DATABASE bench_<pid>_<n>`` on the local server, dropped afterwards),
with queues of its own:

  memory  all roles in the bench process (`app.start()`, a background thread),
          in-process queues: the embedded deployment on PostgreSQL;
  amqp    RabbitMQ; the agents run in separate ``sasflow worker
          bench/agent_app.py:app --roles agent`` processes (--agent-procs, default
          1); scheduler and supervisor run in the bench process. Each measurement
          has its own agent name (so its own queue ``sasflow.agent.<name>``) and
          scheduler instance id (so its own reply queue); both are deleted at the
          end (and carry x-expires as a safety net);
  redis   Redis Streams, laid out as amqp; database 14 by default (never 15, which
          the tests use), FLUSHDB-ed before and after each measurement, with a
          key prefix of its own.

Phases (--phases, default tp,lat,crash):
  tp     N tasks, each --styles (sequential, concurrent, presubmitted: as in
         bench/throughput.py; clients, only here: up to 256 clients at once, each
         submitting one task and awaiting it before the next client starts, as
         the request handlers of a web app under load; run it by naming it in
         --styles) and --variants (noop, sleep10ms); tasks/s and
         completed steps/s (= 3 x tasks/s); 20-task warm-up (not for presubmitted).
         sequential, concurrent and clients: the client awaits each task through the
         API (as the DBOS and Celery peers do); presubmitted: the clock stops when the
         store holds all N terminal, polled every 20 ms on a connection of its own
         (as the procrastinate peer waits), so no client shares the roles' event
         loop, and every task is read back afterwards;
  lat    100 sequential single tasks, submit -> terminal state seen by the client,
         p50/p95 (5 warm-up samples dropped);
  crash  recovery after SIGKILL, no process restarted. memory: two worker
         processes (bench/workload.py, all roles) on the store, one killed, as
         bench/recovery.py does on SQLite. amqp/redis: two scheduler+supervisor
         processes and two agent processes (``sasflow worker --roles ...``); --kill
         host (default) SIGKILLs one of each (a machine lost), scheduler or agent
         only one of them. 200 tasks whose step 2 sleeps 2 s, kill ~1 s after
         submitting; same keys as recovery.py (recovery_s_from_kill,
         released_s_from_kill, target_bound_s = step timeout + supervisor interval +
         1 s, lost, duplicated).

Keys: tp_noop / tp_sleep10ms (sequential: the peers' protocol), tp_concurrent_*,
tp_presubmitted_*, latency_noop, crash. ``"backend"`` is ``pg`` for the memory
transport (the row ../shared/bench/peers/summarize.py shows) and ``pg+amqp`` /
``pg+redis`` for the others.

Environment: BENCH_PG_URL (an admin connection to the server, default
postgresql://postgres@127.0.0.1:5432/postgres), BENCH_AMQP_URL (default
amqp://guest:guest@127.0.0.1:5672/), BENCH_REDIS_URL (default
redis://127.0.0.1:6379/14). Loopback hosts only.

Usage: python bench/distributed.py --transport memory|amqp|redis [--n 5000]
           [--phases tp,lat,crash] [--styles sequential,concurrent,presubmitted]
           [--variants noop,sleep10ms] [--agent-procs 1] [--kill host|scheduler|agent]
Prints one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import os
import signal
import subprocess
import sys
import time
import uuid
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit

import common as C
import psycopg
from recovery import KILLED, STEP2_SLEEP, SURVIVOR, TERMINAL, spawn_worker, wait_ready
from throughput import CLIENT_IN_FLIGHT, DEFAULT_CONCURRENCY, STUCK_S, VARIANTS, key_for
from workload import AGENT, WORKFLOW, make_app

from sasflow import App, TaskState

PG_ADMIN = os.environ.get("BENCH_PG_URL") or "postgresql://postgres@127.0.0.1:5432/postgres"
AMQP_URL = os.environ.get("BENCH_AMQP_URL") or "amqp://guest:guest@127.0.0.1:5672/"
REDIS_URL = os.environ.get("BENCH_REDIS_URL") or "redis://127.0.0.1:6379/14"
TRANSPORTS = ("memory", "amqp", "redis")
RESERVED_REDIS_DBS = {"15": "the test suite's", "13": "the peers' (celery.py)"}
QUEUE_EXPIRES_S = 600  # the broker drops our queues anyway if a run dies before deleting them
WARM_UP = 20
LAT_WARM_UP = 5
APP_REF = os.path.join(C.HERE, "agent_app.py") + ":app"
ROOT = os.path.dirname(C.HERE)
_numbers = itertools.count(1)


def assert_loopback(url: str) -> None:
    host = urlsplit(url).hostname or ""
    if not (host in ("localhost", "::1") or host.startswith("127.")):
        raise SystemExit(f"refusing non-loopback host {host!r} in {url!r}")


def with_database(url: str, name: str) -> str:
    return urlsplit(url)._replace(path="/" + name).geturl()


def backend_label(transport: str) -> str:
    return "pg" if transport == "memory" else f"pg+{transport}"


def server_settings() -> dict[str, Any]:
    """What the figures' durability rests on: the server's own settings."""
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        out: dict[str, Any] = {}
        for name in ("server_version", "fsync", "synchronous_commit", "max_connections"):
            row = conn.execute(f"SHOW {name}").fetchone()
            out[name] = None if row is None else row[0]
        return out


def durability(settings: dict[str, Any]) -> str:
    return (f"postgresql fsync={settings.get('fsync')} "
            f"synchronous_commit={settings.get('synchronous_commit')}")


# ---------------------------------------------------------------- one measurement's world
class Deployment:
    """One measurement's private database, queues and worker processes; all removed on exit."""

    def __init__(self, transport: str, *, step_timeout: float = 10.0,
                 log_dir: str | None = None) -> None:
        if transport not in TRANSPORTS:
            raise SystemExit(f"unknown transport {transport!r}: choose from {TRANSPORTS}")
        n = next(_numbers)
        self.transport = transport
        self.tag = f"{os.getpid()}_{n}"
        self.db = f"bench_{self.tag}"
        self.store_url = with_database(PG_ADMIN, self.db)
        # a broker's queues are named after the agent: a private one per measurement
        self.agent = f"bench-step-{self.tag}" if transport != "memory" else AGENT
        self.step_timeout = step_timeout
        self.log_dir = log_dir or C.scratch_dir("distributed")
        self.procs: list[subprocess.Popen[bytes]] = []
        self.instances: list[str] = []  # scheduler instance ids: their reply queues
        self.transport_url: str | None = None
        if transport == "amqp":
            assert_loopback(AMQP_URL)
            sep = "&" if "?" in AMQP_URL else "?"
            self.transport_url = f"{AMQP_URL}{sep}queue_expires={QUEUE_EXPIRES_S}"
        elif transport == "redis":
            assert_loopback(REDIS_URL)
            db = urlsplit(REDIS_URL).path.strip("/") or "0"
            if db in RESERVED_REDIS_DBS:
                raise SystemExit(f"BENCH_REDIS_URL uses redis db {db}: {RESERVED_REDIS_DBS[db]};"
                                 " pick another (FLUSHDB is run on it)")
            sep = "&" if "?" in REDIS_URL else "?"
            self.transport_url = f"{REDIS_URL}{sep}prefix=bench-{self.tag}:"
        assert_loopback(PG_ADMIN)

    @property
    def distributed(self) -> bool:
        return self.transport != "memory"

    def __enter__(self) -> Deployment:
        with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{self.db}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{self.db}"')
        if self.transport == "redis":
            self._flush_redis()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        for proc in self.procs:
            C.stop_proc(proc)
        with contextlib.suppress(Exception):
            if self.transport == "amqp":
                asyncio.run(self._delete_amqp_queues())
            elif self.transport == "redis":
                self._flush_redis()
        with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{self.db}" WITH (FORCE)')

    # ---------------------------------------------------------------- apps and processes
    def app(self) -> App:
        return make_app(self.store_url, step_timeout=self.step_timeout, agent=self.agent,
                        transport=self.transport_url)

    def instance(self, role: str) -> str:
        return self.register(f"bench-{role}-{self.tag}")

    def register(self, instance_id: str) -> str:
        """Note a scheduler instance id: its reply queue is deleted at the end."""
        self.instances.append(instance_id)
        return instance_id

    def roles(self) -> tuple[str, ...]:
        """The roles the bench process runs itself."""
        return ("scheduler", "supervisor") if self.distributed else (
            "scheduler", "agent", "supervisor")

    def spawn(self, roles: str, instance_id: str, *, concurrency: int = DEFAULT_CONCURRENCY,
              supervisor_interval: float = 1.0) -> subprocess.Popen[bytes]:
        """A ``sasflow worker`` process over this deployment's store and transport."""
        assert self.transport_url is not None
        env = {**os.environ, "SASFLOW_BENCH_AGENT": self.agent,
               "SASFLOW_BENCH_STEP_TIMEOUT": str(self.step_timeout)}
        log = os.path.join(self.log_dir, f"{instance_id}.log")
        with open(log, "ab") as logf:
            proc = subprocess.Popen(
                [sys.executable, "-m", "sasflow.cli", "worker", APP_REF, "--roles", roles,
                 "--agents", self.agent, "--store", self.store_url,
                 "--transport", self.transport_url, "--instance-id", instance_id,
                 "--concurrency", str(concurrency),
                 "--supervisor-interval", str(supervisor_interval), "--log-level", "warning"],
                stdout=logf, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        self.procs.append(proc)
        return proc

    def start_agents(self, count: int) -> None:
        if not self.distributed:
            return
        procs = [self.spawn("agent", self.instance(f"agent{i}")) for i in range(count)]
        self.wait_consumers(agent_queue(self.agent), count, procs)

    # ---------------------------------------------------------------- the broker
    def wait_consumers(self, queue: str, count: int, procs: list[subprocess.Popen[bytes]],
                       timeout: float = 60.0) -> None:
        """Until `count` consumers read `queue` (the processes have started serving)."""
        end = time.monotonic() + timeout
        while True:
            for proc in procs:
                if proc.poll() is not None:
                    raise RuntimeError(f"worker exited early rc={proc.returncode}"
                                       f" (logs in {self.log_dir})")
            if self.consumers(queue) >= count:
                return
            if time.monotonic() > end:
                raise TimeoutError(f"{queue}: fewer than {count} consumer(s) after {timeout}s")
            time.sleep(0.1)

    def consumers(self, queue: str) -> int:
        if self.transport == "amqp":
            return asyncio.run(self._amqp_consumers(queue))
        import redis

        assert self.transport_url is not None
        client = redis.Redis.from_url(REDIS_URL)
        try:
            return len(client.xinfo_consumers(f"bench-{self.tag}:{queue}", "sasflow"))
        except redis.ResponseError:  # no stream or group yet
            return 0
        finally:
            client.close()

    async def _amqp_consumers(self, queue: str) -> int:
        import aio_pika

        connection = await aio_pika.connect(AMQP_URL)
        async with connection:
            channel = await connection.channel()
            try:
                declared = await channel.declare_queue(queue, passive=True)
            except Exception:  # 404: not declared yet (and the channel is closed)
                return 0
            result = declared.declaration_result
            return int(result.consumer_count or 0)

    async def _delete_amqp_queues(self) -> None:
        import aio_pika

        queues = [agent_queue(self.agent), *(f"sasflow.reply.{i}" for i in self.instances)]
        connection = await aio_pika.connect(AMQP_URL)
        async with connection:
            for queue in queues:
                channel = await connection.channel()
                with contextlib.suppress(Exception):  # never declared (agents-only ids)
                    await channel.queue_delete(queue)
                with contextlib.suppress(Exception):
                    await channel.close()

    def _flush_redis(self) -> None:
        import redis

        client = redis.Redis.from_url(REDIS_URL)
        try:
            client.flushdb()
        finally:
            client.close()


def agent_queue(agent: str) -> str:
    return f"sasflow.agent.{agent}"


def not_processed(tasks: list[Any]) -> int:
    return sum(1 for t in tasks if t.state is not TaskState.PROCESSED)


# ---------------------------------------------------------------- throughput
def measure_tp(a: argparse.Namespace) -> dict[str, Any]:
    task_input = {"sleep": a.sleep} if a.sleep else None
    result: dict[str, Any] = {"n": a.n, "sleep_s": a.sleep, "submission": a.style,
                              "concurrency": a.concurrency}
    wedged = False
    with Deployment(a.transport) as d:
        d.start_agents(a.agent_procs)
        app = d.app()
        options = {"roles": d.roles(), "concurrency": a.concurrency,
                   "instance_id": d.instance("scheduler")}
        try:
            if a.style == "presubmitted":
                async def submit_all() -> list[str]:
                    return [await app.asubmit(WORKFLOW, task_input) for _ in range(a.n)]

                ids = app._loop.run(submit_all())  # no scheduler yet: nothing is claimed
                t0 = time.perf_counter()
                app.start(**options)
                wait_all_terminal(d.store_url, a.n)
                elapsed = time.perf_counter() - t0
                tasks = [app.get(i) for i in ids]  # every task read back, off the clock
                t_sub = 0.0
            else:
                app.start(**options)
                for _ in range(WARM_UP):
                    app.wait(app.submit(WORKFLOW, task_input), timeout=STUCK_S)
                t0 = time.perf_counter()
                if a.style == "sequential":
                    ids = [app.submit(WORKFLOW, task_input) for _ in range(a.n)]
                    t_sub = time.perf_counter() - t0
                    tasks = [app.wait(i, timeout=STUCK_S) for i in ids]
                elif a.style == "clients":
                    t_sub, tasks = asyncio.run(_clients(app, a.n, task_input, t0))
                else:
                    t_sub, tasks = asyncio.run(_concurrent(app, a.n, task_input, t0))
                elapsed = time.perf_counter() - t0
            result.update({"elapsed_s": round(elapsed, 3), "submit_s": round(t_sub, 3),
                           "wf_per_s": round(a.n / elapsed, 1),
                           "steps_per_s": round(3 * a.n / elapsed, 1),
                           "not_processed": not_processed(tasks)})
        except Exception as error:  # the roles may be wedged, and app.stop() with them
            wedged = True
            result["error"] = repr(error)
        if not wedged:
            app.stop()
    if wedged:  # the database and processes are gone; leave without joining the roles
        C.emit(result)
        os._exit(1)
    return result


def wait_all_terminal(url: str, n: int) -> None:
    """Until the store holds `n` terminal tasks, polled every 20 ms on a connection of
    its own (as the procrastinate peer waits): no client shares the roles' loop."""
    watch = Observer(url, "")
    try:
        end = time.monotonic() + STUCK_S
        while watch.all_terminal() < n:
            if time.monotonic() > end:
                raise TimeoutError(f"fewer than {n} tasks terminal after {STUCK_S}s")
            time.sleep(0.02)
    finally:
        watch.close()


async def _concurrent(app: App, n: int, task_input: Any, t0: float
                      ) -> tuple[float, list[Any]]:
    async def one() -> str:
        return await app.asubmit(WORKFLOW, task_input)

    ids = await C.in_flight(n, CLIENT_IN_FLIGHT, one)
    t_sub = time.perf_counter() - t0
    return t_sub, [await app.await_(i, timeout=STUCK_S) for i in ids]


async def _clients(app: App, n: int, task_input: Any, t0: float
                   ) -> tuple[float, list[Any]]:
    """Up to CLIENT_IN_FLIGHT clients at a time, each submitting a task and awaiting
    it; the waits overlap, as the requests a web app serves at once."""
    async def one() -> Any:
        return await app.await_(await app.asubmit(WORKFLOW, task_input), timeout=STUCK_S)

    tasks = await C.in_flight(n, CLIENT_IN_FLIGHT, one)
    return time.perf_counter() - t0, tasks  # (submissions and waits are not apart)


# ---------------------------------------------------------------- latency
def measure_lat(a: argparse.Namespace) -> dict[str, Any]:
    samples: list[float] = []
    failed = 0
    wedged = False
    error = None
    with Deployment(a.transport) as d:
        d.start_agents(a.agent_procs)
        app = d.app()
        app.start(roles=d.roles(), concurrency=a.concurrency,
                  instance_id=d.instance("scheduler"))
        try:
            for i in range(LAT_WARM_UP + a.lat_n):
                t0 = time.perf_counter()
                task = app.wait(app.submit(WORKFLOW, None), timeout=30)
                took = time.perf_counter() - t0
                failed += task.state is not TaskState.PROCESSED
                if i >= LAT_WARM_UP:
                    samples.append(took)
        except Exception as caught:
            wedged, error = True, repr(caught)
        if not wedged:
            app.stop()
    result = {**C.lat_summary(samples), "not_processed": failed,
              "measure": "app.submit -> app.wait, one at a time",
              "warm_up_dropped": LAT_WARM_UP}
    if wedged:
        result["error"] = error
        C.emit(result)
        os._exit(1)
    return result


# ---------------------------------------------------------------- recovery
class Observer:
    """Reads the tasks table on its own connection (autocommit, no locks taken)."""

    def __init__(self, url: str, prefix: str) -> None:
        self.conn = psycopg.connect(url, autocommit=True)
        self.prefix = prefix

    def terminal(self) -> int:
        row = self.conn.execute(
            "SELECT count(*) FROM tasks WHERE task_id LIKE %s AND state = ANY(%s)",
            (self.prefix + "%", list(TERMINAL))).fetchone()
        return 0 if row is None else int(row[0])

    def all_terminal(self) -> int:
        """Terminal tasks of the whole (private) database: one probe of tasks_state."""
        row = self.conn.execute("SELECT count(*) FROM tasks WHERE state = ANY(%s)",
                                (list(TERMINAL),)).fetchone()
        return 0 if row is None else int(row[0])

    def locked_by(self, owner: str) -> int:
        row = self.conn.execute(
            "SELECT count(*) FROM tasks WHERE task_id LIKE %s AND locked_by = %s",
            (self.prefix + "%", owner)).fetchone()
        return 0 if row is None else int(row[0])

    def states(self) -> dict[str, int]:
        rows = self.conn.execute("SELECT state, count(*) FROM tasks WHERE task_id LIKE %s"
                                 " GROUP BY state", (self.prefix + "%",)).fetchall()
        return {str(state): int(n) for state, n in rows}

    def lease_holder(self) -> str | None:
        try:
            row = self.conn.execute(
                "SELECT holder FROM leases WHERE name = 'supervisor'").fetchone()
        except psycopg.errors.UndefinedTable:  # no schema yet
            return None
        return None if row is None else str(row[0])

    def close(self) -> None:
        self.conn.close()


def wait_lease(url: str, holder: str, procs: list[subprocess.Popen[bytes]],
               timeout: float = 60.0) -> None:
    """Until `holder`'s supervisor leads (so the second process started does not)."""
    end = time.monotonic() + timeout
    while True:
        for proc in procs:
            if proc.poll() is not None:
                raise RuntimeError(f"worker exited early rc={proc.returncode}")
        with contextlib.suppress(psycopg.OperationalError):
            watch = Observer(url, "")
            try:
                if watch.lease_holder() == holder:
                    return
            finally:
                watch.close()
        if time.monotonic() > end:
            raise TimeoutError(f"{holder} did not take the supervisor lease in {timeout}s")
        time.sleep(0.05)


def measure_crash(a: argparse.Namespace) -> dict[str, Any]:
    d_dir = C.scratch_dir("distributed", f"crash-{a.transport}-{os.getpid()}")
    effects, starts = os.path.join(d_dir, "effects.txt"), os.path.join(d_dir, "starts.txt")
    with Deployment(a.transport, step_timeout=a.step_timeout, log_dir=d_dir) as d:
        killed_id, survivor_id = f"{KILLED}-{d.tag}", f"{SURVIVOR}-{d.tag}"
        order = [(killed_id, "killed"), (survivor_id, "survivor")]
        if not a.kill_leader:
            order.reverse()  # the first one started takes the supervisor lease
        victims: list[subprocess.Popen[bytes]] = []
        if not d.distributed:  # two workers with every role, as recovery.py on SQLite
            a.budget_s = a.crash_budget_s + 60  # the workers' own --max-s
            for instance, name in order:
                ready = os.path.join(d_dir, f"ready-{name}")
                proc = spawn_worker(a, d.store_url, instance, ready,
                                    os.path.join(d_dir, f"{name}.log"))
                d.procs.append(proc)
                wait_ready(ready, proc, 60)
                if instance == killed_id:
                    victims.append(proc)
            setting = (f"2 worker processes (scheduler+agents+supervisor, concurrency "
                       f"{a.crash_concurrency}, in-process queues), one SIGKILLed")
        else:
            started: list[subprocess.Popen[bytes]] = []
            for instance, name in order:
                proc = d.spawn("scheduler,supervisor", d.register(instance),
                               concurrency=a.crash_concurrency,
                               supervisor_interval=a.supervisor_interval)
                started.append(proc)
                d.wait_consumers(f"sasflow.reply.{instance}", 1, started)
                if name == order[0][1]:
                    wait_lease(d.store_url, instance, started)
                if instance == killed_id and a.kill in ("host", "scheduler"):
                    victims.append(proc)
            agents = [d.spawn("agent", d.instance(f"agent-{name}")) for name in ("killed",
                                                                                "survivor")]
            d.wait_consumers(agent_queue(d.agent), 2, agents)
            if a.kill in ("host", "agent"):
                victims.append(agents[0])
            setting = (f"2 scheduler+supervisor processes (concurrency {a.crash_concurrency})"
                       f" and 2 agent processes over {a.transport}; killed: "
                       + {"host": "one scheduler+supervisor and one agent process",
                          "scheduler": "one scheduler+supervisor process",
                          "agent": "one agent process"}[a.kill])
        prefix = f"crash-{uuid.uuid4().hex[:8]}-"
        ids = [f"{prefix}{i}" for i in range(a.crash_n)]
        task_input = {"step2_sleep": STEP2_SLEEP, "effects": effects, "starts": starts}
        client = d.app()  # submits only: no roles
        watch = Observer(d.store_url, prefix)
        try:
            t0 = time.perf_counter()
            for task_id in ids:
                client.submit(WORKFLOW, task_input, task_id=task_id)
            t_sub = time.perf_counter() - t0
            time.sleep(1.0)
            held_at_kill = watch.locked_by(killed_id)
            leader_at_kill = watch.lease_holder()
            for proc in victims:
                proc.send_signal(signal.SIGKILL)
            for proc in victims:
                proc.wait(timeout=10)
            t_kill = time.perf_counter()
            before = C.count_effects(effects, ids)
            released_at = done_at = None
            done = 0
            end = time.monotonic() + a.crash_budget_s
            while time.monotonic() < end:
                now = time.perf_counter()
                if released_at is None and watch.locked_by(killed_id) == 0:
                    released_at = now
                done = watch.terminal()
                if done >= len(ids):
                    done_at = now
                    break
                time.sleep(0.05)
            time.sleep(0.5)  # let any stray duplicate appends land
            counts = C.count_effects(effects, ids)
            n_starts = C.count_effects(starts, ids)["lines"]
            states = watch.states()
            alive = sum(1 for p in d.procs if p.poll() is None)
        finally:
            watch.close()
            client.close()
    bound = a.step_timeout + a.supervisor_interval + 1.0
    recovery = None if done_at is None else round(done_at - t_kill, 3)
    released = None if released_at is None else round(released_at - t_kill, 3)
    return {
        "n": len(ids), "submit_s": round(t_sub, 3), "completed": done, "states": states,
        "recovery_s_from_kill": recovery, "released_s_from_kill": released,
        "held_by_killed_worker_at_kill": held_at_kill,
        "killed_worker_was_supervisor_leader": leader_at_kill == killed_id,
        "processes_killed": len(victims), "processes_alive_at_end": alive,
        "effects_done_at_kill": before["lines"], "lost": counts["lost"],
        "duplicated": counts["duplicated"], "step_starts": n_starts,
        "target_bound_s": bound, "target_total_s": bound + STEP2_SLEEP,
        "released_within_bound": released is not None and released <= bound,
        "recovered_within_total": recovery is not None and recovery <= bound + STEP2_SLEEP,
        "scratch": d_dir,
        "settings": (f"{setting}, not restarted; supervisor interval "
                     f"{a.supervisor_interval:g} s, step timeout {a.step_timeout:g} s, "
                     f"step 2 sleeps {STEP2_SLEEP:g} s"),
    }


# ---------------------------------------------------------------- orchestration
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--transport", required=True, choices=TRANSPORTS)
    ap.add_argument("--role", default="main", choices=["main", "tp", "lat", "crash"])
    ap.add_argument("--phases", default="tp,lat,crash")
    ap.add_argument("--n", type=int, default=5000)
    ap.add_argument("--styles", default="sequential,concurrent,presubmitted")
    ap.add_argument("--variants", default="noop,sleep10ms")
    ap.add_argument("--concurrency", type=int, default=DEFAULT_CONCURRENCY,
                    help="scheduler concurrency (tp, lat)")
    ap.add_argument("--agent-procs", type=int, default=1,
                    help="agent processes for amqp/redis (tp, lat)")
    ap.add_argument("--lat-n", type=int, default=100)
    ap.add_argument("--crash-n", type=int, default=200)
    ap.add_argument("--kill", default="host", choices=["host", "scheduler", "agent"],
                    help="amqp/redis crash test: which process(es) of the killed side die")
    ap.add_argument("--kill-leader", action="store_true",
                    help="kill the side whose supervisor leads")
    ap.add_argument("--step-timeout", type=float, default=3.0, help="crash test")
    ap.add_argument("--supervisor-interval", type=float, default=0.5, help="crash test")
    ap.add_argument("--crash-concurrency", type=int, default=0,
                    help="each scheduler's concurrency in the crash test (default: half the"
                         " tasks, so the killed side holds its share when it dies)")
    ap.add_argument("--crash-budget-s", type=float, default=60.0)
    ap.add_argument("--budget-s", type=float, default=900.0, help="bound for the whole run")
    ap.add_argument("--child-timeout-s", type=float, default=180.0)
    ap.add_argument("--sleep", type=float, default=0.0)
    ap.add_argument("--style", default="sequential",
                    choices=["sequential", "concurrent", "presubmitted", "clients"])
    a = ap.parse_args()
    if a.role == "tp":
        C.emit(measure_tp(a))
        return
    if a.role == "lat":
        C.emit(measure_lat(a))
        return
    if not a.crash_concurrency:
        a.crash_concurrency = max(1, a.crash_n // 2)
    if a.role == "crash":
        a.concurrency = a.crash_concurrency  # spawn_worker's name for it
        C.emit(measure_crash(a))
        return

    deadline = C.Deadline(a.budget_s)
    settings = server_settings()
    where = ("all roles in the bench process" if a.transport == "memory" else
             f"agents in {a.agent_procs} `sasflow worker --roles agent` process(es); "
             "scheduler and supervisor in the bench process")
    out: dict[str, Any] = {
        "peer": "sasflow", "backend": backend_label(a.transport), "bench": "distributed",
        "transport": a.transport, "n": a.n, "durability": durability(settings),
        "server": settings,
        "settings": {"concurrency": a.concurrency, "client_in_flight": CLIENT_IN_FLIGHT,
                     "roles": where, "agent_procs": a.agent_procs if a.transport != "memory"
                     else 0, "warm_up": WARM_UP,
                     "database": "a fresh one per measurement, dropped after"}}
    common = ["--transport", a.transport, "--concurrency", str(a.concurrency),
              "--agent-procs", str(a.agent_procs)]

    def child(args: list[str]) -> dict[str, Any]:
        left = deadline.left()
        if left < 15:
            return {"error": "skipped: out of time"}
        return C.run_child("distributed.py", [*common, *args],
                           timeout=min(left - 5, a.child_timeout_s))

    phases = a.phases.split(",")
    if "tp" in phases:
        for style in a.styles.split(","):
            for variant in a.variants.split(","):
                out[key_for("normal", style, variant)] = child(
                    ["--role", "tp", "--n", str(a.n), "--style", style,
                     "--sleep", str(VARIANTS[variant])])
    if "lat" in phases:
        out["latency_noop"] = child(["--role", "lat", "--lat-n", str(a.lat_n)])
    if "crash" in phases:
        args = ["--role", "crash", "--crash-n", str(a.crash_n), "--kill", a.kill,
                "--step-timeout", str(a.step_timeout),
                "--supervisor-interval", str(a.supervisor_interval),
                "--crash-concurrency", str(a.crash_concurrency),
                "--crash-budget-s", str(a.crash_budget_s)]
        out["crash"] = child([*args, "--kill-leader"] if a.kill_leader else args)
    C.emit(out)


if __name__ == "__main__":
    main()
