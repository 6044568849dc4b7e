"""Run every sasflow benchmark and, side by side in the same run, the DBOS-on-SQLite peer.

Each round runs bench/throughput.py, latency.py, recovery.py and sweep.py, then
the peer (`$PEER_PY ../shared/bench/peers/dbos.py --backend sqlite --phases tp,lat
--modes direct,queue`). Every script prints one JSON line; they are collected in
RESULTS_DIR/results.jsonl (the format ../shared/bench/peers/summarize.py reads).
At the end: a markdown table with medians across rounds, sasflow beside DBOS and
the ratio sasflow/DBOS, then one JSON summary line (also written to
RESULTS_DIR/summary.json and table.md).

Environment (all optional):
  RUNS=3                  rounds (medians across them)
  N=5000                  tasks per throughput measurement
  SWEEP_SIZES=100000,1000000
  PEER_PY=/tmp/peer-bench/venv/bin/python   a Python with dbos installed; if it is
                          missing the peer is skipped and the output says so
  PEER_DIR=../shared/bench/peers            where dbos.py lives
  PEER_TMP=<scratch>/peer                   the peer's scratch dir
  PEER_N=                 tasks per peer throughput run (default: the peer's own, 1000)
  SASFLOW_BENCH_TMP=<tmp>/sasflow-bench     scratch dir for everything
Usage: python bench/run.py   (or: make bench; the same as --suite sqlite)
       python bench/run.py --suite pg   (PostgreSQL with the in-process, RabbitMQ and
                                         Redis transports beside DBOS-on-PostgreSQL,
                                         procrastinate, Celery and pgbench: pg_suite.py)
       python bench/run.py --table RESULTS_DIR/results.jsonl   (the table again)
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

import common as C

ROOT = os.path.dirname(C.HERE)
PEER_DIR = os.environ.get("PEER_DIR") or os.path.normpath(
    os.path.join(ROOT, "..", "shared", "bench", "peers"))
PEER_PY = os.environ.get("PEER_PY") or "/tmp/peer-bench/venv/bin/python"
SCRIPT_TIMEOUT = 900.0
PEER_TIMEOUT = 185.0  # the peer scripts bound themselves to < 3 min
COUNTS = {"lost", "duplicated", "not_processed", "completed", "recovered",
          "still_expired_after", "held_by_killed_worker_at_kill", "effects_done_at_kill",
          "step_starts"}


def run_script(cmd: list[str], log: str, timeout: float,
               env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run one benchmark script; its JSON line, or an error naming the log."""
    started = time.monotonic()
    print(f"[{time.strftime('%H:%M:%S')}] {' '.join(os.path.basename(c) for c in cmd[:3])}"
          " ...", file=sys.stderr, flush=True)
    try:
        with open(log, "w") as err:
            p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=err, text=True,
                               timeout=timeout, env={**os.environ, **(env or {})})
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f}s (log: {log})"}
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    print(f"[{time.strftime('%H:%M:%S')}]   rc={p.returncode} "
          f"({time.monotonic() - started:.0f} s)", file=sys.stderr, flush=True)
    if not lines:
        return {"error": f"rc={p.returncode}, no JSON line (log: {log})"}
    result: dict[str, Any] = json.loads(lines[-1])
    return result


# ---------------------------------------------------------------- medians across rounds
def merge(values: list[Any], key: str = "") -> Any:
    """Median of numbers; dicts merged key by key; counts listed per round if they differ."""
    present = [v for v in values if v is not None]
    if not present:
        return None
    if all(isinstance(v, dict) for v in present):
        keys = list(dict.fromkeys(k for v in present for k in v))
        return {k: merge([v.get(k) for v in present], k) for k in keys}
    numbers = [v for v in present if isinstance(v, int | float) and not isinstance(v, bool)]
    if len(numbers) == len(present) and len(values) == len(present):
        if key in COUNTS:
            return numbers[0] if len(set(numbers)) == 1 else numbers
        median = statistics.median(numbers)
        return round(median, 3) if isinstance(median, float) else median
    texts = [json.dumps(v, sort_keys=True) for v in values]
    return values[0] if len(set(texts)) == 1 else values


