"""The invariants every fault-matrix row checks once its fault is over (SPEC R6, S5, S8, S9, M3).

One place, so that the scenario (test_scenario.py) and every row of the fault
matrix (test_matrix_*.py, docs/reliability.md) judge a run by the same rules:

* no acknowledged task lost: every submitted task is in the store and terminal;
* one owner per committed step: no unit committed twice, under two (actor, epoch)
  or twice by one, by the store's history;
* each remote effect once per idempotency key: the remote's ledger has no effect
  twice, and every effect it applied is the recorded result of exactly one unit;
* compensation once per completed step, in reverse order;
* a clear error and one alert per incident (`check_alerts`);
* bounded retries: no task or unit counted more failures than its policy allows
  (`check_bounded_retries`);
* a consistent history: each task's transitions chain (`check_history_chain`);
* fencing: what a paused or partitioned process wrote after it came back is only
  what it claimed anew (`stale_writes`);
* no hot loop: worker CPU time and log volume stay bounded (`ProcessMeter`).

`check` returns an Outcome whose `problems` list every violation found; a test
asserts that list is empty, so one run reports every broken invariant at once.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from scenarioapp import MAX_FAILURES, STEPS, UNDO, order_input

from sasflow.examples.orders.remote import RemoteService
from sasflow.model import TERMINAL_TASK_STATES, TaskState
from support.scenario import Cluster, Worker

__all__ = ["EFFECT_ORDER", "TERMINAL", "Outcome", "ProcessMeter", "check", "check_alerts",
           "check_bounded_retries", "check_history_chain", "post_mortem", "stale_writes"]

TERMINAL = {s.value for s in TERMINAL_TASK_STATES}
# the application order of one order's effects: forward, then undone in reverse
EFFECT_ORDER = [*STEPS, *(UNDO[s] for s in reversed(STEPS) if s in UNDO)]

Committed = dict[tuple[str, str, str], list[tuple[str, int]]]


@dataclass
class Outcome:
    states: dict[str, str] = field(default_factory=dict)
    expiries: list[float] = field(default_factory=list)  # supervisors' recoveries: when
    redispatched: int = 0  # units dispatched more than once
    exhausted: set[str] = field(default_factory=set)  # tasks whose retry budget ran out
    problems: list[str] = field(default_factory=list)


def check(cluster: Cluster, remote: RemoteService, tasks: int, *,
          inputs: Callable[[int], dict[str, Any]] = order_input,
          expected: bool = True, max_failures: int = MAX_FAILURES) -> Outcome:
    """Compare the store's record of orders ``order-1..order-<tasks>`` with what the
    remote service applied.

    `inputs` gives order n's input; with `expected` each order must also have
    ended as its input says (a declined card compensated, a refused shipment
    refunded and released, the others processed).
    """
    outcome = Outcome()
    problems = outcome.problems
    db = cluster.db
    outcome.states = {t: s for t, s in db.must("SELECT task_id, state FROM tasks")}
    # the failed attempt that used up a budget (forward, or the compensation's own) says
    # so in the history: "charge: expired (6x): compensating"
    outcome.exhausted = {t for (t,) in db.must(
        "SELECT DISTINCT task_id FROM history_entries WHERE step IS NULL AND why LIKE %s",
        (f"%({max_failures}x)%",))}
    if len(outcome.states) != tasks:
        problems.append(f"{len(outcome.states)} tasks in the store, {tasks} submitted")
    open_tasks = {t: s for t, s in outcome.states.items() if s not in TERMINAL}
    if open_tasks:
        problems.append(f"not terminal: {sorted(open_tasks.items())[:20]}")

    # ---- the store's history: each unit committed once, by one owner
    history = db.must("SELECT task_id, step, phase, actor, epoch, from_state, to_state"
                      " FROM history_entries WHERE step IS NOT NULL ORDER BY id, part")
    committed: defaultdict[tuple[str, str, str], list[tuple[str, int]]] = defaultdict(list)
    for task, step, phase, actor, epoch, _, to_state in history:
        if (phase, to_state) in (("do", "completed"), ("undo", "compensated")):
            committed[(task, step, phase)].append((actor, epoch))
    for unit, owners in committed.items():
        if len(owners) > 1:
            problems.append(f"{unit} committed {len(owners)} times, by (actor, epoch) {owners}")

    outcome.expiries = [float(r[0]) for r in db.must(
        "SELECT at FROM history_entries WHERE step IS NULL AND why LIKE %s", ("%expired%",))]
    outcome.redispatched = int(db.must("SELECT COUNT(*) FROM steps WHERE attempts > 1")[0][0])

    # ---- the units as they ended
    units: dict[tuple[str, str, str], tuple[str, bool, Any, str]] = {}
    for task, phase, name, state, in_doubt, result, key in db.must(
            "SELECT task_id, phase, name, state, in_doubt, result, idempotency_key FROM steps"):
        units[(task, name, phase)] = (state, bool(in_doubt),
                                      None if result is None else json.loads(result), key)

    # ---- every effect the remote applied is the result of exactly one unit, under its key
    stats = remote.stats()
    if stats["duplicate_effects"]:
        problems.append(f"the remote applied {stats['duplicate_effects']} effects twice: {stats}")
    recorded: defaultdict[str, set[str]] = defaultdict(set)
    doubtful: Counter[str] = Counter()
    for (task, step, phase), (state, in_doubt, result, key) in units.items():
        operation = step if phase == "do" else UNDO.get(step, "")
        if isinstance(result, dict) and "effect_id" in result:
            if result["key"] != key or result["operation"] != operation:
                problems.append(f"{(task, step, phase)}: result {result} is not its own"
                                f" (key {key}, operation {operation})")
            if result["effect_id"] in recorded[operation]:
                problems.append(f"effect {result['effect_id']} recorded by two units")
            recorded[operation].add(result["effect_id"])
        elif in_doubt or state not in ("pending", "completed", "compensated"):
            doubtful[operation] += 1  # it may have applied an effect it could not record
    for operation, applied in stats["effects_by_operation"].items():
        ids = {f"{operation}-{i}" for i in range(1, applied + 1)}
        unknown = recorded[operation] - ids
        unrecorded = ids - recorded[operation]
        if unknown or len(unrecorded) > doubtful[operation]:
            problems.append(f"{operation}: the remote applied {applied}; the store recorded"
                            f" {sorted(recorded[operation])[:10]}...; unknown to the remote"
                            f" {sorted(unknown)}, not in the store {sorted(unrecorded)}"
                            f" (units in doubt: {doubtful[operation]})")

    # ---- per order: forward effects once, each completed step undone once, in reverse
    no_keepalive = httpx.Limits(max_keepalive_connections=0)
    with httpx.Client(base_url=remote.url, timeout=10.0, limits=no_keepalive) as client:
        for n in range(1, tasks + 1):
            task = f"order-{n}"
            applied = client.get("/effects", params={"order_id": n}).json()
            state = outcome.states.get(task)
            problems += check_order(task, state, applied, units, committed)
            if expected:
                problems += check_expected(task, inputs(n), state, applied,
                                           exhausted=task in outcome.exhausted)
    problems += check_bounded_retries(cluster, max_failures)
    problems += check_history_chain(cluster)
    return outcome


def check_order(task: str, state: str | None, applied: list[str],
                units: dict[tuple[str, str, str], tuple[str, bool, Any, str]],
                committed: Committed) -> list[str]:
    """One order's remote effects against its units: once each, in order, each
    committed unit applied, each completed step of a compensated order undone."""
    problems: list[str] = []
    where = f"{task} ({state}): remote effects {applied}"
    twice = [op for op, count in Counter(applied).items() if count > 1]
    if twice:
        problems.append(f"{where}: applied twice: {twice}")
    if applied != sorted(applied, key=EFFECT_ORDER.index):
        problems.append(f"{where}: not in the order {EFFECT_ORDER}")
    sure: set[str] = set()
    maybe: set[str] = set()
    for step in STEPS:
        do = units.get((task, step, "do"))
        if (task, step, "do") in committed:
            sure.add(step)
        elif do is not None and (do[1] or do[0] == "failed"):
            maybe.add(step)  # given up after expiring (in doubt), or failed mid-call
        if step in UNDO:
            undo = units.get((task, step, "undo"))
            if (task, step, "undo") in committed:
                sure.add(UNDO[step])
                if step not in sure | maybe:
                    maybe.add(step)
            elif undo is not None and undo[0] != "pending":
                maybe.add(UNDO[step])
    missing = sure - set(applied)
    extra = set(applied) - sure - maybe
    if missing or extra:
        problems.append(f"{where}: the store committed {sorted(sure)}; the remote lacks"
                        f" {sorted(missing)} and has {sorted(extra)} besides")
    if state == TaskState.COMPENSATED:
        for step, undo_op in UNDO.items():
            if step in applied and undo_op not in applied:
                problems.append(f"{where}: {step} was applied and never undone")
            if (task, step, "do") in committed and (task, step, "undo") not in committed:
                problems.append(f"{where}: {step} completed, its compensation never did")
    return problems


def check_expected(task: str, order: dict[str, Any], state: str | None,
                   applied: list[str], *, exhausted: bool = False) -> list[str]:
    """The end scenarioapp.py promises for the order's input; `exhausted`: the task
    used up its retry budget, so it must only end compensated or in error (the
    policy's end), not exactly as its input says."""
    problems: list[str] = []
    where = f"{task} ({state}): remote effects {applied}"
    if order.get("refund_fault"):
        return problems  # its own test says how it ends
    failing = order["card"] == "declined" or order["refuse_ship"]
    if state == TaskState.PROCESSED:
        if applied != list(STEPS):
            problems.append(f"{where}: processed, expected {list(STEPS)}")
        if failing:
            problems.append(f"{where}: processed although it must fail")
    if exhausted:
        if state not in (TaskState.COMPENSATED, TaskState.ERROR):
            problems.append(f"{where}: its retries ran out, yet it ended {state}")
        return problems
    if order["card"] == "declined" and (state, applied) != ("compensated", ["reserve", "release"]):
        problems.append(f"{where}: a declined card must end compensated by a release")
    if order["refuse_ship"] and (state, applied) != (
            "compensated", ["reserve", "charge", "refund", "release"]):
        problems.append(f"{where}: a refused shipment must end refunded and released")
    return problems


def check_bounded_retries(cluster: Cluster, max_failures: int) -> list[str]:
    """No task and no unit counted more failures than the workflow's policy allows (S8)."""
    over = cluster.db.must("SELECT task_id, failure_count FROM tasks WHERE failure_count > %s",
                           (max_failures,))
    over_units = cluster.db.must(
        "SELECT task_id, phase, name, failure_count FROM steps WHERE failure_count > %s",
        (max_failures,))
    return [f"{row}: more failures than max_failures={max_failures}" for row in over + over_units]


def check_history_chain(cluster: Cluster) -> list[str]:
    """Each task's transitions chain: every one starts from the state the one before
    ended in, so no two actors both moved the task from the same state (exactly one
    of a racing operator and supervisor wins)."""
    problems: list[str] = []
    last: dict[str, str] = {}
    for task, from_state, to_state, actor, why in cluster.db.must(
            "SELECT task_id, from_state, to_state, actor, why FROM history_entries"
            " WHERE step IS NULL ORDER BY id"):
        before = last.get(task)
        if before is not None and from_state != before:
            problems.append(f"{task}: {actor} moved it from {from_state} to {to_state}"
                            f" ({why}) although it was {before}")
        last[task] = to_state
    return problems


def check_alerts(cluster: Cluster, expected: Iterable[str]) -> list[str]:
    """One alert per incident: exactly one for each task in `expected` (each names
    its task, step and cause), none for any other task; and no alert about something
    other than one task (an unknown workflow, say) in a run that declared everything."""
    every = cluster.db.must("SELECT task_id, step, message FROM alerts ORDER BY id")
    rows = [r for r in every if r[0] is not None]
    problems = [f"an alert about no task: {r[2]!r}" for r in every if r[0] is None]
    per_task = Counter(r[0] for r in rows)
    want = set(expected)
    problems += [f"{t}: {n} alerts, expected {int(t in want)}: "
                f"{[r[2] for r in rows if r[0] == t]}"
                for t, n in per_task.items() if n != (1 if t in want else 0)]
    problems += [f"{t}: no alert" for t in sorted(want - set(per_task))]
    problems += [f"alert for {t} names no step: {m!r}" for t, s, m in rows if not s or not m]
    return problems


def stale_writes(cluster: Cluster, actor: str, since: float) -> list[str]:
    """What `actor` wrote, on a task it touched after `since`, once another actor had
    changed that task and before `actor` claimed it again.

    A paused or partitioned scheduler that comes back must change nothing it held
    before (M1 fencing): once a supervisor released its task (or anyone else wrote
    it), each later row of `actor` must follow a claim of its own. Rows it wrote
    while it still held the task (a reply that arrived before a broker partition,
    written just after it began) are its own to write.
    """
    rows = cluster.db.must(
        "SELECT task_id, step, epoch, actor, from_state, to_state, why FROM history_entries"
        " WHERE task_id IN (SELECT DISTINCT task_id FROM history_entries WHERE actor = %s"
        " AND at > %s) ORDER BY id, part", (actor, since))
    taken: set[str] = set()  # tasks another actor wrote since `actor` last claimed them
    stale = []
    for task, step, epoch, who, from_state, to_state, why in rows:
        if who != actor:
            taken.add(task)
        elif step is None and to_state in ("processing", "compensating") and (
                from_state in ("pending", "compensating")) and "claimed" in (why or ""):
            taken.discard(task)
        elif task in taken:
            stale.append(f"{actor} wrote {task}/{step} at epoch {epoch} after another"
                         f" actor had changed it: {from_state} -> {to_state} ({why})")
    return stale


def post_mortem(cluster: Cluster, outcome: Outcome) -> str:
    """The store's record of the first tasks named in the problems; all of it in a file."""
    columns = ("id, task_id, step, phase, at, actor, epoch, from_state, to_state, why")
    everything = cluster.db.must(f"SELECT {columns} FROM history_entries ORDER BY id, part")
    path = cluster.root / "history.txt"
    path.write_text("\n".join(" | ".join(map(str, row)) for row in everything) + "\n")
    suspects = list(dict.fromkeys(re.findall(r"order-\d+", "\n".join(outcome.problems))))[:4]
    lines = [f"history of every task: {path}"]
    for task in suspects:
        lines.append(f"--- history of {task} ({columns}):")
        lines += [" | ".join(map(str, row)) for row in everything if row[1] == task]
        lines.append(f"--- steps of {task}:")
        lines += [" | ".join(map(str, row)) for row in cluster.db.must(
            "SELECT phase, idx, name, state, attempts, failure_count, in_doubt, result"
            " FROM steps WHERE task_id = %s ORDER BY phase, idx", (task,))]
    return "\n".join(lines)


# ------------------------------------------------------------------ no hot loop
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time the process has used, from /proc/PID/stat."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS  # utime, stime


def _lines(path: Path) -> int:
    with path.open("rb") as log:
        return sum(chunk.count(b"\n") for chunk in iter(lambda: log.read(1 << 16), b""))


@dataclass
class _Sample:
    at: float
    cpu: dict[str, float]
    lines: dict[str, int]


class ProcessMeter:
    """CPU time and log lines of live workers over a span the test marks (R3, M5).

    ``begin()`` then, after the positive signal that ends the span, ``problems()``:
    a worker that used more than `max_core` of a core over the span, or logged more
    than `max_lines` lines in it, is in a hot loop. The span's length comes from the
    signal the test waits for (supervisor lease renewals, say), never from a sleep.
    """

    def __init__(self, workers: Iterable[Worker]) -> None:
        self.workers = [w for w in workers if w.alive]
        self.start: _Sample | None = None

    def _sample(self) -> _Sample:
        return _Sample(time.monotonic(), {w.name: cpu_seconds(w.pid) for w in self.workers},
                       {w.name: _lines(w.log) for w in self.workers})

    def begin(self) -> None:
        self.start = self._sample()

    def problems(self, *, max_core: float, max_lines: int) -> list[str]:
        assert self.start is not None, "begin() first"
        end = self._sample()
        span = end.at - self.start.at
        found = []
        for worker in self.workers:
            cpu = end.cpu[worker.name] - self.start.cpu[worker.name]
            lines = end.lines[worker.name] - self.start.lines[worker.name]
            print(f"  {worker.name}: {cpu:.2f}s CPU ({cpu / span:.1%} of a core),"
                  f" {lines} log lines in {span:.1f}s")
            if cpu > max_core * span:
                found.append(f"{worker.name}: {cpu:.2f}s of CPU in {span:.1f}s (hot loop?)")
            if lines > max_lines:
                found.append(f"{worker.name}: {lines} log lines in {span:.1f}s (hot loop?)")
        return found
