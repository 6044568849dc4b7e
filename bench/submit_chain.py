"""Where a blocking submission's time goes on SQLite: the sequential throughput row
(throughput.py, the peers' protocol) with each `app.submit` taken apart.

A blocking submit crosses three threads: the caller's, the roles' event loop
(`Client.asubmit`), and the store's writer (one group transaction of whatever
jobs are waiting, writer.py), whose commit answers the caller directly. This
run times, for each submission after the first 100:

  to the loop     the caller's call until `asubmit` starts on the loop
  on the loop     `asubmit` until the store hands its job to the writer
  to its batch    the job handed over until the writer's transaction holding it
                  starts (the writer finishing the batch it was in)
  its batch       that transaction, with the other jobs in it (the roles' applies)
  back            the commit until the caller has its answer

and, for the whole run, the writer's transactions: how many, their size and
duration, and the share of the time the writer was in one. The hooks wrap the
methods named above; they add a few microseconds to each.

Usage: python bench/submit_chain.py [--n 3000]
Prints one JSON line (medians and means in µs).
"""

from __future__ import annotations

import argparse
import bisect
import statistics
import time
from typing import Any

import common as C
import throughput

from sasflow import background_loop, client
from sasflow.store.sqlite import store, writer

_now = time.perf_counter


class _Hooks:
    """Timestamps taken by wrapping the methods a submission passes through."""

    def __init__(self) -> None:
        self.current: dict[str, float] = {}
        self.submits: list[tuple[float, float, float, float]] = []  # call, loop, put, back
        self.batches: list[tuple[float, float, int]] = []  # start, end, jobs

    def install(self) -> None:
        hooks, asubmit, commit = self, client.Client.asubmit, writer.Writer._commit
        submit, submit_claimed = store.SQLiteStore.submit, store.SQLiteStore.submit_claimed
        call = background_loop.BackgroundLoop.call

        async def timed_asubmit(self: Any, *args: Any, **kwargs: Any) -> str:
            hooks.current["loop"] = _now()
            return await asubmit(self, *args, **kwargs)

        # both hand their job to the writer at once (the roles' applies do too, so
        # the writer's own entry would not tell a submission's job from theirs)
        async def timed_submit(self: Any, *args: Any, **kwargs: Any) -> Any:
            hooks.current["put"] = _now()
            return await submit(self, *args, **kwargs)

        async def timed_submit_claimed(self: Any, *args: Any, **kwargs: Any) -> Any:
            hooks.current["put"] = _now()
            return await submit_claimed(self, *args, **kwargs)

        def timed_commit(self: Any, conn: Any, batch: list[Any]) -> Any:
            start = _now()
            try:
                return commit(self, conn, batch)
            finally:
                hooks.batches.append((start, _now(), len(batch)))

        def timed_call(self: Any, coro: Any, *, early: bool = False) -> Any:
            hooks.current.clear()
            start = _now()
            result = call(self, coro, early=early)
            if early:  # a submission (answered once durable)
                at = hooks.current
                hooks.submits.append((start, at.get("loop", start), at.get("put", start), _now()))
            return result

        for owner, name, hook in (
                (client.Client, "asubmit", timed_asubmit),
                (store.SQLiteStore, "submit", timed_submit),
                (store.SQLiteStore, "submit_claimed", timed_submit_claimed),
                (writer.Writer, "_commit", timed_commit),
                (background_loop.BackgroundLoop, "call", timed_call)):
            setattr(owner, name, hook)

    def parts(self, skip: int) -> dict[str, list[float]]:
        """Each submission's parts, found with the transaction that committed it: the
        first to start after its job was handed over and to end before its answer."""
        starts = [start for start, _, _ in self.batches]
        parts: dict[str, list[float]] = {k: [] for k in (
            "total", "to_the_loop", "on_the_loop", "to_its_batch", "its_batch", "back",
            "batch_jobs")}
        for call, loop, put, back in self.submits[skip:]:
            i = bisect.bisect_left(starts, put)
            while i < len(self.batches) and self.batches[i][1] > back:
                i += 1
            if i == len(self.batches):
                continue
            start, end, jobs = self.batches[i]
            for name, value in (("total", back - call), ("to_the_loop", loop - call),
                                ("on_the_loop", put - loop), ("to_its_batch", start - put),
                                ("its_batch", end - start), ("back", back - end)):
                parts[name].append(value * 1e6)
            parts["batch_jobs"].append(jobs)
        return parts


def _summary(values: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(values), 1),
            "mean": round(statistics.fmean(values), 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=3000)
    a = ap.parse_args()
    hooks = _Hooks()
    hooks.install()
    row = throughput.measure(argparse.Namespace(
        n=a.n, style="sequential", sleep=0.0, sync="normal",
        concurrency=throughput.DEFAULT_CONCURRENCY))
    parts = hooks.parts(skip=100)
    batches = hooks.batches
    busy = sum(end - start for start, end, _ in batches)
    C.emit({"bench": "submit_chain", "backend": "sqlite", "n": a.n,
            "steps_per_s": row["steps_per_s"], "cpu_us_per_step": row["cpu_us_per_step"],
            "submissions_timed": len(parts["total"]),
            **{name: _summary(values) for name, values in parts.items()},
            "transactions": len(batches),
            "transaction_us": _summary([(end - start) * 1e6 for start, end, _ in batches]),
            "jobs_a_transaction": round(statistics.fmean(n for _, _, n in batches), 2),
            "writer_busy_share": round(busy / (batches[-1][1] - batches[0][0]), 3)})


if __name__ == "__main__":
    main()
