"""A worker process: any mix of the three roles over one store and transport.

`sasflow worker APP --roles scheduler,agent,supervisor` runs all three (the
embedded default); a broker transport lets each role run as its own service.
With a broker, the worker also relays status messages from the store's outbox
to the queues applications named (E11), taken when a commit wrote some
(outbox.py).

Liveness (R1, R2). Before any role starts, the worker records its first
heartbeat: the store is reachable, and its clock (on PostgreSQL, the database's)
has been measured, so the first deadline an agent judges is judged on the
store's clock. Then it reaches its transport (a broker's client would otherwise
give up at once if the broker is down). It waits for both as long as it takes.
Then, every `heartbeat` seconds, it writes its instance row again (`Store.beat`)
from the same event loop as the roles, so a beat is written only while that
loop runs and the store answers; a worker that is frozen, wedged or cut off
from its store stops beating. `sasflow healthcheck --instance-id` reads the row, and supervisors
release the tasks of an instance whose beat is older than its `heartbeat_lease`.
On a clean stop the worker says so (`Store.stopped`) after its scheduler has
handed its tasks back. Under systemd (`Type=notify`), the first beat is
`READY=1` and each later one `WATCHDOG=1` (sd_notify.py).

Metrics (U5), when its settings turn them on: its roles count into a `Metrics`
(metrics.py) while they run, served on `metrics_port` if given.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import socket
import uuid
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sasflow.agent import AgentFunction, AgentRuntime
from sasflow.alert_delivery import AlertDeliverer
from sasflow.declarations import plans_for
from sasflow.errors import ConfigurationError, MessageRefused
from sasflow.handover import NO_WAITERS, Waiters
from sasflow.logs import log_context
from sasflow.outage import Outage
from sasflow.outbox import OutboxWatch
from sasflow.scheduler import Scheduler
from sasflow.sd_notify import notify
from sasflow.store.interfaces import Store
from sasflow.store.records import Alert, Instance, OutboxMessage
from sasflow.supervisor import Supervisor
from sasflow.transition import Transition
from sasflow.transport.base import Transport, agent_queue, reply_queue
from sasflow.transport.dead_letter import letter_for, log_dead_letter
from sasflow.webhooks import Webhooks, configured_webhooks
from sasflow.workflow import Workflow

if TYPE_CHECKING:
    from sasflow.metrics import Metrics

__all__ = ["DEFAULT_CONCURRENCY", "DEFAULT_HEARTBEAT", "ROLES", "Worker", "WorkerSettings",
           "check_instance_id", "default_instance_id"]

log = logging.getLogger("sasflow.worker")

ROLES = ("scheduler", "agent", "supervisor")
DEFAULT_HEARTBEAT = 2.0  # seconds between heartbeats
# Tasks one scheduler drives at once. A task waiting for its agent costs a coroutine;
# what it buys is bigger batches: on PostgreSQL every driven task's next transition
# joins the group commit's batch, so with 64 a worker waited on its own round trips
# (bench/pg_worker.py, no-op steps, 2 cores: ~1,700 steps/s at 64, ~2,300 at 256,
# ~3,000 at 1,024, the in-process bench's setting).
DEFAULT_CONCURRENCY = 1024
# The default lease: this many heartbeats may be missed (a long GC pause, a slow
# store) before the instance counts as gone and its tasks are released.
_LEASE_BEATS = 5
_REACH_RETRY_MAX_S = 5.0
_STOPPED_TIMEOUT_S = 5.0
_RELAY_BATCH = 256  # status messages the relay takes at once


def default_instance_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


# An instance id names the instance's reply queue (RabbitMQ, Redis) and its row in the
# store, and is typed into health probes: letters, digits and a few separators.
_INSTANCE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@-]{0,99}")


def check_instance_id(instance_id: str) -> str:
    """`instance_id` if it can name a queue on every transport; else ConfigurationError."""
    if not _INSTANCE_ID.fullmatch(instance_id):
        raise ConfigurationError(
            f"instance id {instance_id[:120]!r} must be 1-100 characters: letters, digits"
            " and . _ : @ - (not first)")
    return instance_id


@dataclass(frozen=True, slots=True)
class WorkerSettings:
    """Which roles a worker runs, for which agents, and how (the `sasflow worker`
    options). `agents=None` serves every declared agent. With `alert_webhooks`, its
    supervisor, while it leads, POSTs every alert there, signed with
    `alert_webhook_secret` (alert_delivery.py)."""

    roles: Collection[str] = ROLES
    agents: Collection[str] | None = None
    concurrency: int = DEFAULT_CONCURRENCY
    supervisor_interval: float = 1.0
    instance_id: str | None = None  # None: default_instance_id()
    heartbeat: float = DEFAULT_HEARTBEAT
    heartbeat_lease: float | None = None
    alert_webhooks: Sequence[str] = ()
    alert_webhook_secret: str | None = field(default=None, repr=False)
    metrics: bool = False  # count metrics (metrics.py); implied by a metrics_port
    metrics_port: int | None = None  # serve them over HTTP on it (0: any free port)
    metrics_host: str = "127.0.0.1"

    def __post_init__(self) -> None:
        if self.instance_id is not None:
            check_instance_id(self.instance_id)

    @property
    def lease(self) -> float:
        if self.heartbeat_lease is None:
            return _LEASE_BEATS * self.heartbeat
        return self.heartbeat_lease

    @property
    def metered(self) -> bool:
        """Whether its roles count metrics."""
        return self.metrics or self.metrics_port is not None

    @property
    def webhooks(self) -> Webhooks | None:
        """The alert webhooks, checked; None without any."""
        return configured_webhooks(self.alert_webhooks, self.alert_webhook_secret)

    def check(self) -> None:
        unknown = set(self.roles) - set(ROLES)
        if unknown or not self.roles:
            raise ConfigurationError(
                f"unknown role(s) {', '.join(sorted(unknown)) or '(none given)'}:"
                f" choose from {', '.join(ROLES)}")
        if self.concurrency < 1:
            raise ConfigurationError(f"concurrency must be >= 1, got {self.concurrency}")
        if not 0 < self.heartbeat < self.lease:
            raise ConfigurationError(
                f"the heartbeat ({self.heartbeat:g}s) must be > 0 and shorter than its lease"
                f" ({self.lease:g}s)")
        if self.metrics_port is not None and not 0 <= self.metrics_port <= 65535:
            raise ConfigurationError(f"metrics port must be 0-65535, got {self.metrics_port}")
        _ = self.webhooks  # checked here, before anything runs


class Worker:
    """The roles of one process over its parts: a store, a transport, the declared
    workflows and agents. It knows nothing of the App that assembled it.

    `metrics` is where its roles count when the settings turn metrics on (a
    registry of its own if not given); with them off it is not used.
    """

    def __init__(self, *, store: Store, transport: Transport,
                 workflows: Mapping[str, Workflow], agents: Mapping[str, AgentFunction],
                 settings: WorkerSettings = WorkerSettings(),
                 on_applied: Callable[[Transition], None] = lambda t: None,
                 on_alert: Callable[[Alert], None] = lambda a: None,
                 metrics: Metrics | None = None,
                 waiters: Waiters = NO_WAITERS) -> None:
        settings.check()
        served = list(agents) if settings.agents is None else list(settings.agents)
        missing = [a for a in served if a not in agents]
        if missing:
            raise ConfigurationError(f"unknown agent(s): {', '.join(missing)}"
                                     f" (declared: {', '.join(agents) or 'none'})")
        instance_id = settings.instance_id or default_instance_id()
        _check_queues(transport, [reply_queue(instance_id), *(agent_queue(a) for a in served),
                                  *(agent_queue(step.agent) for workflow in workflows.values()
                                    for step in workflow.steps)])
        self.store, self.transport = store, transport
        self.roles = frozenset(settings.roles)
        plans = plans_for(workflows, agents)
        self.metrics = _metrics(settings, metrics)
        self._metrics_at = (settings.metrics_host, settings.metrics_port)
        supervised, released = on_applied, None
        if self.metrics is not None:  # the callbacks that see each event count it too
            released = self.metrics.released()  # the scheduler's: tasks it let go
            supervised = self.metrics.counting(on_applied, supervisor=True)
            on_alert = self.metrics.alerting(on_alert)
            self.metrics.declare(workflows=workflows, queues=[
                *(agent_queue(a) for a in served if "agent" in self.roles),
                *([reply_queue(instance_id)] if "scheduler" in self.roles else [])])
        self.scheduler = Scheduler(store, transport, plans, instance_id=instance_id,
                                   concurrency=settings.concurrency, on_applied=on_applied,
                                   on_released=released, waiters=waiters,
                                   ) if "scheduler" in self.roles else None
        # every complete-by was set on the store's clock: agents judge it on that (R1)
        self.agents = AgentRuntime(transport, [agents[a] for a in served], clock=store.now,
                                   metrics=self.metrics) if "agent" in self.roles else None
        self.supervisor = Supervisor(store, plans, instance_id=instance_id,
                                     interval=settings.supervisor_interval,
                                     on_applied=supervised, on_alert=on_alert,
                                     # a starting worker is not absent before a silent
                                     # one would be gone (incidents.py)
                                     incident_grace=settings.lease
                                     ) if "supervisor" in self.roles else None
        # alerts go to the webhooks from the supervisors' leader: one process at a time
        supervisor, webhooks = self.supervisor, settings.webhooks
        self.alert_deliverer = AlertDeliverer(
            store, webhooks, leading=lambda: supervisor.lease_epoch is not None,
            interval=settings.supervisor_interval
        ) if supervisor is not None and webhooks is not None else None
        self.heartbeat = settings.heartbeat
        self.instance = Instance(
            instance_id=instance_id, host=socket.gethostname(), pid=os.getpid(),
            roles=[r for r in ROLES if r in self.roles],
            agents=served if self.agents is not None else [],
            workflows={name: w.version for name, w in workflows.items()},
            lease=settings.lease)
        self._beats = Outage(log, f"worker {instance_id}'s heartbeat store")
        self._broker = Outage(log, f"worker {instance_id}'s transport")
        self._relaying = Outage(log, f"worker {instance_id}'s status relay")

    async def run(self) -> None:
        """Run the roles until cancelled, beating while they run."""
        # every record its roles log names this instance (logs.py)
        with log_context(instance=self.instance.instance_id):
            async with self._counting():
                await self._serve()

    def _counting(self) -> contextlib.AbstractAsyncContextManager[str | None]:
        """Where the roles count while they run, and the metrics' server (or nothing)."""
        if self.metrics is None:
            return contextlib.nullcontext(None)
        host, port = self._metrics_at
        return self.metrics.running({} if self.agents is None else self.agents.breakers,
                                    host=host, port=port)

    async def _serve(self) -> None:
        try:
            await _until_done(lambda: self.store.beat(self.instance, first=True),
                              self._beats)
            async with asyncio.TaskGroup() as group:
                # beating from the first beat on: a worker waiting for its broker is
                # alive, and what it claims once the broker is back must not look
                # orphaned to a supervisor (its own included)
                group.create_task(self._beat())
                await _until_done(self.transport.ping, self._broker)
                notify("READY=1")
                if self.agents is not None:
                    group.create_task(self.agents.run())
                if self.scheduler is not None:
                    group.create_task(self.scheduler.run())
                if self.supervisor is not None:
                    group.create_task(self.supervisor.run())
                if self.alert_deliverer is not None:
                    group.create_task(self.alert_deliverer.run())
                if self.transport.shared:
                    group.create_task(self._relay())
        finally:
            # after the scheduler handed its tasks back: the instance holds nothing now
            with contextlib.suppress(Exception):
                async with asyncio.timeout(_STOPPED_TIMEOUT_S):
                    await self.store.stopped(self.instance.instance_id)

    async def _beat(self) -> None:
        """Renew the instance's row every `heartbeat` seconds while this loop runs."""
        while True:
            await asyncio.sleep(self.heartbeat)
            try:
                await self.store.beat(self.instance)
            except Exception as error:  # no beat: the probe and the supervisors will see it
                self._beats.failed(error)
            else:
                self._beats.recovered()
                notify("WATCHDOG=1")

    async def _relay(self) -> None:
        """Publish outbox status messages (at least once: acked after publishing),
        taken when a commit wrote some (outbox.py)."""
        store = self.store
        backoff = 0.05
        async with OutboxWatch(store) as outbox:
            while True:
                try:
                    messages = await store.take_outbox(None, _RELAY_BATCH)
                    await self._publish_statuses(messages)
                except Exception as error:  # store or broker down: one line, then backing off
                    self._relaying.failed(error)
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, _REACH_RETRY_MAX_S)
                    continue
                self._relaying.recovered()
                backoff = 0.05
                if len(messages) < _RELAY_BATCH:
                    await outbox.written()

    async def _publish_statuses(self, messages: list[OutboxMessage]) -> None:
        """Publish a batch at once, then ack it. The publishes start in order, so a
        queue's messages reach it in the order they were written (one channel, or
        one pipeline), and the batch waits for its confirms together: one by one, a
        relay over RabbitMQ passed 1,800 statuses/s and they trailed their tasks by
        seconds (docs/benchmarks.md). Those published are acked even if another
        failed, which is raised then: the rest come again once their lease ends."""
        failures = await asyncio.gather(*(self._publish_status(m) for m in messages),
                                        return_exceptions=True)
        await self.store.ack_outbox([message.id for message, failure
                                     in zip(messages, failures, strict=True) if failure is None])
        for failure in failures:
            if isinstance(failure, BaseException):
                raise failure

    async def _publish_status(self, message: OutboxMessage) -> None:
        """Publish one status message. One the transport refuses for good (a queue
        name its broker cannot have) goes to the dead letters, logged once (R3), and
        counts as sent: retried, it would come back with every lease, for ever."""
        try:
            await self.transport.publish(message.queue, message.body)
        except MessageRefused as refused:
            letter = letter_for(message.queue, message.body, refused)
            await self.transport.keep_dead_letter(letter)
            log_dead_letter(log, letter)


def _check_queues(transport: Transport, queues: list[str]) -> None:
    """ConfigurationError, at start, for an agent the transport could never reach (a
    name too long for RabbitMQ's queues): its every request would be refused."""
    for queue in dict.fromkeys(queues):
        try:
            transport.check_queue(queue)
        except MessageRefused as refused:
            raise ConfigurationError(str(refused)) from None


def _metrics(settings: WorkerSettings, given: Metrics | None) -> Metrics | None:
    if not settings.metered:
        return None
    if given is not None:
        return given
    from sasflow.metrics import Metrics  # only when on: prometheus_client takes ~70 ms

    return Metrics()


async def _until_done(attempt: Callable[[], Awaitable[None]], outage: Outage) -> None:
    """Run `attempt` until it succeeds, with capped backoff, for as long as it takes (R2).

    A configuration error is raised at once: waiting would not mend it.
    """
    delay = 0.1
    while True:
        try:
            await attempt()
        except ConfigurationError:
            raise
        except Exception as error:  # down or not ready yet: wait for it
            outage.failed(error)
            await asyncio.sleep(delay)
            delay = min(delay * 2, _REACH_RETRY_MAX_S)
        else:
            outage.recovered()
            return
