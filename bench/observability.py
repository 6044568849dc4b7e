"""The cost of metrics and tracing: throughput.py's rows with each off and on.

Each measurement is one throughput row (N wf3 tasks, every role in-process on a
fresh SQLite file, synchronous=NORMAL; see throughput.py) in a child process, in
one of these modes:

  off      neither
  metrics  the roles started with `app.start(metrics=True)`: each step counted
           (metrics.py); the child reads back what was counted
  tracing  an OpenTelemetry SDK TracerProvider with a BatchSpanProcessor and an
           exporter that drops every span: the spans are made, batched and
           handed over, nothing is sent; the child counts them. With --sample
           RATIO below 1, its sampler is ParentBased(TraceIdRatioBased(RATIO)), as
           a busy deployment would trace: that share of the tasks, each whole
  both
  both-untraced, both-untimed, both-detached
           both, then each worker once built loses its tracing (its spans and
           sampling checks), its agents' step timing, or both: what is left of
           a mode's cost is then what loading and configuring costs

Every mode of a row runs in each round, in an order rotated from round to
round, so a machine that grows busier or quieter during the sitting weighs on
every mode alike. Medians over the rounds, and each mode's steps/s as a ratio
of off's: the ratio of the medians, and the median of each round's ratio to
that round's off (paired: what drifts over the sitting cancels within a round).
Each child also reports the CPU time its process spent a completed step (all
its threads); off's over the mode's is the throughput ratio a CPU-bound process
would see: a second reading of the same cost. The load average before each
measurement is kept: on a shared machine it says how noisy the sitting was.
Two more readings tell where a mode's CPU went: each thread's CPU seconds as
the roles stop (`thread_cpu`, by thread name: the roles' loop, the SQLite
writer, ...), and the SQLite writer's transactions with the writes they carried
(`sqlite_commits`): fewer writes a transaction is more CPU a step in both.

--together runs a round's modes at the same time, each in its child, instead of one
after the other: whatever slows the machine then slows every mode at once, and
the paired CPU ratio (off's CPU a step over the mode's, within the round) is the
figure to read; the rates share the machine and are not each a row's own.

Usage: python bench/observability.py [--rounds 5] [--n 2000] [--together]
           [--styles sequential,concurrent,presubmitted] [--variants noop,sleep10ms]
           [--modes off,metrics,tracing,both] [--sample 1.0] [--gc-freeze] [--preload]
           (--modes also takes both-untraced, both-untimed, both-detached)

--preload imports prometheus_client and the OpenTelemetry SDK in every mode (off
included) before the app is made: a mode then differs from off by what its
instrumentation does, not by what its libraries add to the process.
Prints one JSON line; the table of medians and ratios goes to stderr.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import importlib.util
import os
import random
import statistics
import sys
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import common as C
import throughput
from workload import AGENT

MODES = ("off", "metrics", "tracing", "both", "both-untraced", "both-untimed", "both-detached")
# "both", then parts taken off each worker once built: the process otherwise as in
# both (libraries loaded, provider and registry made, transitions counted)
DETACHED = {"both-untraced": ("tracing",), "both-untimed": ("timing",),
            "both-detached": ("tracing", "timing")}


def tracing_available() -> bool:
    """Whether sasflow traces (tracing.py) and the OpenTelemetry SDK is installed."""
    return all(importlib.util.find_spec(m) is not None
               for m in ("sasflow.tracing", "opentelemetry.sdk.trace"))


# ---------------------------------------------------------------- one measurement
class _Dropped:
    """Counts the spans a BatchSpanProcessor hands over, and drops them."""

    spans = 0


def _trace_into_nothing(sample: float) -> None:
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    class Dropping(SpanExporter):
        def export(self, spans: Sequence[Any]) -> SpanExportResult:
            _Dropped.spans += len(spans)
            return SpanExportResult.SUCCESS

    provider = (TracerProvider(sampler=ParentBased(TraceIdRatioBased(sample))) if sample < 1
                else TracerProvider())
    provider.add_span_processor(BatchSpanProcessor(Dropping()))
    trace.set_tracer_provider(provider)


def measure(a: argparse.Namespace) -> dict[str, Any]:
    if a.preload:
        for library in ("opentelemetry.sdk.trace.export", "opentelemetry.sdk.trace.sampling",
                        "prometheus_client"):
            importlib.import_module(library)
    traced = a.mode in ("tracing", "both") or a.mode in DETACHED
    metered = a.mode in ("metrics", "both") or a.mode in DETACHED
    if traced:
        _trace_into_nothing(a.sample)  # before the roles start: each looks for one then
    if a.mode in DETACHED:
        _detach_once_built(DETACHED[a.mode])
    made: list[Any] = []
    make_app = throughput.make_app
    commits = _count_commits()
    threads: dict[str, float] = {}

    def keep(*args: Any, **kwargs: Any) -> Any:  # to read back what the app counted
        made.append(make_app(*args, **kwargs))
        stop = made[-1].stop

        def stopping(*args: Any, **kwargs: Any) -> Any:
            threads.update(_thread_cpu())  # the roles' threads, before they end
            return stop(*args, **kwargs)
        made[-1].stop = stopping
        if metered:
            # the registry made, and prometheus_client imported (20-60 ms, once a
            # process), before the all-submitted-first row's window opens: that row
            # times the roles' start with their steps, and a one-time import is no
            # cost of a step (the other rows start the roles before their window)
            _ = made[-1].metrics
        if a.gc_freeze:  # what is loaded by now stays out of every collection
            gc.freeze()
        return made[-1]

    throughput.make_app = keep
    result = throughput.measure(a, **({"metrics": True} if metered else {}))
    result["mode"] = a.mode
    result["thread_cpu"] = threads
    result["sqlite_commits"] = commits
    result["sample"] = a.sample
    result["gc_frozen"] = a.gc_freeze
    result["preloaded"] = a.preload
    if metered:
        result["steps_counted"] = sum(
            made[0].metrics.registry.get_sample_value(
                "sasflow_step_duration_seconds_count", {"agent": AGENT, "outcome": o}) or 0
            for o in ("ok", "transient", "permanent", "deadline"))
    if traced:
        from opentelemetry import trace

        trace.get_tracer_provider().shutdown()  # type: ignore[attr-defined]  # flushes
        result["spans_made"] = _Dropped.spans
    return result


def _thread_cpu() -> dict[str, float]:
    """Each live thread's CPU seconds so far, by its name (Linux's /proc)."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    ticks = os.sysconf("SC_CLK_TCK")
    cpu: dict[str, float] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # it ended meanwhile
        cpu[names.get(int(tid), tid)] = (int(fields[11]) + int(fields[12])) / ticks
    return cpu


