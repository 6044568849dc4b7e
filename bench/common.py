"""Helpers shared by the benchmark scripts (standard library only).

`pct`, `lat_summary`, `count_effects` and `append_line` are replicated line for
line from the peers' benchmark helpers (../shared/bench/peers/_common.py), so a
percentile, a lost effect or a duplicated effect means the same thing in
sasflow's figures as in the peers'.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar

HERE = os.path.dirname(os.path.abspath(__file__))
STEPS = 3

DURABILITY = {
    "normal": "sqlite WAL synchronous=NORMAL (survives process crash)",
    "full": "sqlite WAL synchronous=FULL (also power loss)",
}


def scratch_dir(*parts: str) -> str:
    """Where scratch files go: $SASFLOW_BENCH_TMP, else <tmp>/sasflow-bench."""
    base = os.environ.get("SASFLOW_BENCH_TMP") or os.path.join(tempfile.gettempdir(),
                                                               "sasflow-bench")
    path = os.path.join(base, *parts)
    os.makedirs(path, exist_ok=True)
    return path


def store_url(path: str, synchronous: str = "normal") -> str:
    return f"sqlite:///{path}?synchronous={synchronous}"


def remove_db(path: str) -> None:
    for suffix in ("", "-wal", "-shm"):
        with contextlib.suppress(FileNotFoundError):
            os.remove(path + suffix)


def append_line(path: str | None, line: str) -> None:
    """Atomic single write() in O_APPEND mode: safe across threads and processes."""
    if not path:
        return
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    if not xs:
        return float("nan")
    k = (len(xs) - 1) * p / 100.0
    f = int(k)
    c = min(f + 1, len(xs) - 1)
    return xs[f] + (xs[c] - xs[f]) * (k - f)


def lat_summary(samples_s: list[float]) -> dict[str, Any]:
    ms = [x * 1000 for x in samples_s]
    return {
        "n": len(ms),
        "p50_ms": round(pct(ms, 50), 2),
        "p95_ms": round(pct(ms, 95), 2),
        "mean_ms": round(statistics.fmean(ms), 2) if ms else None,
        "max_ms": round(max(ms), 2) if ms else None,
    }


def count_effects(path: str, wf_ids: Iterable[str], steps: int = STEPS) -> dict[str, int]:
    """Lines are 'wf_id step_no'. lost = expected (wf, step) pairs never written;
    duplicated = extra writes beyond one per pair."""
    c: Counter[tuple[str, str]] = Counter()
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                parts = line.split()
                if len(parts) == 2:
                    c[(parts[0], parts[1])] += 1
    expected = {(w, str(s)) for w in wf_ids for s in range(1, steps + 1)}
    lost = sum(1 for k in expected if c[k] == 0)
    dup = sum(v - 1 for k, v in c.items() if v > 1)
    return {"lines": sum(c.values()), "lost": lost, "duplicated": dup}


def emit(obj: dict[str, Any]) -> None:
    print(json.dumps(obj), flush=True)


class Deadline:
    """Hard wall-clock bound for a whole script (each script must stop by itself)."""

    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()


def run_child(script: str, args: list[str], timeout: float, *,
              src: str | None = None) -> dict[str, Any]:
    """Run one measurement in a fresh interpreter (no threads or caches carried over
    from the previous one) and return the JSON line it printed; `src`: another
    checkout whose sasflow it imports (its `src` first on the path)."""
    env = None
    if src:
        env = {**os.environ, "PYTHONPATH": os.path.join(os.path.abspath(src), "src")}
    try:
        p = subprocess.run([sys.executable, os.path.join(HERE, script), *args],
                           capture_output=True, text=True, timeout=max(1.0, timeout), env=env)
    except subprocess.TimeoutExpired as error:  # subprocess.run killed it (its PID)
        return {"error": f"timed out after {error.timeout:.0f}s"}
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        return {"error": f"rc={p.returncode}", "stderr_tail": p.stderr[-800:]}
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def stop_proc(proc: subprocess.Popen[bytes], grace: float = 10.0) -> None:
    """Polite stop (SIGTERM) of a process we started, then SIGKILL by PID if it lingers."""
    if proc.poll() is not None:
        return
    try:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5)


class Collections:
    """The garbage collector's collections within a window, by generation: how many, and
    the milliseconds they took (gc.callbacks; whichever thread set them off)."""

    def __init__(self) -> None:
        self.counts = [0, 0, 0]
        self.seconds = [0.0, 0.0, 0.0]
        self._started = 0.0

    def _note(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        self.counts[info["generation"]] += 1
        self.seconds[info["generation"]] += time.perf_counter() - self._started

    def __enter__(self) -> Collections:
        gc.callbacks.append(self._note)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._note)

    def summary(self) -> dict[str, list[float]]:
        """{generation: [collections, milliseconds]}"""
        return {str(g): [self.counts[g], round(self.seconds[g] * 1e3, 1)] for g in range(3)}


def median_of(values: list[float]) -> float:
    return statistics.median(values)


T = TypeVar("T")


async def in_flight(n: int, limit: int, one: Callable[[], Awaitable[T]]) -> list[T]:
    """`one()` called `n` times, `limit` calls at a time, the results in call order:
    `limit` callers, each taking the next call as its last ends, as the requests a web
    app serves at once. (Not one task per call parked on a semaphore: the n - limit
    parked tasks and their coroutines, all alive from the start, were what the garbage
    collector walked most, and weighed on the rows beside the library's own objects.)"""
    results: list[Any] = [None] * n
    calls = iter(range(n))

    async def caller() -> None:
        for i in calls:  # one iterator shared by all the callers: each call taken once
            results[i] = await one()

    await asyncio.gather(*(caller() for _ in range(min(limit, n))))
    return results