def get(d: Any, *path: str) -> Any:
    for k in path:
        if not isinstance(d, dict) or k not in d:
            return None
        d = d[k]
    return d


def ratio(a: Any, b: Any) -> float | None:
    if isinstance(a, int | float) and isinstance(b, int | float) and b:
        return float(f"{a / b:.3g}")
    return None


# ---------------------------------------------------------------- the table
def fmt(v: Any) -> str:
    if v is None:
        return "—"
    if isinstance(v, float):
        return f"{v:,.1f}" if abs(v) >= 10 else f"{v:.3g}"
    if isinstance(v, list):
        return "/".join(fmt(x) for x in v)
    return str(v)


def tables(s: dict[str, Any], d: dict[str, Any] | None, runs: int) -> tuple[str, dict[str, Any]]:
    tp, lat = s.get("throughput") or {}, s.get("latency") or {}
    n = tp.get("n")
    out = [f"## sasflow vs DBOS on SQLite (median of {runs} round(s); same machine, same run)",
           "",
           f"sasflow: N={n} tasks per throughput run, roles in-process "
           f"(scheduler concurrency {get(tp, 'settings', 'concurrency')}). "
           f"DBOS {get(d, 'version') or ''}: N={get(d, 'n') or '—'}, its own sqlite settings "
           "(rollback journal, synchronous=FULL: SQLite's default).",
           "",
           "| system | submission | durability | wf/s noop | wf/s 10 ms | steps/s noop "
           "| steps/s 10 ms | p50 ms | p95 ms |",
           "|---|---|---|---:|---:|---:|---:|---:|---:|"]

    def row(system: str, how: str, durability: str, tp_noop: Any, tp_10: Any,
            latency: Any) -> None:
        out.append(f"| {system} | {how} | {durability} | {fmt(get(tp_noop, 'wf_per_s'))} | "
                   f"{fmt(get(tp_10, 'wf_per_s'))} | {fmt(get(tp_noop, 'steps_per_s'))} | "
                   f"{fmt(get(tp_10, 'steps_per_s'))} | {fmt(get(latency, 'p50_ms'))} | "
                   f"{fmt(get(latency, 'p95_ms'))} |")

    row("sasflow", "sequential", "WAL, NORMAL", tp.get("tp_noop"), tp.get("tp_sleep10ms"),
        lat.get("latency_noop"))
    row("sasflow", "sequential", "WAL, FULL", tp.get("tp_full_noop"),
        tp.get("tp_full_sleep10ms"), lat.get("latency_full_noop"))
    row("sasflow", "concurrent, 256 in flight", "WAL, NORMAL", tp.get("tp_concurrent_noop"),
        tp.get("tp_concurrent_sleep10ms"), None)
    row("sasflow", "concurrent, 256 in flight", "WAL, FULL", tp.get("tp_full_concurrent_noop"),
        tp.get("tp_full_concurrent_sleep10ms"), None)
    row("sasflow", "all submitted first (roles alone)", "WAL, NORMAL",
        tp.get("tp_presubmitted_noop"), tp.get("tp_presubmitted_sleep10ms"), None)
    row("sasflow", "all submitted first (roles alone)", "WAL, FULL",
        tp.get("tp_full_presubmitted_noop"), tp.get("tp_full_presubmitted_sleep10ms"), None)
    ratios: dict[str, Any] = {}
    if d is not None and "skipped" not in d:
        row("dbos", "direct start_workflow", "rollback journal, FULL", d.get("tp_direct_noop"),
            d.get("tp_direct_sleep10ms"), get(d, "latency_noop", "direct"))
        row("dbos", "queue, poll 1 s", "rollback journal, FULL", d.get("tp_queue_noop"),
            d.get("tp_queue_sleep10ms"), get(d, "latency_noop", "queue_poll1s"))
        lines = [
            ("steps/s noop, sequential, NORMAL", ("tp_noop",), "tp_{}_noop", "steps_per_s"),
            ("steps/s noop, sequential, FULL", ("tp_full_noop",), "tp_{}_noop", "steps_per_s"),
            ("steps/s 10 ms, sequential, NORMAL", ("tp_sleep10ms",), "tp_{}_sleep10ms",
             "steps_per_s"),
            ("steps/s 10 ms, sequential, FULL", ("tp_full_sleep10ms",), "tp_{}_sleep10ms",
             "steps_per_s"),
            ("steps/s noop, concurrent, NORMAL", ("tp_concurrent_noop",), "tp_{}_noop",
             "steps_per_s"),
            ("steps/s noop, concurrent, FULL", ("tp_full_concurrent_noop",), "tp_{}_noop",
             "steps_per_s"),
            ("latency p50, NORMAL (lower is better)", ("latency_noop",), "", "p50_ms"),
            ("latency p50, FULL (lower is better)", ("latency_full_noop",), "", "p50_ms"),
        ]
        out += ["", "| sasflow / DBOS | vs DBOS direct | vs DBOS queue |", "|---|---:|---:|"]
        for label, ours, theirs, field in lines:
            mine = get(tp if ours[0].startswith("tp") else lat, *ours, field)
            if theirs:
                other = {m: get(d, theirs.format(m), field) for m in ("direct", "queue")}
            else:
                other = {"direct": get(d, "latency_noop", "direct", field),
                         "queue": get(d, "latency_noop", "queue_poll1s", field)}
            r = {m: ratio(mine, other[m]) for m in other}
            ratios[label] = r
            out.append(f"| {label} | {fmt(r['direct'])} | {fmt(r['queue'])} |")
    else:
        out += ["", f"DBOS peer skipped: {get(d, 'skipped')}"]
    crash = get(s, "recovery", "crash") or {}
    out += ["", "### recovery after SIGKILL (one of two workers killed, not restarted)", "",
            "| recovery s (from kill) | released s (from kill) | target bound s "
            "| lost | duplicated | settings |", "|---:|---:|---:|---:|---:|---|",
            f"| {fmt(crash.get('recovery_s_from_kill'))} | "
            f"{fmt(crash.get('released_s_from_kill'))} | {fmt(crash.get('target_bound_s'))} "
            f"({fmt(get(crash, 'target_total_s'))} with the re-run) | "
            f"{fmt(crash.get('lost'))} | {fmt(crash.get('duplicated'))} | "
            f"{crash.get('settings', crash.get('error', ''))} |"]
    out += ["", "### supervisor sweep", "",
            "| tasks | expired | sweep s (1% expired) | µs per expired task "
            "| expired() ms, none expired | sweep ms, none expired | build s |",
            "|---:|---:|---:|---:|---:|---:|---:|"]
    for label, v in (get(s, "sweep", "sweep") or {}).items():
        out.append(f"| {label} | {fmt(v.get('expired'))} | "
                   f"{fmt(get(v, 'expired_1pct', 'sweep_s'))} | "
                   f"{fmt(get(v, 'expired_1pct', 'per_expired_us'))} | "
                   f"{fmt(get(v, 'none_expired', 'expired_query_ms'))} | "
                   f"{fmt(get(v, 'none_expired', 'sweep_ms'))} | {fmt(v.get('build_s'))} |")
    return "\n".join(out), ratios