def _count_commits() -> dict[str, int]:
    """The SQLite writer's transactions, and the writes they carried, counted from now."""
    from sasflow.store.sqlite import writer

    counted = {"transactions": 0, "writes": 0}
    commit = writer.Writer._commit

    def counting(self: Any, conn: Any, batch: list[Any]) -> Any:
        counted["transactions"] += 1
        counted["writes"] += len(batch)
        return commit(self, conn, batch)

    hooked: Any = writer.Writer  # a bench hook on the class
    hooked._commit = counting
    return counted


def _detach_once_built(parts: tuple[str, ...]) -> None:
    """Each worker, once built with its instrumentation, loses `parts` of it
    (``tracing``: its scheduler's and agents' spans and sampling checks; ``timing``:
    the agents' step timing): a mode then differs from another by that part alone,
    everything else made and loaded alike."""
    from sasflow import worker

    build = worker.Worker.__init__

    def built(self: Any, *args: Any, **kwargs: Any) -> None:
        build(self, *args, **kwargs)
        if "tracing" in parts:
            for actor in (self.scheduler, self.agents):
                if actor is not None:
                    actor._tracing = None
        if "timing" in parts and self.agents is not None:
            self.agents._metered = {}

    # a bench hook on the class (mypy refuses assigning a method, on purpose)
    worker.Worker.__init__ = built  # type: ignore[method-assign]


