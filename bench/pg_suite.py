"""The PostgreSQL suite of bench/run.py (``python bench/run.py --suite pg``).

In ONE run, RUNS rounds; every round runs, one after the other (so machine noise
falls on all of them alike):

  1. bench/pgbench.py: pgbench's single-row-update rate on the same server, -c8 and -c1
     (the physical limit);
  2. bench/distributed.py --transport memory, amqp, redis: sasflow on PostgreSQL
     (throughput, latency p50/p95, recovery after SIGKILL);
  3. the peers from ../shared/bench/peers: dbos.py --backend pg, procrastinate.py,
     celery.py; each as two invocations (--phases tp,lat, then --phases crash), as
     the peers' run_all.sh does.

Every script prints one JSON line; they go to RESULTS_DIR/results.jsonl (with
``round`` and ``entry`` added). At the end: markdown tables of the medians across
rounds with the ratios sasflow / each peer and sasflow / pgbench, the peers' own
summarize.py table, and one JSON summary line (also table.md, summary.json).

Environment (all optional):
  RUNS=3                      rounds
  N=5000                      tasks per sasflow throughput measurement
  PG_TRANSPORTS=memory,amqp,redis
  PG_STYLES=sequential,concurrent,presubmitted
  PG_VARIANTS=noop,sleep10ms
  PG_PHASES=tp,lat,crash      sasflow's phases
  AGENT_PROCS=1               agent processes for amqp/redis
  PEERS=dbos,procrastinate,celery   ("" for none)
  PEER_PHASES=tp,lat,crash    the peers' phases
  PEER_N=                     tasks per peer throughput run (default: the peer's own, 1000)
  PEER_PY=/tmp/peer-bench/venv/bin/python
  PEER_DIR=../shared/bench/peers
  PEER_PG_URL=postgresql://postgres@127.0.0.1:5432/postgres   (the peers make their own DBs)
  PEER_REDIS_URL=redis://127.0.0.1:6379/13   (celery.py FLUSHDBs it: not 14, ours, nor 15)
  PGBENCH=1                   0 skips pgbench; PGBENCH_S8=20, PGBENCH_S1=10 seconds
  BENCH_PG_URL, BENCH_AMQP_URL, BENCH_REDIS_URL: see bench/distributed.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any
from urllib.parse import urlsplit

import common as C
from run import PEER_DIR, PEER_PY, fmt, get, merge, ratio, run_script

DIST_TIMEOUT = 960.0  # distributed.py bounds itself to 900 s
PEER_TIMEOUT = 185.0  # the peer scripts bound themselves to < 3 min
PGBENCH_TIMEOUT = 300.0
TARGETS = {"memory": 3000.0, "amqp": 1500.0, "redis": 1500.0}  # completed steps/s, no-op
STYLE_LABEL = {"sequential": "sequential", "concurrent": "concurrent, 256 in flight",
               "presubmitted": "all submitted first"}
TRANSPORT_LABEL = {"memory": "PG + in-process (all roles in one process)",
                   "amqp": "PG + RabbitMQ (agents in another process)",
                   "redis": "PG + Redis (agents in another process)"}
# (label, peer entry, throughput key prefix, latency path)
PEER_ROWS: list[tuple[str, str, str, tuple[str, ...]]] = [
    ("DBOS (pg), direct start_workflow", "dbos", "tp_direct", ("latency_noop", "direct")),
    ("DBOS (pg), queue (poll 1 s)", "dbos", "tp_queue", ("latency_noop", "queue_poll1s")),
    ("procrastinate (pg), 1 worker, concurrency 16", "procrastinate", "tp",
     ("latency_noop",)),
    ("Celery (redis), prefork -c 2", "celery", "tp_prefork2", ("latency_noop",)),
    ("Celery (redis), threads -c 16", "celery", "tp_threads16", ()),
]
PEER_CRASH: list[tuple[str, str, str]] = [
    ("DBOS (pg): new worker started, recovers its executor's workflows", "dbos", "crash"),
    ("procrastinate: new worker + stalled-jobs recipe (30 s)", "procrastinate", "crash"),
    ("Celery: new worker, defaults (acks early)", "celery", "crash_default"),
    ("Celery: new worker, acks_late, visibility 10 s", "celery", "crash_acks_late"),
]


def env_list(name: str, default: str) -> list[str]:
    return [x for x in os.environ.get(name, default).split(",") if x]


def peer_env() -> dict[str, str]:
    redis_url = os.environ.get("PEER_REDIS_URL") or "redis://127.0.0.1:6379/13"
    db = urlsplit(redis_url).path.strip("/") or "0"
    if db in ("14", "15"):
        raise SystemExit(f"PEER_REDIS_URL uses redis db {db}: 14 is sasflow's benchmark's, 15"
                         " the tests'; celery.py FLUSHDBs it, so give it another")
    return {"PEER_PG_URL": os.environ.get("PEER_PG_URL")
            or "postgresql://postgres@127.0.0.1:5432/postgres",
            "PEER_REDIS_URL": redis_url,
            "PEER_TMP": os.environ.get("PEER_TMP") or C.scratch_dir("peer")}


def entries() -> list[tuple[str, list[str], float, dict[str, str] | None]]:
    """What one round runs, in order: (entry name, command, timeout, extra env)."""
    py = sys.executable
    out: list[tuple[str, list[str], float, dict[str, str] | None]] = []
    if os.environ.get("PGBENCH", "1") != "0":
        out.append(("pgbench", [py, os.path.join(C.HERE, "pgbench.py"),
                                "--seconds-c8", os.environ.get("PGBENCH_S8", "20"),
                                "--seconds-c1", os.environ.get("PGBENCH_S1", "10")],
                    PGBENCH_TIMEOUT, None))
    for transport in env_list("PG_TRANSPORTS", "memory,amqp,redis"):
        out.append((f"sasflow-{transport}", [
            py, os.path.join(C.HERE, "distributed.py"), "--transport", transport,
            "--n", os.environ.get("N", "5000"),
            "--phases", os.environ.get("PG_PHASES", "tp,lat,crash"),
            "--styles", os.environ.get("PG_STYLES", "sequential,concurrent,presubmitted"),
            "--variants", os.environ.get("PG_VARIANTS", "noop,sleep10ms"),
            "--agent-procs", os.environ.get("AGENT_PROCS", "1")], DIST_TIMEOUT, None))
    peers = env_list("PEERS", "dbos,procrastinate,celery")
    if not peers:
        return out
    if not os.path.exists(PEER_PY):
        raise SystemExit(f"no peer Python at {PEER_PY} (set PEER_PY, or PEERS= to skip the"
                         " peers; bench/README.md says how to make one)")
    env = peer_env()
    phases = env_list("PEER_PHASES", "tp,lat,crash")
    groups = [p for p in (",".join(x for x in phases if x != "crash"),
                          "crash" if "crash" in phases else "") if p]
    extra = {"dbos": ["--backend", "pg"], "procrastinate": [], "celery": []}
    for peer in peers:
        if peer not in extra:
            raise SystemExit(f"unknown peer {peer!r}: choose from {', '.join(extra)}")
        script = os.path.join(PEER_DIR, f"{peer}.py")
        if not os.path.exists(script):
            raise SystemExit(f"no peer script at {script} (set PEER_DIR)")
        for group in groups:
            cmd = [PEER_PY, script, *extra[peer], "--phases", group]
            if os.environ.get("PEER_N") and group != "crash":
                cmd += ["--n", os.environ["PEER_N"]]
            out.append((f"{peer}-{'crash' if group == 'crash' else 'tp'}", cmd,
                        PEER_TIMEOUT, env))
    return out


# ---------------------------------------------------------------- one run
def main() -> None:
    runs = int(os.environ.get("RUNS", "3"))
    plan = entries()
    results = C.scratch_dir("results", "pg-" + time.strftime("%Y%m%d-%H%M%S"))
    jsonl = os.path.join(results, "results.jsonl")
    print(f"results -> {results}", file=sys.stderr)
    for r in range(1, runs + 1):
        for name, cmd, timeout, env in plan:
            log = os.path.join(results, f"{name}-r{r}.log")
            started = time.monotonic()
            try:
                result = run_script(cmd, log, timeout, env=env)
            except Exception as error:  # keep the other entries going
                result = {"error": repr(error)}
            result.setdefault("peer", name.split("-")[0])
            result["entry"], result["round"] = name, r
            result["took_s"] = round(time.monotonic() - started, 1)
            with open(jsonl, "a") as f:
                f.write(json.dumps(result) + "\n")
    report(jsonl)


# ---------------------------------------------------------------- the tables
def load(jsonl: str) -> dict[str, list[dict[str, Any]]]:
    by_entry: dict[str, list[dict[str, Any]]] = {}
    with open(jsonl) as f:
        for line in f:
            if line.startswith("{"):
                result = json.loads(line)
                by_entry.setdefault(result.get("entry", "?"), []).append(result)
    return by_entry


def medians(by_entry: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Median per entry across rounds; a peer's tp and crash invocations merged."""
    merged: dict[str, Any] = {}
    for name, values in by_entry.items():
        m = merge([{k: v for k, v in x.items() if k not in ("round", "took_s")}
                   for x in values])
        key = name.rsplit("-", 1)[0] if name.endswith(("-tp", "-crash")) else name
        merged[key] = {**m, **merged.get(key, {})}  # the tp line first: its n, version
    return merged


