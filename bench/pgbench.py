"""The physical limit on PostgreSQL: pgbench's single-row-update rate, same server.

The peers' baseline (../shared/bench/peers/baseline/pgbench_baseline.sh): a table
``step_state`` of 100,000 rows, and one committed transaction per
``UPDATE step_state SET state = 'done', attempts = attempts + 1, updated_at = now()
WHERE id = :id`` (random id), run by pgbench with 8 clients (-c8 -j2) and with 1
client (-c1). Here on a scratch database (``bench_pgbench_<pid>``, dropped after),
and as one JSON line: ``step_update_c8_tps``, ``step_update_c1_tps``, plus the
server's fsync / synchronous_commit so the figure says what a commit costs.

Usage: python bench/pgbench.py [--seconds-c8 20] [--seconds-c1 10]
Env: BENCH_PG_URL (admin connection, default postgresql://postgres@127.0.0.1:5432/postgres),
     PGBENCH (the pgbench binary; default the one on PATH, else PostgreSQL 15's).
Prints one JSON line.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import tempfile
from typing import Any
from urllib.parse import urlsplit

import common as C
import psycopg
from distributed import PG_ADMIN, assert_loopback, server_settings, with_database

STEP_UPDATE = ("\\set id random(1, 100000)\n"
               "UPDATE step_state SET state = 'done', attempts = attempts + 1,"
               " updated_at = now() WHERE id = :id;\n")
SCHEMA = (
    "CREATE TABLE step_state(id int primary key, state text not null,"
    " attempts int not null default 0, updated_at timestamptz not null default now());"
    "INSERT INTO step_state(id, state) SELECT g, 'pending' FROM generate_series(1,100000) g;")


def pgbench_binary() -> str:
    return (os.environ.get("PGBENCH") or shutil.which("pgbench")
            or "/usr/lib/postgresql/15/bin/pgbench")


def run_pgbench(db_url: str, script: str, clients: int, seconds: float) -> dict[str, Any]:
    parts = urlsplit(db_url)
    env = {**os.environ, "PGHOST": parts.hostname or "127.0.0.1",
           "PGPORT": str(parts.port or 5432), "PGUSER": parts.username or "postgres"}
    cmd = [pgbench_binary(), "-n", "-c", str(clients), "-j", str(min(clients, 2)),
           "-T", str(int(seconds)), "-f", script, parts.path.lstrip("/")]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=seconds + 60)
    found = re.search(r"^tps = ([0-9.]+)", p.stdout, re.MULTILINE)
    if p.returncode != 0 or not found:
        return {"error": f"rc={p.returncode}", "stderr_tail": p.stderr[-400:]}
    return {"tps": round(float(found.group(1)), 1), "clients": clients, "seconds": seconds}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds-c8", type=float, default=20.0)
    ap.add_argument("--seconds-c1", type=float, default=10.0)
    a = ap.parse_args()
    assert_loopback(PG_ADMIN)
    db = f"bench_pgbench_{os.getpid()}"
    url = with_database(PG_ADMIN, db)
    settings = server_settings()
    out: dict[str, Any] = {"peer": "pgbench", "backend": "pg", "bench": "pgbench",
                           "server": settings,
                           "workload": "one single-row UPDATE per committed transaction "
                                       "(the peers' step_update.sql), 100k-row table"}
    with tempfile.TemporaryDirectory(prefix="sasflow-pgbench-") as tmp:
        script = os.path.join(tmp, "step_update.sql")
        with open(script, "w") as f:
            f.write(STEP_UPDATE)
        with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{db}"')
        try:
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute(SCHEMA)
                conn.execute("VACUUM ANALYZE step_state")
            c8 = run_pgbench(url, script, 8, a.seconds_c8)
            c1 = run_pgbench(url, script, 1, a.seconds_c1)
        finally:
            with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
    out["step_update_c8"] = c8
    out["step_update_c1"] = c1
    out["step_update_c8_tps"] = c8.get("tps")
    out["step_update_c1_tps"] = c1.get("tps")
    C.emit(out)


if __name__ == "__main__":
    main()
