"""Release 2 of the shipment application (shipping_r1.py): the label step is gone.

Same workflow name, same agents, a shorter step list: another version.
Run a worker with ``python shipping_r2.py --store URL --instance-id ID``.
"""

from __future__ import annotations

import chaosapp
from shipping_r1 import WORKFLOW, declare_agents

from sasflow import App, Step


def build_app(store: str) -> App:
    app = App(store=store)
    declare_agents(app)
    app.workflow(WORKFLOW, [Step("pick", "picker", chaosapp.STEP_TIMEOUT)],
                 max_failures=chaosapp.MAX_FAILURES, retry_backoff=chaosapp.RETRY_BACKOFF)
    return app


if __name__ == "__main__":
    chaosapp.main(build=build_app)
