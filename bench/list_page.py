"""A page of the task list with a million tasks stored, through the HTTP API.

For each store (--stores sqlite,pg): a fresh store (a private database on
PostgreSQL, as bench/distributed.py makes one) whose migrations ran, then --tasks
tasks bulk-inserted in SQL (created one millisecond apart; 95% processed, 3%
error, 2% pending, across three workflows), then ANALYZE as autovacuum would.
`sasflow serve`'s app is served by uvicorn on a loopback port, and an operator's
pages are fetched over HTTP, one at a time, --n times each:

  newest        GET /api/v1/tasks?limit=50 (the dashboard's first page)
  newest_deep   the page after following the cursor 20 pages down
  oldest        ?order=oldest
  state_error   ?state=error (3% of the store)
  workflow      ?workflow=wf-b&order=oldest
  created_range ?created_from=...&created_to=... (an hour in the middle)
  one_task      GET /api/v1/tasks/{id} (a task with its steps and history)

and, apart, how long the counts by state take uncached (the median of 5; the API
keeps them for 2 s, as the dashboard's header polls them).

Each shape reports p50 and p95 in milliseconds, the request's whole round trip.
The target is a p95 under 50 ms on both stores.

Usage: python bench/list_page.py [--tasks 1000000] [--n 200] [--stores sqlite,pg]
Prints one JSON line.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

import common as C
import httpx
import psycopg
from distributed import PG_ADMIN, server_settings, with_database

from sasflow import App
from sasflow.web.app import create_app
from sasflow.web.auth import Users, new_token

sys.path.insert(0, os.path.join(C.HERE, "..", "tests"))
from support.web import serving

START = 1_700_000_000.0  # the first task's created_at; each next one 1 ms later
_FILL = """
INSERT INTO tasks (task_id, workflow, input, state, available_at, created_at, updated_at,
                   version, failure_count, epoch)
SELECT printf('t%09d', g), CASE g % 3 WHEN 0 THEN 'wf-a' WHEN 1 THEN 'wf-b' ELSE 'wf-c' END,
       '{"n": ' || g || '}',
       CASE WHEN g % 100 < 95 THEN 'processed' WHEN g % 100 < 98 THEN 'error'
            ELSE 'pending' END,
       START + g / 1000.0, START + g / 1000.0, START + g / 1000.0 + 1, 'v1', 0, 1
FROM series"""
_SQLITE_SERIES = ("WITH RECURSIVE series(g) AS (SELECT 1 UNION ALL SELECT g + 1 FROM series"
                  " WHERE g < {n})")
_PG_SERIES = "WITH series(g) AS (SELECT generate_series(1, {n}))"


def migrated(url: str) -> None:
    """Open the store once, so its migrations make the schema."""
    app = App(store=url)
    try:
        app.count()
    finally:
        app.close()


def fill_sqlite(path: str, n: int) -> None:
    import sqlite3

    with sqlite3.connect(path) as db:
        db.execute(_SQLITE_SERIES.format(n=n) + _FILL.replace("START", repr(START)))
        db.execute("ANALYZE")


def fill_pg(url: str, n: int) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute((_PG_SERIES.format(n=n) + _FILL.replace("START", repr(START)))
                     .replace("printf('t%09d', g)", "'t' || lpad(g::text, 9, '0')"))
        conn.execute("ANALYZE tasks")


def measure(url: str, n: int, tasks: int) -> dict[str, Any]:
    token, line = new_token("bench", "viewer")
    app = App(store=url)
    headers = {"Authorization": f"Bearer {token}"}
    middle = START + tasks / 2000.0
    shapes = {
        "newest": {"limit": 50},
        "oldest": {"limit": 50, "order": "oldest"},
        "state_error": {"limit": 50, "state": "error"},
        "workflow": {"limit": 50, "workflow": "wf-b", "order": "oldest"},
        "created_range": {"limit": 50, "created_from": _iso(middle),
                          "created_to": _iso(middle + 3600)},
    }
    out: dict[str, Any] = {}
    with serving(create_app(app, Users.parse(line, "bench"))) as base, \
            httpx.Client(base_url=base, headers=headers, timeout=60) as http:
        cursor = None
        for _ in range(20):  # 20 pages down, by the cursor
            page = http.get("/api/v1/tasks", params={"limit": 50, **(
                {"cursor": cursor} if cursor else {})}).json()
            cursor = page["next_cursor"]
        shapes["newest_deep"] = {"limit": 50, "cursor": cursor}
        for name, params in shapes.items():
            out[name] = _timed(lambda p=params: http.get("/api/v1/tasks", params=p), n)
        some = http.get("/api/v1/tasks", params={"limit": 1}).json()["tasks"][0]["task_id"]
        out["one_task"] = _timed(lambda: http.get(f"/api/v1/tasks/{some}"), n)
    # the counts by state scan an index whatever is cached: how long one scan takes
    counts = []
    for _ in range(5):
        t0 = time.perf_counter()
        app.count()
        counts.append(time.perf_counter() - t0)
    out["counts_uncached_ms"] = round(1000 * sorted(counts)[2], 1)
    app.close()
    return out


def _timed(call: Any, n: int) -> dict[str, Any]:
    for _ in range(5):  # warm: the first requests prepare statements and caches
        assert call().status_code == 200
    samples = []
    for _ in range(n):
        t0 = time.perf_counter()
        response = call()
        samples.append(time.perf_counter() - t0)
        assert response.status_code == 200, response.text
    summary = C.lat_summary(samples)
    return {"p50_ms": summary["p50_ms"], "p95_ms": summary["p95_ms"]}


def _iso(ts: float) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(ts, UTC).isoformat()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=1_000_000)
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--stores", default="sqlite,pg")
    a = ap.parse_args()
    result: dict[str, Any] = {"peer": "sasflow", "bench": "list_page", "tasks": a.tasks,
                              "n": a.n, "stores": {}}
    for store in a.stores.split(","):
        t0 = time.perf_counter()
        if store == "sqlite":
            path = os.path.join(C.scratch_dir("list_page"), "list.db")
            C.remove_db(path)
            url = f"sqlite:///{path}"
            migrated(url)
            fill_sqlite(path, a.tasks)
            result["stores"]["sqlite"] = {"fill_s": round(time.perf_counter() - t0, 1),
                                          **measure(url, a.n, a.tasks)}
            C.remove_db(path)
        else:
            db = f"bench_list_{os.getpid()}"
            with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
                conn.execute(f'CREATE DATABASE "{db}"')
            url = with_database(PG_ADMIN, db)
            try:
                migrated(url)
                fill_pg(url, a.tasks)
                result["stores"]["pg"] = {"fill_s": round(time.perf_counter() - t0, 1),
                                          "server": server_settings(),
                                          **measure(url, a.n, a.tasks)}
            finally:
                with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
                    conn.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
    C.emit(result)


if __name__ == "__main__":
    main()
