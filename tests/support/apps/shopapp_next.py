"""The shop's next releases (shopapp.py): the same agents, the order workflow changed.

``app``: a release that adds a ``notify`` step after ``ship``; tasks of the first
release can move onto it (their steps are a prefix of its). ``shrunk``: a release
whose order is only ``reserve``; a task that ran ``charge`` cannot move onto it.
"""

from __future__ import annotations

import shopapp

from sasflow import App, Step


def release(steps: list[Step]) -> App:
    built = App(max_payload_bytes=2048)
    for declared in (shopapp.reserve, shopapp.charge, shopapp.ship):
        agent = built.agent(declared.name)(declared.handler)
        if declared.undo is not None:
            agent.compensator(declared.undo)
    built.workflow("order", steps=steps, on_failure="error")
    return built


app = release([*shopapp.STEPS, Step("notify", agent="shipping", timeout=shopapp.STEP_TIMEOUT)])
shrunk = release(shopapp.STEPS[:1])