def tables(m: dict[str, Any], runs: int) -> tuple[str, dict[str, Any]]:
    pg = m.get("pgbench") or {}
    c8, c1 = pg.get("step_update_c8_tps"), pg.get("step_update_c1_tps")
    transports = [t for t in ("memory", "amqp", "redis") if f"sasflow-{t}" in m]
    styles = ["sequential", "concurrent", "presubmitted"]
    any_ours: dict[str, Any] = next((m[f"sasflow-{t}"] for t in transports), {})
    out = [f"## sasflow on PostgreSQL beside its peers (median of {runs} round(s); "
           "same machine, same run, interleaved)", "",
           f"Server: PostgreSQL {get(pg, 'server', 'server_version') or '?'}, "
           f"fsync={get(pg, 'server', 'fsync') or '?'}, "
           f"synchronous_commit={get(pg, 'server', 'synchronous_commit') or '?'}. "
           f"sasflow: N={any_ours.get('n', '—')} tasks per throughput run, scheduler "
           f"concurrency {get(any_ours, 'settings', 'concurrency') or '—'}, a fresh database "
           "per measurement; with RabbitMQ/Redis the agents run in "
           f"{get(m, 'sasflow-amqp', 'settings', 'agent_procs') or 1} separate "
           "`sasflow worker --roles agent` process(es), scheduler and supervisor in the bench "
           f"process. Peers: N={get(m, 'dbos', 'n') or '—'}, their own settings.", "",
           "### physical limit: pgbench, one single-row UPDATE per transaction", "",
           "| clients | tps |", "|---:|---:|",
           f"| 8 (-c8 -j2) | {fmt(c8)} |", f"| 1 | {fmt(c1)} |", "",
           "### throughput and latency", "",
           "| system | submission | steps/s noop | steps/s 10 ms | wf/s noop | wf/s 10 ms "
           "| p50 ms | p95 ms |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    ratios: dict[str, Any] = {}

    def tp_key(style: str, variant: str) -> str:
        return "tp" + (f"_{style}" if style != "sequential" else "") + f"_{variant}"

    for t in transports:
        ours = m[f"sasflow-{t}"]
        for style in styles:
            noop, ten = ours.get(tp_key(style, "noop")), ours.get(tp_key(style, "sleep10ms"))
            if noop is None and ten is None and style != "sequential":
                continue
            lat = ours.get("latency_noop") if style == "sequential" else None
            out.append(f"| sasflow, {TRANSPORT_LABEL[t]} | {STYLE_LABEL[style]} | "
                       f"{fmt(get(noop, 'steps_per_s'))} | {fmt(get(ten, 'steps_per_s'))} | "
                       f"{fmt(get(noop, 'wf_per_s'))} | {fmt(get(ten, 'wf_per_s'))} | "
                       f"{fmt(get(lat, 'p50_ms'))} | {fmt(get(lat, 'p95_ms'))} |")
    for label, peer, prefix, latp in PEER_ROWS:
        p = m.get(peer)
        if p is None:
            continue
        lat = get(p, *latp) if latp else None
        out.append(f"| {label} | sequential | {fmt(get(p, f'{prefix}_noop', 'steps_per_s'))} | "
                   f"{fmt(get(p, f'{prefix}_sleep10ms', 'steps_per_s'))} | "
                   f"{fmt(get(p, f'{prefix}_noop', 'wf_per_s'))} | "
                   f"{fmt(get(p, f'{prefix}_sleep10ms', 'wf_per_s'))} | "
                   f"{fmt(get(lat, 'p50_ms'))} | {fmt(get(lat, 'p95_ms'))} |")

    # ratios of completed steps/s (no-op steps): ours / pgbench, ours / each peer
    peers = [(label, peer, prefix) for label, peer, prefix, _ in PEER_ROWS if peer in m]
    out += ["", "### ratios: sasflow's completed steps/s (no-op) ÷ the others'", "",
            "| sasflow | submission | steps/s | target | met | ÷ pgbench c8 | "
            + " | ".join(f"÷ {label}" for label, _, _ in peers) + " |",
            "|---|---|---:|---:|---|---:|" + "---:|" * len(peers)]
    for t in transports:
        ours = m[f"sasflow-{t}"]
        for style in styles:
            steps = get(ours, tp_key(style, "noop"), "steps_per_s")
            if steps is None:
                continue
            row = {"steps_per_s": steps, "target": TARGETS[t],
                   "met": isinstance(steps, int | float) and steps >= TARGETS[t],
                   "over_pgbench_c8": ratio(steps, c8)}
            cells = []
            for _, peer, prefix in peers:
                r = ratio(steps, get(m, peer, f"{prefix}_noop", "steps_per_s"))
                row[f"over_{peer}_{prefix}"] = r
                cells.append(fmt(r))
            ratios[f"{t}_{style}"] = row
            out.append(f"| {TRANSPORT_LABEL[t]} | {STYLE_LABEL[style]} | {fmt(steps)} | "
                       f"≥ {TARGETS[t]:,.0f} | {'yes' if row['met'] else 'no'} | "
                       f"{fmt(row['over_pgbench_c8'])} | " + " | ".join(cells) + " |")

    lat_peers = [(label, peer, latp) for label, peer, _, latp in PEER_ROWS
                 if peer in m and latp]
    out += ["", "### ratios: sasflow's single-task latency ÷ the others' (p50 / p95; "
            "lower is better)", "",
            "| sasflow | p50 ms | p95 ms | " + " | ".join(f"÷ {label}" for label, _, _ in
                                                       lat_peers) + " |",
            "|---|---:|---:|" + "---:|" * len(lat_peers)]
    for t in transports:
        lat = m[f"sasflow-{t}"].get("latency_noop") or {}
        cells = []
        for _, peer, latp in lat_peers:
            theirs = get(m, peer, *latp) or {}
            p50 = ratio(lat.get("p50_ms"), theirs.get("p50_ms"))
            p95 = ratio(lat.get("p95_ms"), theirs.get("p95_ms"))
            ratios.setdefault(f"{t}_latency", {})[f"over_{peer}_{'_'.join(latp)}"] = [p50, p95]
            cells.append(f"{fmt(p50)} / {fmt(p95)}")
        out.append(f"| {TRANSPORT_LABEL[t]} | {fmt(lat.get('p50_ms'))} | "
                   f"{fmt(lat.get('p95_ms'))} | " + " | ".join(cells) + " |")

    out += ["", "### recovery after SIGKILL", "",
            "| system | recovery s (from kill) | released s (from kill) | bound s "
            "(+ step-2 re-run) | within | lost | duplicated | how |",
            "|---|---:|---:|---:|---|---:|---:|---|"]
    for t in transports:
        c = m[f"sasflow-{t}"].get("crash") or {}
        within = c.get("released_within_bound"), c.get("recovered_within_total")
        out.append(f"| sasflow, {TRANSPORT_LABEL[t]} | {fmt(c.get('recovery_s_from_kill'))} | "
                   f"{fmt(c.get('released_s_from_kill'))} | {fmt(c.get('target_bound_s'))} "
                   f"({fmt(c.get('target_total_s'))}) | released: {fmt(within[0])}, "
                   f"done: {fmt(within[1])} | {fmt(c.get('lost'))} | "
                   f"{fmt(c.get('duplicated'))} | "
                   f"{c.get('settings', c.get('error', ''))} |")
    for label, peer, key in PEER_CRASH:
        c = get(m, peer, key)
        if c is None:
            continue
        out.append(f"| {label} | {fmt(c.get('recovery_s_from_kill'))} | — | — | — | "
                   f"{fmt(c.get('lost'))} | {fmt(c.get('duplicated'))} | "
                   f"{c.get('settings', c.get('error', ''))} |")
    errors = [f"{name}: {fmt(v.get('error'))}" for name, v in m.items()
              if isinstance(v, dict) and v.get("error")]
    if errors:
        out += ["", "Errors: " + "; ".join(errors)]
    return "\n".join(out), ratios


def report(jsonl: str) -> None:
    """Medians across rounds -> table.md, summary.json beside `jsonl`; print both."""
    results = os.path.dirname(os.path.abspath(jsonl))
    by_entry = load(jsonl)
    runs = max(len(v) for v in by_entry.values()) if by_entry else 0
    merged = medians(by_entry)
    table, ratios = tables(merged, runs)
    summarize = os.path.join(PEER_DIR, "summarize.py")
    if os.path.exists(summarize):
        p = subprocess.run([sys.executable, summarize, jsonl], capture_output=True, text=True,
                           timeout=60)
        table += ("\n\n### in the peers' table format (../shared/bench/peers/summarize.py; "
                  "its sasflow (pg) row is the in-process transport)\n\n" + p.stdout.strip())
    summary = {"bench": "sasflow-pg", "runs": runs, "results_dir": results,
               "medians": merged, "ratios": ratios}
    with open(os.path.join(results, "table.md"), "w") as f:
        f.write(table + "\n")
    with open(os.path.join(results, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    print(table)
    print()
    C.emit({k: v for k, v in summary.items() if k != "medians"})
