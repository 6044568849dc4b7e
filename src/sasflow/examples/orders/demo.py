"""`sasflow demo`: the order-processing example, end to end on one machine (SPEC U1).

The runner plays the platform and the application, never the pattern's roles:

1. it starts the flaky remote service in this process (real HTTP on loopback);
2. it starts W worker processes (``sasflow worker``), each running a scheduler,
   the agents and a supervisor over one embedded SQLite store;
3. it places N orders, a few of them with a card that will be declined: each
   order row and its task are committed in one transaction (E1), and the task
   carries only the order's id (E4);
4. with ``chaos`` it SIGKILLs a worker mid-run and starts a replacement, as a
   platform restarts a dead process;
5. it shows progress, then a table read from the store (through the App's
   client API, tally.py) and the service, and checks the outcome: every order
   finished, no effect applied twice, and every declined order undone (its
   stock released exactly once).

The worker processes and the progress line have a module each (workers.py,
progress.py).

Exit status 0 only if every check holds; 1 otherwise (or if the run does not
finish in time); 2 for bad arguments.
"""

from __future__ import annotations

import os
import random
import sys
import tempfile
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import httpx

from sasflow.app import App
from sasflow.errors import SasflowError
from sasflow.examples.orders.app import REMOTE_ENV, build_app
from sasflow.examples.orders.orders import WORKFLOW, place_orders, sample_orders
from sasflow.examples.orders.progress import Progress
from sasflow.examples.orders.remote import Faults, RemoteService
from sasflow.examples.orders.tally import Tally
from sasflow.examples.orders.workers import Workers
from sasflow.model import TaskState, terminal
from sasflow.redact import redact

__all__ = ["DEFAULT_FAULTS", "run_demo"]

APP_REF = "sasflow.examples.orders.app:app"
SUPERVISOR_INTERVAL = 0.5
# Tasks each worker drives at once. Far more in flight than the CPU can serve makes
# every call queue past the 2 s step timeout, and each expiry adds a retry to the
# queue; 16 keeps the service busy without that collapse on a 2-core laptop.
WORKER_CONCURRENCY = 16
DECLINE_RATE = 0.05
CHAOS_AT = 0.3  # kill a worker once this share of the orders has finished
DEADLINE = 90.0  # seconds for the whole run, at the least
POLL = 0.1
# slow replies arrive after the 2 s step timeout: the step expires although its
# effect was applied, and the supervisor's retry must be answered from the
# service's idempotency store
DEFAULT_FAULTS = Faults(transient=0.15, slow=0.03, slow_s=2.5, lost=0.03, seed=2024)

_TERMINAL = [s.value for s in TaskState if terminal(s)]
_OPEN = [s.value for s in TaskState if not terminal(s)]