# ---------------------------------------------------------------- the sitting
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--role", default="main", choices=["main", "one"])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--concurrency", type=int, default=throughput.DEFAULT_CONCURRENCY)
    ap.add_argument("--styles", default="sequential,concurrent,presubmitted")
    ap.add_argument("--variants", default="noop,sleep10ms")
    ap.add_argument("--modes", default="off,metrics,tracing,both")
    ap.add_argument("--sample", type=float, default=1.0,
                    help="the share of tasks traced (a ratio sampler below 1)")
    ap.add_argument("--gc-freeze", action="store_true",
                    help="each child freezes its heap once the app is made (gc.freeze(), as"
                         " `sasflow worker` does), before its roles start")
    ap.add_argument("--preload", action="store_true",
                    help="every mode imports both libraries first (see above)")
    ap.add_argument("--together", action="store_true",
                    help="a round's modes run at the same time (see above)")
    ap.add_argument("--budget-s", type=float, default=3000.0, help="bound for the whole run")
    ap.add_argument("--child-timeout-s", type=float, default=240.0,
                    help="bound for one measurement")
    # one measurement (child process)
    ap.add_argument("--mode", default="off", choices=MODES)
    ap.add_argument("--sync", default="normal", choices=sorted(C.DURABILITY))
    ap.add_argument("--style", default="presubmitted",
                    choices=["sequential", "concurrent", "presubmitted"])
    ap.add_argument("--sleep", type=float, default=0.0)
    a = ap.parse_args()
    if a.role == "one":
        C.emit(measure(a))
        return

    modes = a.modes.split(",")
    note = None
    if not tracing_available():
        modes = [m for m in modes if m in ("off", "metrics")]
        note = ("tracing not measured: sasflow.tracing or the OpenTelemetry SDK is missing;"
                " metrics alone")
    rows = [(style, variant) for style in a.styles.split(",")
            for variant in a.variants.split(",")]
    deadline = C.Deadline(a.budget_s)
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for round_no in range(a.rounds):
        for style, variant in rows:
            key = throughput.key_for("normal", style, variant)
            shift = round_no % len(modes)
            order = modes[shift:] + modes[:shift]
            left = deadline.left()
            if left < 15:
                break

            def one(mode: str, left: float = left, style: str = style,
                    variant: str = variant) -> dict[str, Any]:
                return C.run_child("observability.py", [
                    "--role", "one", "--mode", mode, "--n", str(a.n), "--style", style,
                    "--sleep", str(throughput.VARIANTS[variant]),
                    "--concurrency", str(a.concurrency), "--sample", str(a.sample),
                    *(["--gc-freeze"] if a.gc_freeze else []),
                    *(["--preload"] if a.preload else [])],
                    timeout=min(left - 5, a.child_timeout_s))

            load = os.getloadavg()[0]
            if a.together:
                with ThreadPoolExecutor(len(order)) as pool:
                    results = list(pool.map(one, order))
            else:
                results = []
                for mode in order:
                    load = os.getloadavg()[0] if results else load
                    results.append(one(mode, deadline.left()))
                    results[-1]["load1"] = round(load, 2)
            for mode, result in zip(order, results, strict=True):
                result.update(round=round_no)
                result.setdefault("load1", round(load, 2))
                runs.setdefault(key, {}).setdefault(mode, []).append(result)
                print(f"round {round_no} {key} {mode}: {result.get('steps_per_s')} steps/s,"
                      f" {result.get('cpu_us_per_step')} µs a step (load {load:.2f})",
                      file=sys.stderr, flush=True)
    C.emit(summary(runs, a, note))