# ---------------------------------------------------------------- main
def main() -> None:
    runs = int(os.environ.get("RUNS", "3"))
    n = os.environ.get("N", "5000")
    sizes = os.environ.get("SWEEP_SIZES", "100000,1000000")
    results = C.scratch_dir("results", time.strftime("%Y%m%d-%H%M%S"))
    jsonl = os.path.join(results, "results.jsonl")
    py = sys.executable
    sasflow: dict[str, list[dict[str, Any]]] = {
        "throughput": [], "latency": [], "recovery": [], "sweep": []}
    peer: list[dict[str, Any]] = []
    peer_script = os.path.join(PEER_DIR, "dbos.py")
    skip_peer = None
    if not os.path.exists(PEER_PY):
        skip_peer = (f"no peer Python at {PEER_PY} (set PEER_PY; bench/README.md says how to"
                     " make one)")
    elif not os.path.exists(peer_script):
        skip_peer = f"no peer script at {peer_script} (set PEER_DIR)"
    peer_env = {"PEER_TMP": os.environ.get("PEER_TMP") or C.scratch_dir("peer")}
    print(f"results -> {results}", file=sys.stderr)
    for r in range(1, runs + 1):
        scripts = {
            "throughput": ["throughput.py", "--n", n],
            "latency": ["latency.py"],
            "recovery": ["recovery.py"],
            "sweep": ["sweep.py", "--sizes", sizes, "--runs", "1"],
        }
        for name, args in scripts.items():
            cmd = [py, os.path.join(C.HERE, args[0]), *args[1:]]
            result = run_script(cmd, os.path.join(results, f"{name}-r{r}.log"),
                                SCRIPT_TIMEOUT)
            result.setdefault("peer", "sasflow")
            result.setdefault("bench", name)
            sasflow[name].append(result)
            with open(jsonl, "a") as f:
                f.write(json.dumps(result) + "\n")
        if skip_peer is None:
            cmd = [PEER_PY, peer_script, "--backend", "sqlite", "--phases", "tp,lat",
                   "--modes", "direct,queue"]
            if os.environ.get("PEER_N"):
                cmd += ["--n", os.environ["PEER_N"]]
            result = run_script(cmd, os.path.join(results, f"dbos-sqlite-r{r}.log"),
                                PEER_TIMEOUT, env=peer_env)
            result.setdefault("peer", "dbos")
            peer.append(result)
            with open(jsonl, "a") as f:
                f.write(json.dumps(result) + "\n")
    report(sasflow, peer, skip_peer, runs, jsonl)


