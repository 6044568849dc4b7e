"""A worker process: any mix of the three roles over one store and transport.

`sasflow worker APP --roles scheduler,agent,supervisor` runs all three (the
embedded default); a broker transport lets each role run as its own service.
With a broker, the worker also relays status messages from the store's outbox
to the queues applications named (E11).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING

from sasflow.agent import AgentRuntime
from sasflow.errors import ConfigurationError
from sasflow.scheduler import Scheduler
from sasflow.store.base import Alert
from sasflow.supervisor import Supervisor
from sasflow.transition import Transition

if TYPE_CHECKING:
    from sasflow.app import App

__all__ = ["ROLES", "Worker"]

log = logging.getLogger("sasflow.worker")

ROLES = ("scheduler", "agent", "supervisor")


class Worker:
    def __init__(self, app: App, *, roles: Collection[str] = ROLES,
                 agents: Collection[str] | None = None, concurrency: int = 64,
                 supervisor_interval: float = 1.0, instance_id: str,
                 on_applied: Callable[[Transition], None] = lambda t: None,
                 on_alert: Callable[[Alert], None] = lambda a: None) -> None:
        unknown = set(roles) - set(ROLES)
        if unknown or not roles:
            raise ConfigurationError(
                f"unknown role(s) {', '.join(sorted(unknown)) or '(none given)'}:"
                f" choose from {', '.join(ROLES)}")
        if concurrency < 1:
            raise ConfigurationError(f"concurrency must be >= 1, got {concurrency}")
        served = list(app.agents) if agents is None else list(agents)
        missing = [a for a in served if a not in app.agents]
        if missing:
            raise ConfigurationError(f"unknown agent(s): {', '.join(missing)}"
                                     f" (declared: {', '.join(app.agents) or 'none'})")
        self.app = app
        self.roles = frozenset(roles)
        plans = app.plans()
        store, transport = app.store, app.transport
        self.scheduler = Scheduler(store, transport, plans, instance_id=instance_id,
                                   concurrency=concurrency, on_applied=on_applied
                                   ) if "scheduler" in self.roles else None
        self.agents = AgentRuntime(transport, [app.agents[a] for a in served]
                                   ) if "agent" in self.roles else None
        self.supervisor = Supervisor(store, plans, instance_id=instance_id,
                                     interval=supervisor_interval, on_applied=on_applied,
                                     on_alert=on_alert) if "supervisor" in self.roles else None

    async def run(self) -> None:
        """Run the roles until cancelled."""
        async with asyncio.TaskGroup() as group:
            if self.agents is not None:
                group.create_task(self.agents.run())
            if self.scheduler is not None:
                group.create_task(self.scheduler.run())
            if self.supervisor is not None:
                group.create_task(self.supervisor.run())
            if self.app.transport.shared:
                group.create_task(self._relay())

    async def _relay(self) -> None:
        """Publish outbox status messages (at least once: acked after publishing)."""
        store, transport = self.app.store, self.app.transport
        while True:
            try:
                messages = await store.take_outbox(None, 256)
                for message in messages:
                    await transport.publish(message.queue, message.body)
                await store.ack_outbox([m.id for m in messages])
            except Exception:
                log.exception("status relay failed; retrying")
                messages = []
            if len(messages) < 256:
                await asyncio.sleep(0.05)
