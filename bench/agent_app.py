"""The benchmark workload as an APP for the command line (`sasflow worker`).

``sasflow worker bench/agent_app.py:app --roles agent --agents NAME --store URL
--transport URL`` serves the wf3 steps from another process; with ``--roles
scheduler,supervisor`` it drives them. The agent's name (hence its queue) and the
steps' timeout come from the environment, so that every measurement of
bench/distributed.py has queues of its own:

  SASFLOW_BENCH_AGENT         agent name (default bench-step)
  SASFLOW_BENCH_STEP_TIMEOUT  step timeout in seconds (default 10)

Store and transport are left to the command line (``--store``, ``--transport``).
"""

from __future__ import annotations

import os

from workload import AGENT, make_app

app = make_app(None, agent=os.environ.get("SASFLOW_BENCH_AGENT") or AGENT,
               step_timeout=float(os.environ.get("SASFLOW_BENCH_STEP_TIMEOUT") or 10.0))
