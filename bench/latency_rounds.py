"""One task's latency, sasflow over RabbitMQ and Redis beside Celery and DBOS, in rounds.

The latency of bench/distributed.py (``--phases lat``: wf3, 3 no-op steps, 100
single tasks one at a time, submit -> terminal state seen by the client, agents
in another process, PostgreSQL store) for each transport, then the peers'
latency (../shared/bench/peers: celery.py, prefork -c 2 over Redis, or with
RabbitMQ as its broker as ``celery-rabbitmq``; dbos.py --backend pg, direct
start_workflow), one after the other, ROUNDS times: the
machine's noise falls on all of them alike. With --compare-src LABEL=DIR (one
or more, comma-separated), the sasflow source tree in DIR (an older commit's
``src``, beside its ``bench``) is measured too, right before this one, in every
round, as ``sasflow-LABEL``.

Prints one JSON line per measurement as it ends (``round``, ``entry``,
``p50_ms``, ``p95_ms``, ``load1``: the 1-minute load average when it started),
then a markdown table of the medians across rounds and one JSON summary line.

Usage: python bench/latency_rounds.py [--rounds 3] [--transports amqp,redis]
           [--peers celery,dbos[,celery-rabbitmq]] [--compare-src old=/path/to/old/src]
           [--lat-n 100]
Environment: PEER_PY (a Python with celery and dbos) and PEER_DIR, as for
bench/run.py; PEER_PG_URL (default
postgresql://postgres@127.0.0.1:5432/postgres), PEER_REDIS_URL (default
redis://127.0.0.1:6379/13: celery.py FLUSHDBs it), and bench/distributed.py's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from typing import Any

import common as C
from run import PEER_DIR, PEER_PY

PEER_ENV = {"PEER_PG_URL": "postgresql://postgres@127.0.0.1:5432/postgres",
            "PEER_REDIS_URL": "redis://127.0.0.1:6379/13"}
TIMEOUT_S = 185.0
AMQP_URL = "amqp://guest:guest@127.0.0.1:5672//"
# the peers' latency runs: (script arguments, where p50/p95 are in its JSON line, and
# what the script's environment adds)
PEERS: dict[str, tuple[list[str], tuple[str, ...], dict[str, str]]] = {
    "celery": (["celery.py", "--phases", "lat"], ("latency_noop",), {}),
    # the same chains with RabbitMQ as Celery's broker (results still in Redis): its
    # Settings.broker_url reads CELERY_BROKER_URL before the app's own; the broker
    # beside sasflow's own RabbitMQ row
    "celery-rabbitmq": (["celery.py", "--phases", "lat"], ("latency_noop",),
                        {"CELERY_BROKER_URL": AMQP_URL}),
    "dbos": (["dbos.py", "--backend", "pg", "--phases", "lat", "--lat-queue-n", "0"],
             ("latency_noop", "direct"), {}),
}


def load1() -> float:
    return os.getloadavg()[0]


def run_json(cmd: list[str], env: dict[str, str], cwd: str) -> dict[str, Any]:
    """The last JSON line `cmd` prints (an error entry if none)."""
    try:
        done = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True,
                              timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {TIMEOUT_S:g}s"}
    for line in reversed(done.stdout.splitlines()):
        if line.startswith("{"):
            return dict(json.loads(line))
    return {"error": f"rc={done.returncode}: {done.stderr[-400:]}"}


def dig(result: dict[str, Any], path: tuple[str, ...]) -> dict[str, Any]:
    for key in path:
        result = result.get(key) or {}
    return result


def sasflow(transport: str, src: str | None, lat_n: int) -> dict[str, Any]:
    env = dict(os.environ)
    if src:  # the older tree's bench scripts with its own package
        env["PYTHONPATH"] = src
        script = os.path.join(os.path.dirname(src), "bench", "distributed.py")
    else:
        script = os.path.join(C.HERE, "distributed.py")
    result = run_json([sys.executable, script, "--transport", transport, "--phases", "lat",
                       "--lat-n", str(lat_n)], env, os.path.dirname(script))
    return result.get("latency_noop") or result


def peer(name: str) -> dict[str, Any]:
    args, path, extra = PEERS[name]
    env = {**PEER_ENV, **os.environ, **extra}
    result = run_json([PEER_PY, *args], env, PEER_DIR)
    return dig(result, path) if "error" not in result else result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--transports", default="amqp,redis")
    ap.add_argument("--peers", default="celery,dbos")
    ap.add_argument("--compare-src", default="",
                    help="LABEL=DIR,...: older sasflow src trees to measure too")
    ap.add_argument("--lat-n", type=int, default=100)
    a = ap.parse_args()
    entries: list[tuple[str, Any]] = []
    trees = [item.split("=", 1) for item in a.compare_src.split(",") if item]
    for transport in [t for t in a.transports.split(",") if t]:
        for label, tree in trees:
            entries.append((f"sasflow-{label} {transport}", lambda t=transport, d=tree: sasflow(
                t, os.path.abspath(d), a.lat_n)))
        entries.append((f"sasflow {transport}", lambda t=transport: sasflow(t, None, a.lat_n)))
    for name in [p for p in a.peers.split(",") if p]:
        entries.append((name, lambda n=name: peer(n)))
    rows: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in entries}
    for round_no in range(1, a.rounds + 1):
        for name, measure in entries:
            load = load1()
            result = measure()
            line = {"round": round_no, "entry": name, "load1": round(load, 2),
                    **{k: result.get(k) for k in ("p50_ms", "p95_ms", "error")
                       if k in result}}
            rows[name].append(line)
            print(json.dumps(line), flush=True)
    print("\n| entry | p50 ms (median of rounds) | p95 ms | p50 each round | load1 each round |")
    print("|---|---|---|---|---|")
    summary: dict[str, Any] = {}
    for name, lines in rows.items():
        p50s = [x["p50_ms"] for x in lines if x.get("p50_ms") is not None]
        p95s = [x["p95_ms"] for x in lines if x.get("p95_ms") is not None]
        if not p50s:
            print(f"| {name} | failed | | | |")
            continue
        summary[name] = {"p50_ms": statistics.median(p50s), "p95_ms": statistics.median(p95s),
                         "rounds": len(p50s)}
        print(f"| {name} | {statistics.median(p50s):.1f} | {statistics.median(p95s):.1f} | "
              f"{', '.join(f'{x:.1f}' for x in p50s)} | "
              f"{', '.join(str(x['load1']) for x in lines)} |")
    print(json.dumps({"bench": "latency_rounds", "medians": summary}))


if __name__ == "__main__":
    main()
