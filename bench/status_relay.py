"""How far an application's statuses (E11) trail its tasks over a broker.

distributed.py's row with all tasks submitted first (PostgreSQL, agents in a
`sasflow worker --roles agent` process, scheduler and supervisor here), but
every task submitted with ``reply_to``: each wf3 task then writes five status
messages (received, three step_completed, processed), which the scheduler's
process relays from the outbox to the broker. A consumer here counts them.
Reported: when the last task became terminal and when its last status came
(from the roles' start), the steps/s and statuses/s those make, and the lag
between the two. The same row without ``reply_to`` runs first, as the rate the
tasks reach when nobody listens.

Usage: python bench/status_relay.py [--transport amqp|redis] [--n 2000] [--rounds 1]
Prints one JSON line per round.
"""

from __future__ import annotations

import argparse
import asyncio
import threading
import time
import uuid
from typing import Any

import common as C
from distributed import Deployment, wait_all_terminal
from workload import WORKFLOW

STATUSES_PER_TASK = 5
STUCK_S = 300.0


def measure(transport: str, n: int, reply_to: bool) -> dict[str, Any]:
    with Deployment(transport) as d:
        d.start_agents(1)
        app = d.app()
        queue = f"bench-statuses-{uuid.uuid4().hex[:8]}" if reply_to else None
        heard = threading.Event()
        counted = [0, 0.0]  # statuses, when the last came

        async def submit_all() -> None:
            for _ in range(n):
                await app.asubmit(WORKFLOW, None, reply_to=queue)

        async def listen() -> None:
            async for _ in app.alisten(queue or ""):
                counted[0] += 1
                counted[1] = time.perf_counter()
                if counted[0] == STATUSES_PER_TASK * n:
                    heard.set()
                    return

        app._loop.run(submit_all())  # no scheduler yet: nothing is claimed
        listening = asyncio.run_coroutine_threadsafe(listen(), app._loop.loop) if reply_to \
            else None
        t0 = time.perf_counter()
        app.start(roles=d.roles(), instance_id=d.instance("scheduler"))
        wait_all_terminal(d.store_url, n)
        tasks_s = time.perf_counter() - t0
        result: dict[str, Any] = {"reply_to": reply_to, "n": n,
                                  "tasks_s": round(tasks_s, 3),
                                  "steps_per_s": round(3 * n / tasks_s, 1)}
        if listening is not None:
            if not heard.wait(STUCK_S):
                result["error"] = f"{counted[0]} of {STATUSES_PER_TASK * n} statuses heard"
            else:
                statuses_s = counted[1] - t0
                result.update({"statuses_s": round(statuses_s, 3),
                               "statuses_per_s": round(STATUSES_PER_TASK * n / statuses_s, 1),
                               "lag_s": round(statuses_s - tasks_s, 3)})
            listening.result(timeout=STUCK_S)
        app.stop()
    return result


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--transport", default="amqp", choices=["amqp", "redis"])
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=1)
    a = ap.parse_args()
    for r in range(a.rounds):
        for reply_to in (False, True):
            C.emit({"bench": "status_relay", "transport": a.transport, "round": r + 1,
                    **measure(a.transport, a.n, reply_to)})


if __name__ == "__main__":
    main()
