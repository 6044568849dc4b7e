"""An app whose one agent runs each call in a worker process (isolation="process").

The agent returns the pid it ran in and its parent's, so a test can tell it ran
outside the `sasflow worker` process.
"""

from __future__ import annotations

import os

from sasflow import AgentRequest, App, Step

app = App()


@app.agent("labels", isolation="process")
def print_label(req: AgentRequest) -> dict[str, int]:
    return {"pid": os.getpid(), "parent": os.getppid()}


app.workflow("label", steps=[Step("print", agent="labels", timeout=60.0)])