def run_demo(orders: int = 200, workers: int = 3, chaos: bool = False,
             store: str | None = None, *, faults: Faults = DEFAULT_FAULTS,
             deadline: float | None = None, out: TextIO | None = None) -> int:
    """Run the demo; returns the exit status (0 only if every check passed)."""
    out = out or sys.stdout
    if orders < 1 or workers < 1:
        print(f"sasflow demo: --orders and --workers must be >= 1 (got {orders}, {workers})",
              file=sys.stderr)
        return 2
    if store is not None and not store.startswith("sqlite:"):
        print("sasflow demo: the demo runs on the embedded SQLite store,"
              f" not {redact(store)!r}",
              file=sys.stderr)
        return 2
    limit = deadline if deadline is not None else max(DEADLINE, 0.2 * orders)
    with tempfile.TemporaryDirectory(prefix="sasflow-demo-") as scratch:
        url = store or f"sqlite:///{Path(scratch) / 'orders.db'}"
        try:
            return _Run(orders, workers, chaos, url, faults, limit, Path(scratch), out).main()
        except SasflowError as error:
            print(f"sasflow demo: {error}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            print("\nsasflow demo: interrupted", file=sys.stderr)
            return 130


@dataclass
class DemoResult:
    """What a run ended with: the store's counts and the remote service's."""

    orders: int
    states: dict[str, int]
    units_started: int
    dispatches: int
    failures: int
    recoveries: int
    alerts: int
    remote: dict[str, Any]
    declined: int
    problems: list[str] = field(default_factory=list)

    @property
    def finished(self) -> int:
        return sum(self.states.get(s, 0) for s in _TERMINAL)

    @property
    def retries(self) -> int:
        """Dispatches of a unit beyond its first: after an expiry or an agent giving up."""
        return self.dispatches - self.units_started


class _Run:
    def __init__(self, orders: int, workers: int, chaos: bool, store: str, faults: Faults,
                 deadline: float, scratch: Path, out: TextIO) -> None:
        self.orders, self.workers, self.chaos = orders, workers, chaos
        self.store, self.faults, self.deadline = store, faults, deadline
        self.scratch, self.out = scratch, out
        # task ids unique to this run, so a reused store never mixes two runs up
        self.prefix = f"order-{uuid.uuid4().hex[:6]}-"
        rng = random.Random(faults.seed)
        self.declined = set(rng.sample(range(1, orders + 1),
                                       max(1, round(orders * DECLINE_RATE))))

    def main(self) -> int:
        app = build_app(self.store)
        try:
            tally = Tally(app, self.prefix)
            tally.counts()  # the first read opens the file and creates the schema before workers do
            with RemoteService(faults=self.faults) as service, \
                    Workers(_worker_command(), self._worker_env(service.url),
                            self.scratch) as pool:
                self._header(service, min(s.timeout for s in app.workflows[WORKFLOW].steps))
                started = time.monotonic()
                for _ in range(self.workers):
                    pool.start()
                self._place_orders(app)
                ok = self._watch(pool, tally, started)
                elapsed = time.monotonic() - started
                pool.stop()  # before reading the final numbers: nothing moves any more
                result = self._result(tally, service)
            self._table(result, elapsed)
            if not ok:
                pool.print_logs(self.out)
            return 0 if ok and not result.problems else 1
        finally:
            app.close()

    def _place_orders(self, app: App) -> None:
        """E1: each order row and its task commit together (orders.place_orders)."""
        place_orders(app, sample_orders(self.orders, prefix=self.prefix,  # TaskID = OrderID
                                        declined=self.declined))

    def _worker_env(self, remote: str) -> dict[str, str]:
        # every worker runs every role under its own name, whatever the caller's
        # environment says
        env = {k: v for k, v in os.environ.items()
               if k not in ("SASFLOW_INSTANCE_ID", "SASFLOW_ROLES", "SASFLOW_AGENTS")}
        env.update(SASFLOW_STORE=self.store, SASFLOW_TRANSPORT="memory")
        env[REMOTE_ENV] = remote
        return env

    # ------------------------------------------------------------ progress
    def _watch(self, pool: Workers, tally: Tally, started: float) -> bool:
        """Show progress until every order is finished; False on a timeout or a crash."""
        progress = Progress(self.out, self.orders, [*_OPEN, *_TERMINAL])
        killed = False
        while True:
            counts = tally.counts()
            finished = sum(counts.get(s, 0) for s in _TERMINAL)
            elapsed = time.monotonic() - started
            progress.show(counts, finished, elapsed)
            if finished >= self.orders:
                progress.done(counts, finished, elapsed)
                if self.chaos and not killed:
                    print("chaos: every order finished before a worker could be killed",
                          file=self.out)
                return True
            crashed = pool.crashed()
            if crashed:
                progress.note(f"worker pid {crashed[0]} exited on its own with status"
                              f" {crashed[1]}: stopping")
                return False
            if self.chaos and not killed and finished >= CHAOS_AT * self.orders:
                victim, holding = pool.busiest(tally.locked_by())
                replacement = pool.replace(victim)
                progress.note(f"chaos: SIGKILL worker pid {victim} (holding {holding} tasks)"
                              f" at {finished}/{self.orders} finished; started pid"
                              f" {replacement} in its place")
                killed = True
            if elapsed > self.deadline:
                progress.note(f"timed out after {self.deadline:g}s with"
                              f" {self.orders - finished} orders unfinished")
                return False
            time.sleep(POLL)

    def _header(self, service: RemoteService, step_timeout: float) -> None:
        f = self.faults
        workers = f"{self.workers} worker{'s' if self.workers != 1 else ''}"
        print(f"sasflow demo: {self.orders} orders ({len(self.declined)} with a declined card),"
              f" {workers}, chaos {'on' if self.chaos else 'off'}", file=self.out)
        print(f"  store   {self.store}", file=self.out)
        print(f"  remote  {service.url}  faults: {f.transient:.0%} 503, {f.slow:.0%} slow"
              f" ({f.slow_s:g}s; steps time out after {step_timeout:g}s),"
              f" {f.lost:.0%} lost replies", file=self.out)
        print(f"  workers {' '.join(_worker_command())}", file=self.out, flush=True)

    # ------------------------------------------------------------ outcome
    def _result(self, tally: Tally, service: RemoteService) -> DemoResult:
        stats = service.stats()
        units, dispatches, failures = tally.units()
        result = DemoResult(orders=self.orders, states=tally.counts(), units_started=units,
                            dispatches=dispatches, failures=failures,
                            recoveries=tally.recoveries(), alerts=tally.alerts(),
                            remote=stats, declined=len(self.declined))
        problems = result.problems
        if result.finished < self.orders:
            problems.append(f"{self.orders - result.finished} orders did not finish")
        if stats["duplicate_effects"]:
            problems.append(f"{stats['duplicate_effects']} effects were applied twice")
        states = tally.states()
        # a fresh connection per request: the service writes its headers and body
        # separately, so on a kept-alive connection each reply would wait out the
        # client's delayed ACK (~40 ms)
        no_keepalive = httpx.Limits(max_keepalive_connections=0)
        with httpx.Client(base_url=service.url, timeout=10.0, limits=no_keepalive) as client:
            for n in range(1, self.orders + 1):
                state = states.get(f"{self.prefix}{n}")
                if n in self.declined:
                    expected = ["reserve", "release"]
                    if state != TaskState.COMPENSATED.value:
                        problems.append(f"declined order {n} ended {state}, not compensated")
                        continue
                elif state == TaskState.PROCESSED.value:
                    expected = ["reserve", "charge", "ship"]
                else:
                    continue  # undone after repeated failures: no duplicates is the check
                effects = client.get("/effects", params={"order_id": n}).json()
                if effects != expected:
                    problems.append(f"order {n} ({state}): remote effects {effects},"
                                    f" expected {expected}")
        return result

    def _table(self, r: DemoResult, elapsed: float) -> None:
        faults = r.remote["faults"]
        rows: list[tuple[str, object, str]] = [
            ("orders", r.orders, f"{r.finished} finished in {elapsed:.1f}s"),
            ("  processed", r.states.get("processed", 0), ""),
            ("  compensated", r.states.get("compensated", 0), _undone(r)),
            ("  error", r.states.get("error", 0), f"{r.alerts} operator alerts"),
            ("  cancelled", r.states.get("cancelled", 0), ""),
        ]
        unfinished = sum(r.states.get(s, 0) for s in _OPEN)
        if unfinished:
            rows.append(("  unfinished", unfinished, ""))
        rows += [
            ("retries", r.retries, f"steps dispatched again ({r.dispatches} dispatches of"
                                   f" {r.units_started} units); {r.failures} failures counted"),
            ("supervisor recoveries", r.recoveries, "expired complete-by times acted on"),
            ("remote requests", r.remote["requests"],
             f"faults: {faults['transient']} 503, {faults['slow']} slow,"
             f" {faults['lost']} lost, {faults['declined']} declined"),
            ("remote effects", r.remote["effects"], _by_operation(r.remote)),
            ("deduplicated requests", r.remote["deduplicated"],
             "retries answered from the idempotency store"),
            ("duplicate effects", r.remote["duplicate_effects"], "must be 0"),
        ]
        print(file=self.out)
        for label, value, note in rows:
            print(f"  {label:<24}{value:>6}   {note}".rstrip(), file=self.out)
        print(file=self.out)
        if r.problems:
            for problem in r.problems:
                print(f"FAILED: {problem}", file=self.out)
        else:
            print("OK: every order finished, no effect was applied twice, every declined"
                  " order was undone", file=self.out)
        self.out.flush()


def _undone(r: DemoResult) -> str:
    others = r.states.get("compensated", 0) - r.declined
    return f"{r.declined} declined cards" + (
        f", {others} undone after repeated failures" if others > 0 else "")


def _by_operation(remote: Mapping[str, Any]) -> str:
    return ", ".join(f"{op} {n}" for op, n in remote["effects_by_operation"].items())

def _worker_command() -> list[str]:
    """`sasflow worker` for the example app, run by this interpreter."""
    return [sys.executable, "-m", "sasflow.cli", "worker", APP_REF,
            "--supervisor-interval", str(SUPERVISOR_INTERVAL),
            "--concurrency", str(WORKER_CONCURRENCY), "--log-level", "warning"]