def summary(runs: dict[str, dict[str, list[dict[str, Any]]]], a: argparse.Namespace,
            note: str | None) -> dict[str, Any]:
    medians: dict[str, dict[str, Any]] = {}
    for key, by_mode in runs.items():
        medians[key] = {}
        offs = {r["round"]: r for r in by_mode.get("off", []) if "steps_per_s" in r}
        for mode, results in by_mode.items():
            done = [r for r in results if "steps_per_s" in r]
            rates = [r["steps_per_s"] for r in done]
            cpus = [r["cpu_us_per_step"] for r in done]
            # each round's ratio to the same round's off: the machine's drift over the
            # sitting cancels out within a round, and the median drops the odd round out
            paired = [r["steps_per_s"] / offs[r["round"]]["steps_per_s"]
                      for r in done if r["round"] in offs]
            paired_cpu = [offs[r["round"]]["cpu_us_per_step"] / r["cpu_us_per_step"]
                          for r in done if r["round"] in offs]
            medians[key][mode] = {
                "steps_per_s": _median(rates, 1), "runs_steps_per_s": rates,
                "cpu_us_per_step": _median(cpus, 1), "runs_cpu_us_per_step": cpus,
                "paired_ratio": _median(paired, 3), "paired_ratio_90": _interval(paired),
                "paired_cpu_ratio": _median(paired_cpu, 3),
                "errors": [r["error"] for r in results if "error" in r]}
        off = medians[key].get("off", {})
        for figures in medians[key].values():
            figures["ratio_to_off"] = _ratio(figures["steps_per_s"], off.get("steps_per_s"))
            # off's CPU over the mode's: below 1 by the share of throughput the extra CPU
            # costs a process that is CPU-bound
            figures["cpu_ratio_to_off"] = _ratio(off.get("cpu_us_per_step"),
                                                 figures["cpu_us_per_step"])
    loads = [r["load1"] for by_mode in runs.values() for rs in by_mode.values() for r in rs]
    print(_table(medians), file=sys.stderr)
    return {"peer": "sasflow", "backend": "sqlite", "bench": "observability", "n": a.n,
            "rounds": a.rounds, "concurrency": a.concurrency, "sample": a.sample,
            "preload": a.preload, "note": note,
            "load1_median": round(statistics.median(loads), 2) if loads else None,
            "load1_max": max(loads, default=None), "medians": medians, "runs": runs}


def _median(values: list[float], digits: int) -> float | None:
    return round(statistics.median(values), digits) if values else None


def _interval(ratios: list[float], draws: int = 2000) -> list[float] | None:
    """A 90% bootstrap interval of the median of `ratios`: how far the median could be
    from what more rounds would give, judged from the spread of these."""
    if len(ratios) < 3:
        return None
    pick = random.Random(0)  # the same rounds give the same interval
    medians = sorted(statistics.median(pick.choices(ratios, k=len(ratios)))
                     for _ in range(draws))
    return [round(medians[int(0.05 * draws)], 3), round(medians[int(0.95 * draws) - 1], 3)]


def _ratio(on: float | None, off: float | None) -> float | None:
    return round(on / off, 3) if on and off else None


def _table(medians: dict[str, dict[str, Any]]) -> str:
    """Steps/s medians (ratio of medians; median of the rounds' paired ratios [its 90%
    interval]), then CPU µs a step (off's over the mode's)."""
    modes = [m for m in MODES if any(m in by_mode for by_mode in medians.values())]
    lines = ["| row | " + " | ".join(modes) + " |", "|---|" + "---|" * len(modes)]
    for key, by_mode in medians.items():
        rate_cells, cpu_cells = [], []
        for mode in modes:
            f = by_mode.get(mode, {})
            rate, cpu = f.get("steps_per_s"), f.get("cpu_us_per_step")
            interval = f.get("paired_ratio_90")
            rate_cells.append("" if rate is None else f"{rate:,.0f}" + (
                f" ({f['ratio_to_off']:.2f}; {f['paired_ratio']:.2f}" + (
                    f" [{interval[0]:.2f}-{interval[1]:.2f}]" if interval else "") + ")"
                if mode != "off" and f.get("ratio_to_off") and f.get("paired_ratio") else ""))
            cpu_cells.append("" if cpu is None else f"{cpu:,.0f} µs" + (
                f" ({f['cpu_ratio_to_off']:.2f})"
                if mode != "off" and f.get("cpu_ratio_to_off") else ""))
        lines.append(f"| {key} | " + " | ".join(rate_cells) + " |")
        lines.append(f"| {key}, CPU a step | " + " | ".join(cpu_cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