def load(jsonl: str) -> None:
    """Make the table and summary again from a results.jsonl written by a run."""
    sasflow: dict[str, list[dict[str, Any]]] = {}
    peer: list[dict[str, Any]] = []
    with open(jsonl) as f:
        for line in f:
            if line.startswith("{"):
                result = json.loads(line)
                if result.get("peer") == "sasflow":
                    sasflow.setdefault(result.get("bench", "?"), []).append(result)
                elif result.get("peer") == "dbos":
                    peer.append(result)
    runs = max([len(v) for v in sasflow.values()] + [len(peer)])
    report(sasflow, peer, "not in the results file", runs, os.path.abspath(jsonl))


def report(sasflow: dict[str, list[dict[str, Any]]], peer: list[dict[str, Any]],
           skip_peer: str | None, runs: int, jsonl: str) -> None:
    """Medians across rounds -> table.md, summary.json beside `jsonl`; print both."""
    results = os.path.dirname(jsonl)
    merged = {name: merge(values) for name, values in sasflow.items()}
    dbos = merge(peer) if peer else {"skipped": skip_peer}
    table, ratios = tables(merged, dbos, runs)
    summarize = os.path.join(PEER_DIR, "summarize.py")
    if os.path.exists(summarize):  # the peers' own table, sasflow's row included
        p = subprocess.run([sys.executable, summarize, jsonl], capture_output=True, text=True,
                           timeout=60)
        table += "\n\n### in the peers' table format (../shared/bench/peers/summarize.py)\n\n"
        table += p.stdout.strip()
    summary = {"bench": "sasflow", "runs": runs, "results_dir": results,
               "sasflow": merged, "dbos_sqlite": dbos, "ratios_sasflow_over_dbos": ratios}
    with open(os.path.join(results, "table.md"), "w") as f:
        f.write(table + "\n")
    with open(os.path.join(results, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    print(table)
    print()
    C.emit(summary)


def is_pg_results(jsonl: str) -> bool:
    with open(jsonl) as f:
        return any('"entry": "sasflow-' in line or '"entry": "pgbench"' in line for line in f)


if __name__ == "__main__":
    args = sys.argv[1:]
    if len(args) == 2 and args[0] == "--table":
        if is_pg_results(args[1]):
            import pg_suite

            pg_suite.report(args[1])
        else:
            load(args[1])
    elif args in ([], ["--suite", "sqlite"]):
        main()
    elif args == ["--suite", "pg"]:
        import pg_suite

        pg_suite.main()
    else:
        sys.exit("usage: python bench/run.py [--suite sqlite|pg]"
                 " | python bench/run.py --table RESULTS_DIR/results.jsonl")
