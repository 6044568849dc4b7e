"""An agent whose result is over the message limit: its calls and the CPU they cost.

One task whose only step returns a 2 MiB string, under a 1 MiB limit; the
roles run in this process for `--window` seconds. Before the fix the request
was delivered again after every refused reply (a hot loop, until the step
expired); now the agent is called once and the step fails with its size.
Prints one JSON line: ``{"oversized": {transport, calls, cpu_s, window_s,
state, error}}``. ``--transport`` takes a URL (default: in-process queues).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
import uuid
from typing import Any

from common import scratch_dir

from sasflow import App, Step
from sasflow.agent import AgentRequest


async def measure(transport: str, window: float) -> dict[str, Any]:
    calls = 0
    run = uuid.uuid4().hex[:8]
    folder = scratch_dir("oversized", run)
    app = App(store=f"sqlite:///{os.path.join(folder, 'store.db')}", transport=transport)

    @app.agent(f"big-{run}")  # private queue names on a shared broker
    def big(req: AgentRequest) -> str:
        nonlocal calls
        calls += 1
        return "x" * (2 * 1024 * 1024)

    app.workflow("oversized", steps=[Step("big", agent=f"big-{run}", timeout=60.0)],
                 on_failure="error")
    worker = asyncio.create_task(app.arun(supervisor_interval=0.5))
    cpu = time.process_time()
    await app.asubmit("oversized", {}, task_id="t1")
    await asyncio.sleep(window)
    cpu = time.process_time() - cpu
    task = await app.aget("t1")
    worker.cancel()
    await asyncio.gather(worker, return_exceptions=True)
    await app._store.close()
    await app._transport.close()
    return {"transport": transport.split(":")[0], "calls": calls, "cpu_s": round(cpu, 2),
            "window_s": window, "state": task.state.value, "error": task.error}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--transport", default="memory")
    ap.add_argument("--window", type=float, default=10.0)
    args = ap.parse_args()
    print(json.dumps({"oversized": asyncio.run(measure(args.transport, args.window))}))


if __name__ == "__main__":
    main()
