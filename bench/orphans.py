"""What the supervisor pays, once an interval, to look for gone instances' tasks.

`Store.orphaned` checks every locked task against its owner's instance row
(stopped, silent past its lease, or locked before the owner's process started).
It runs once per supervisor interval (not at each expiry wake-up), and its cost
grows with the number of locked tasks: this builds a store with N tasks locked
by one live instance (nothing orphaned, the common case) and times the query.

Usage: python bench/orphans.py [--locked 10000] [--store URL] [--repeat 20]
(default store: a fresh SQLite file; a PostgreSQL URL should name an empty
schema, e.g. ``...?options=-csearch_path%3Dscratch``). Prints one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from typing import Any

import common as C

from sasflow import App, Step
from sasflow.store.records import Instance

SUBMIT_BATCH = 500


async def measure(url: str, locked: int, repeat: int) -> dict[str, Any]:
    app = App(store=url)
    app.agent("x")(lambda req: None)
    app.workflow("w", [Step("a", agent="x", timeout=300.0)])
    store, plans = app._store, app._plans()
    try:
        for first in range(0, locked, SUBMIT_BATCH):
            await asyncio.gather(*(store.submit(app._new_task("w", None, task_id=f"t{n}"))
                                   for n in range(first, min(first + SUBMIT_BATCH, locked))))
        await store.beat(Instance(instance_id="alive", host="h", pid=os.getpid(), roles=[],
                                  agents=[], workflows={}, lease=3600.0), first=True)
        claimed = 0
        while claimed < locked:
            claimed += len(await store.claim("alive", 1000, plans))
        samples = []
        for _ in range(repeat):
            began = time.perf_counter()
            found = await store.orphaned(1000)
            samples.append(time.perf_counter() - began)
        assert found == [], "a live instance's tasks are not orphaned"
    finally:
        await store.close()
    return {"locked": claimed, "orphaned_ms_median": round(statistics.median(samples) * 1e3, 2),
            "orphaned_ms_max": round(max(samples) * 1e3, 2), "repeat": repeat}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--locked", type=int, default=10_000)
    ap.add_argument("--store", default=None)
    ap.add_argument("--repeat", type=int, default=20)
    a = ap.parse_args()
    url = a.store or C.store_url(os.path.join(
        C.scratch_dir("orphans", time.strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}"),
        "store.db"))
    backend = "pg" if url.startswith("postgres") else "sqlite"
    C.emit({"peer": "sasflow", "backend": backend, "bench": "orphans",
            **asyncio.run(measure(url, a.locked, a.repeat))})


if __name__ == "__main__":
    main()
