"""What one step's duration observation costs: prometheus_client's Histogram.observe
(a lock twice, the bounds walked one by one) against the histogram the worker keeps
by hand (durations.Durations: a bisect and two additions), with the same buckets,
in a warm loop; nanoseconds a call, the empty call's cost taken off, median of
--rounds.

Usage: python bench/observe_cost.py [--calls 200000] [--rounds 5]
Prints one JSON line.
"""

from __future__ import annotations

import argparse
import statistics
import timeit
from collections.abc import Callable

import common as C
from prometheus_client import CollectorRegistry, Histogram

from sasflow.metrics import STEP_BUCKETS, Metrics


def per_call_ns(call: Callable[[], object], calls: int) -> float:
    return timeit.timeit(call, number=calls) / calls * 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    library = Histogram("step", "a step", ["agent", "outcome"], buckets=STEP_BUCKETS,
                        registry=CollectorRegistry()).labels("payments", "ok")
    ours = Metrics().step_duration.series("payments", "ok")
    amount = 0.0003  # a no-op step: the first bucket, the library's shortest walk
    runs: dict[str, list[float]] = {"library": [], "sasflow": []}
    for _ in range(a.rounds):
        empty = per_call_ns(lambda: None, a.calls)
        runs["library"].append(per_call_ns(lambda: library.observe(amount), a.calls) - empty)
        runs["sasflow"].append(per_call_ns(lambda: ours.observe(amount), a.calls) - empty)
    C.emit({"bench": "observe_cost", "calls": a.calls,
            "median_ns": {name: round(statistics.median(found)) for name, found in runs.items()},
            "runs_ns": {name: [round(x) for x in found] for name, found in runs.items()}})


if __name__ == "__main__":
    main()
