"""Deterministic simulation: seeded fault schedules against the real actors (SPEC R6).

One run puts the real Scheduler, AgentRuntime and Supervisor of a few worker
instances in one process, on a virtual clock (clock.py), over an in-memory
store behind per-instance gates (gate.py), a simulated broker (transport.py)
and a simulated remote service (remote.py). The seed draws the run and its
faults (faults.py); when the faults stop and every task is terminal, the
invariants are checked against the store's history and the remote's ledger
(invariants.py). The same seed gives the same run, to the byte. This module
runs seeds and is the command; a run's world and what happens in it are
world.py's.

    python -m sasflow.testing.sim --seed 1234              # one run: its schedule, faults, verdict
    python -m sasflow.testing.sim --runs 10000 --jobs 2    # many seeds; the failing ones listed
"""

from __future__ import annotations

import argparse
import collections
import logging
import multiprocessing
import random
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from sasflow.testing import failpoints
from sasflow.testing.clock import VirtualClockLoop
from sasflow.testing.faults import FAULT_KINDS, Schedule
from sasflow.testing.world import HORIZON as HORIZON
from sasflow.testing.world import START as START
from sasflow.testing.world import SUPERVISOR_INTERVAL as SUPERVISOR_INTERVAL
from sasflow.testing.world import World

__all__ = ["Outcome", "main", "run"]
# (START, HORIZON and SUPERVISOR_INTERVAL, imported `as` themselves, are the world's
# now, and still importable from here.)

# a loop that goes round this often without time moving is a hot loop, not progress
STEPS_WITHOUT_TIME = 200_000


@dataclass
class Outcome:
    """What one seed's run came to."""

    seed: int
    violations: list[str]
    digest: str
    virtual_seconds: float
    injected: collections.Counter[str] = field(default_factory=collections.Counter)
    states: collections.Counter[str] = field(default_factory=collections.Counter)
    schedule: str = ""
    faults_log: list[str] = field(default_factory=list)
    log_lines: list[str] = field(default_factory=list)



def run(seed: int, *, trace: bool = False) -> Outcome:
    """Simulate the run seed `seed` describes and check the invariants after it."""
    schedule = Schedule.draw(seed)
    loop = VirtualClockLoop(step_limit=STEPS_WITHOUT_TIME)
    state = random.getstate()
    random.seed(f"jitter:{seed}")  # the agents' retry jitter draws from `random`
    sasflow_log = logging.getLogger("sasflow")
    level, propagate = sasflow_log.level, sasflow_log.propagate
    simulation = World(schedule, loop, trace=trace)
    sasflow_log.addHandler(simulation.logs)
    sasflow_log.setLevel(logging.INFO)
    sasflow_log.propagate = trace
    try:
        try:
            violations = loop.run_until_complete(simulation.simulate())
        except RuntimeError as error:  # the loop's own guard: time stood still too long
            violations = [f"hot loop: {error}"]
        digest = loop.run_until_complete(simulation.digest())
        tasks = loop.run_until_complete(simulation.tasks())
        loop.run_until_complete(simulation.stop())
    finally:
        sasflow_log.removeHandler(simulation.logs)
        sasflow_log.setLevel(level)
        sasflow_log.propagate = propagate
        random.setstate(state)
        failpoints.reset()
        loop.close()
    if simulation.logs.count > 50 * max(loop.time(), 1.0):
        violations.append(f"hot loop: {simulation.logs.count} log records in"
                          f" {loop.time():.0f} virtual seconds")
    return Outcome(seed=seed, violations=violations, digest=digest,
                   virtual_seconds=loop.time(), injected=simulation.decisions.injected,
                   states=collections.Counter(t.state.value for t in tasks if t is not None),
                   schedule=schedule.describe(), faults_log=simulation.decisions.log,
                   log_lines=simulation.logs.lines)


# ---------------------------------------------------------------- the command


def _summary(seed: int) -> tuple[int, list[str], collections.Counter[str]]:
    outcome = run(seed)
    return seed, outcome.violations, outcome.injected


def run_many(seeds: Sequence[int], jobs: int) -> Iterator[tuple[int, list[str],
                                                               collections.Counter[str]]]:
    """Run every seed, in `jobs` processes; yields each seed's violations as it ends."""
    if jobs <= 1:
        yield from map(_summary, seeds)
        return
    with multiprocessing.get_context("fork").Pool(jobs) as pool:
        yield from pool.imap_unordered(_summary, seeds, chunksize=16)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sasflow.testing.sim",
        description="Run seeded fault schedules against sasflow's actors on a virtual clock"
                    " and check the invariants after each (SPEC R6).")
    parser.add_argument("--seed", type=int, help="replay one seed: its schedule, faults and"
                                                 " verdict")
    parser.add_argument("--runs", type=int, default=100, help="how many seeds (default 100)")
    parser.add_argument("--start", type=int, default=0, help="the first seed (default 0)")
    parser.add_argument("--jobs", type=int, default=1, help="processes (default 1)")
    parser.add_argument("--verbose", action="store_true",
                        help="with --seed: also the injected faults and the actors' log")
    args = parser.parse_args(argv)
    if args.seed is not None:
        return _replay(args.seed, verbose=args.verbose)
    if args.runs < 1 or args.jobs < 1:
        parser.error("--runs and --jobs must be at least 1")
    seeds = range(args.start, args.start + args.runs)
    began = time.perf_counter()
    failed: list[tuple[int, list[str]]] = []
    kinds: collections.Counter[str] = collections.Counter()
    for seed, violations, injected in run_many(seeds, args.jobs):
        kinds.update(injected)
        if violations:
            failed.append((seed, violations))
            print(f"seed {seed}: {violations[0]}", file=sys.stderr)
    elapsed = time.perf_counter() - began
    print(f"{len(seeds)} schedules in {elapsed:.1f}s ({len(seeds) / elapsed * 60:.0f} per"
          f" minute, {args.jobs} job(s)): {len(failed)} with violations")
    print("faults injected: " + ", ".join(f"{k} {kinds[k]}" for k in FAULT_KINDS))
    for seed, _ in sorted(failed)[:20]:
        print(f"  replay: python -m sasflow.testing.sim --seed {seed} --verbose")
    return 1 if failed else 0


def _replay(seed: int, *, verbose: bool) -> int:
    outcome = run(seed, trace=verbose)
    print(outcome.schedule)
    if verbose:
        print("-- faults injected, in order:")
        print("\n".join(outcome.faults_log) or "(none)")
        print("-- log (virtual seconds):")
        print("\n".join(outcome.log_lines) or "(empty)")
    states = ", ".join(f"{k} {v}" for k, v in sorted(outcome.states.items()))
    print(f"-- {outcome.virtual_seconds:.1f} virtual seconds; tasks: {states};"
          f" digest {outcome.digest}")
    if outcome.violations:
        print("VIOLATED:\n  " + "\n  ".join(outcome.violations))
        return 1
    print("invariants held")
    return 0


if __name__ == "__main__":
    sys.exit(main())
