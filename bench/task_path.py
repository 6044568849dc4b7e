"""One task's path on the PostgreSQL store, timed segment by segment.

All roles run in this process (scheduler, agents, client) over `--transport`
(memory, amqp or redis: distributed.py's deployments), and hooks on the methods a
task passes timestamp it: the blocking submission, each step's request hop
(scheduler's publish -> agent's handler), the agent's work, the reply hop
(agent's publish -> scheduler's reply handler), the reply's transition written
(`store.apply`: its statement and commit), and from the last write to the
client holding the task. One task at a time, `--n` tasks after 5 warm-up ones;
the median of each segment in ms. With every role in one process the loop is
shared, so the segments are a little longer than with agents elsewhere
(latency_rounds.py); what they are for is the proportions.

Usage: python bench/task_path.py [--transport memory|amqp|redis] [--n 60]
Prints one JSON line.
"""

from __future__ import annotations

import argparse
import collections
import inspect
import statistics
import time
from collections.abc import Callable
from typing import Any

import common as C
from distributed import Deployment
from workload import WORKFLOW

from sasflow import agent, scheduler
from sasflow.store.postgres import store as pg_store

WARM_UP = 5
STEPS = 3


class Marks:
    """Timestamps by event name, for the task being timed."""

    def __init__(self) -> None:
        self.at: dict[str, list[float]] = collections.defaultdict(list)

    def mark(self, name: str) -> None:
        self.at[name].append(time.perf_counter())

    def hook(self, owner: Any, method: str, before: str, after: str | None = None) -> None:
        """Mark `before` as `owner.method` is entered and `after` as it returns."""
        original: Callable[..., Any] = getattr(owner, method)

        async def hooked(*args: Any, **kwargs: Any) -> Any:
            self.mark(before)
            result = await original(*args, **kwargs)
            if after is not None:
                self.mark(after)
            return result

        def hooked_sync(*args: Any, **kwargs: Any) -> Any:  # a method that never waits
            self.mark(before)
            result = original(*args, **kwargs)
            if after is not None:
                self.mark(after)
            return result

        setattr(owner, method, hooked if inspect.iscoroutinefunction(original) else hooked_sync)


def segments(at: dict[str, list[float]], t0: float, t1: float) -> dict[str, float]:
    """The task's segments (seconds) from its timestamps."""
    out = {"submission": at["submitted"][0] - t0,
           "to_first_request": at["publish"][0] - at["submitted"][0]}
    for s in range(STEPS):
        if at["agent_in"]:
            out[f"step{s + 1}_request_hop"] = at["agent_in"][s] - at["publish"][s]
            out[f"step{s + 1}_agent"] = at["reply_out"][s] - at["agent_in"][s]
            out[f"step{s + 1}_reply_hop"] = at["reply_in"][s] - at["reply_out"][s]
        else:  # the agents run elsewhere: the request's publish to its reply handled
            out[f"step{s + 1}_round_trip"] = at["reply_in"][s] - at["publish"][s]
        out[f"step{s + 1}_to_write"] = at["apply_in"][s] - at["reply_in"][s]
        out[f"step{s + 1}_write"] = at["apply_out"][s] - at["apply_in"][s]
        if s + 1 < STEPS:
            out[f"step{s + 1}_to_next_request"] = at["publish"][s + 1] - at["apply_out"][s]
    out["last_write_to_client"] = t1 - at["apply_out"][STEPS - 1]
    out["whole_task"] = t1 - t0
    return out


def measure(transport: str, n: int, agents_elsewhere: bool) -> dict[str, float]:
    marks = Marks()
    marks.hook(scheduler.Scheduler, "_exchange", "publish")
    marks.hook(scheduler.Scheduler, "_on_reply", "reply_in")
    marks.hook(agent.AgentRuntime, "handle", "agent_in")
    marks.hook(agent.AgentRuntime, "_send", "reply_out")
    marks.hook(pg_store.PostgresStore, "apply", "apply_in", "apply_out")
    samples: list[dict[str, float]] = []
    with Deployment(transport) as d:
        app = d.app()
        if agents_elsewhere:
            d.start_agents(1)
            app.start(roles=d.roles(), concurrency=64, instance_id=d.instance("scheduler"))
        else:
            app.start(concurrency=64)
        try:
            for i in range(WARM_UP + n):
                marks.at.clear()
                t0 = time.perf_counter()
                task_id = app.submit(WORKFLOW, None)
                marks.mark("submitted")
                app.wait(task_id, timeout=30)
                if i >= WARM_UP:
                    samples.append(segments(marks.at, t0, time.perf_counter()))
        finally:
            app.stop()
    return {name: round(statistics.median(s[name] for s in samples) * 1000, 3)
            for name in samples[0]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--transport", default="memory", choices=["memory", "amqp", "redis"])
    ap.add_argument("--n", type=int, default=60)
    ap.add_argument("--agents-elsewhere", action="store_true",
                    help="agents in a `sasflow worker` process, as latency_rounds.py runs"
                         " them (amqp, redis): a step's two hops and its agent timed as one")
    a = ap.parse_args()
    if a.agents_elsewhere and a.transport == "memory":
        raise SystemExit("--agents-elsewhere needs a broker: --transport amqp or redis")
    C.emit({"peer": "sasflow", "backend": "pg", "bench": "task_path", "transport": a.transport,
            "agents_elsewhere": a.agents_elsewhere, "n": a.n,
            "median_ms": measure(a.transport, a.n, a.agents_elsewhere)})


if __name__ == "__main__":
    main()
