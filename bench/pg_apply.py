"""What one step's transition costs on the PostgreSQL store, by how many tasks it holds.

For each size S in --stored: a private database (as bench/distributed.py makes one)
holding S finished tasks of another workflow (three steps and a history row each,
bulk-inserted, then ANALYZE as autovacuum would), then --n wf3 tasks submitted and
claimed through the store, and each one's first reply applied through
`store.apply`:

  alone    one transition at a time, each awaited before the next: the batch of
           one that a single task's latency pays at every step (median µs);
  batched  --batch transitions at once (`asyncio.gather`), as many tasks' steps
           ending together: the group commit writes them in few statements
           (µs per transition, median over the batches).

A statement whose cost grows with S (the bulk transition's join to the tasks
table once scanned it whole for every batch) shows here as µs growing with S.
To compare another tree, run its copy of this script with its `src` first on
the path: ``PYTHONPATH=../prev/src python ../prev/bench/pg_apply.py``, or this one
with ``PYTHONPATH=OTHER/src``, since it uses only the store's own verbs.

Usage: python bench/pg_apply.py [--stored 1000,20000] [--n 300] [--batch 64]
Prints one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

import common as C
import psycopg
from distributed import Deployment, server_settings
from workload import WORKFLOW

OWNER = "bench-scheduler"


def fill(url: str, stored: int) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("INSERT INTO tasks (task_id, workflow, input, state, available_at,"
                     " created_at, updated_at, version)"
                     " SELECT 'old-' || g, 'archived', '{}', 'processed', 0, 0, 0, 'v'"
                     " FROM generate_series(1, %s) g", (stored,))
        conn.execute("INSERT INTO steps (task_id, phase, idx, name, agent, state,"
                     " idempotency_key, updated_at)"
                     " SELECT 'old-' || g, 'do', i, 's' || i, 'a', 'completed', g || '/' || i, 0"
                     " FROM generate_series(1, %s) g, generate_series(0, 2) i", (stored,))
        conn.execute("INSERT INTO history (task_id, at, actor, epoch, to_state)"
                     " SELECT 'old-' || g, 0, 'submit', 0, 'pending'"
                     " FROM generate_series(1, %s) g", (stored,))
        conn.execute("ANALYZE tasks, steps, history")


def measure(stored: int, n: int, batch: int) -> dict[str, Any]:
    with Deployment("memory") as d:
        app = d.app()
        store, plans = app._store, app._plans()

        async def prepare() -> None:
            assert await store.get("warm-up") is None  # the schema is there

        async def replies(count: int) -> list[Any]:
            for _ in range(count):
                await app.asubmit(WORKFLOW, None)
            claimed = await store.claim(OWNER, count, plans)
            return [plans[t.workflow].reply(t, OWNER, True, {"ok": 1}, None, store.now())
                    for t in claimed]

        async def alone() -> list[float]:
            took = []
            for transition in await replies(n):
                t0 = time.perf_counter()
                assert await store.apply(transition)
                took.append((time.perf_counter() - t0) * 1e6)
            return took

        async def batched() -> list[float]:
            took = []
            for _ in range(max(3, n // batch)):
                transitions = await replies(batch)
                t0 = time.perf_counter()
                assert all(await asyncio.gather(*(store.apply(t) for t in transitions)))
                took.append((time.perf_counter() - t0) * 1e6 / batch)
            return took

        try:
            app._loop.run(prepare())
            fill(d.store_url, stored)
            one = app._loop.run(alone())[10:]  # the first ones prepare the statements
            many = app._loop.run(batched())[1:]
        finally:
            app.close()
    return {"stored": stored, "alone_us": round(statistics.median(one), 1),
            "batched_us_per_transition": round(statistics.median(many), 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stored", default="1000,20000")
    ap.add_argument("--n", type=int, default=300)
    ap.add_argument("--batch", type=int, default=64)
    a = ap.parse_args()
    C.emit({"peer": "sasflow", "backend": "pg", "bench": "pg_apply", "n": a.n,
            "batch": a.batch, "server": server_settings(),
            "apply": [measure(int(s), a.n, a.batch) for s in a.stored.split(",")]})


if __name__ == "__main__":
    main()
