"""App: what an application declares, its client, and a way to run its roles.

The public face of sasflow (CONTRACT "Python API"), in three parts:

- declarations (`agent`, `workflow`, `on_alert`) — this module;
- the client (`submit`, `get`, `wait`, `list`, `history`, `alerts`, `listen`,
  `retry`, `compensate`, `cancel`, `migrate`, `dead_letters`...) — client.py
  (docs/api.md lists them all). Every one has a
  blocking form `x()` and a coroutine `ax()` for use inside an event loop
  (`wait`'s is `await_`, as `await` is a keyword);
- running the roles (`run`, `arun`, `start`, `stop`) — running.py, which
  assembles a Worker (worker.py) from the app's parts. The Worker never sees
  the App.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from sasflow.agent import AgentFunction, AgentRequest
from sasflow.backends import DEFAULT_STORE
from sasflow.client import Client, Migration
from sasflow.isolation import Isolation
from sasflow.plan import Plan
from sasflow.running import Runner
from sasflow.store.interfaces import Store
from sasflow.store.records import Alert, NewTask
from sasflow.transport import Transport
from sasflow.transport.base import DEFAULT_MAX_MESSAGE_BYTES
from sasflow.worker import Worker
from sasflow.workflow import Step, Workflow

if TYPE_CHECKING:
    from sasflow.metrics import Metrics

__all__ = ["DEFAULT_STORE", "App", "Migration"]


def _deprecated(old: str, new: str) -> None:
    warnings.warn(f"App.{old} is deprecated: {new}", DeprecationWarning, stacklevel=3)


class App(Client):
    """One application: its agents, its workflows, and where its state lives.

    `App(store=None, transport=None)`: the store defaults to $SASFLOW_STORE, else
    sqlite:///sasflow.db; the transport to $SASFLOW_TRANSPORT, else in-process.
    """

    def __init__(self, store: str | None = None, transport: str | None = None, *,
                 max_payload_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
                 clock: Callable[[], float] | None = None) -> None:
        super().__init__(store, transport, max_payload_bytes=max_payload_bytes, clock=clock)
        self._runner = Runner(self._backends, self._declared, self._signals, self._loop)

    # ------------------------------------------------------------ declarations
    @property
    def agents(self) -> dict[str, AgentFunction]:
        """The agents declared, by name."""
        return self._declared.agents

    @property
    def workflows(self) -> dict[str, Workflow]:
        """The workflows declared, by name."""
        return self._declared.workflows

    def agent(self, name: str, *, attempts: int = 10, initial_wait: float = 0.05,
              max_wait: float = 2.0, failure_threshold: int = 5, reset_timeout: float = 5.0,
              concurrency: int | None = None, isolation: Isolation = "thread"
              ) -> Callable[[Callable[[AgentRequest], Any]], AgentFunction]:
        """Declare an agent: the function that calls one remote service (S3).

        `isolation` says where a sync function runs: "thread" (the default; at the
        complete-by its result is dropped, but the call cannot be stopped) or
        "process" (each call in a worker process, killed at the complete-by; the
        function must be defined at the top level of a module). `concurrency`
        bounds the calls at once: 256 in threads, 8 worker processes by default.
        """
        return self._declared.agent(
            name, attempts=attempts, initial_wait=initial_wait, max_wait=max_wait,
            failure_threshold=failure_threshold, reset_timeout=reset_timeout,
            concurrency=concurrency, isolation=isolation)

    def workflow(self, name: str, steps: Sequence[Step], *, max_failures: int = 3,
                 on_failure: str = "compensate", retry_backoff: float = 0.2,
                 park_for: float = 300.0) -> Workflow:
        """Declare a workflow: an ordered pipeline of steps and its failure policy (S1)."""
        return self._declared.workflow(name, steps, max_failures=max_failures,
                                       on_failure=on_failure, retry_backoff=retry_backoff,
                                       park_for=park_for)

    def on_alert(self, callback: Callable[[Alert], None]) -> Callable[[Alert], None]:
        """Call `callback` with each operator alert raised in this process: a task's move
        to error (E8), or an incident its supervisor raised (R4; no task id)."""
        self._signals.alert_callbacks.append(callback)
        return callback

    # ------------------------------------------------------------ running
    @property
    def metrics(self) -> Metrics:
        """The Prometheus metrics of this app's roles (metrics.py), on a registry of their
        own (`app.metrics.registry`): counted while the roles run with `metrics=True` or
        a `metrics_port` (`run`, `arun`, `start`)."""
        return self._runner.metrics

    async def arun(self, **options: Any) -> None:
        """Run scheduler, agents and supervisor in this event loop until cancelled.

        `options`: roles, agents, concurrency, supervisor_interval, instance_id,
        heartbeat, heartbeat_lease, alert_webhooks (URLs the supervisors' leader POSTs
        every alert to) and alert_webhook_secret (what signs them; both default to
        $SASFLOW_ALERT_WEBHOOKS, comma-separated, and $SASFLOW_ALERT_WEBHOOK_SECRET),
        metrics (count into `app.metrics`), metrics_port and metrics_host (serve them
        over HTTP; implies metrics) (worker.WorkerSettings)."""
        await self._runner.serve(self._runner.worker(**options))

    def run(self, **options: Any) -> None:
        """Run all roles in this process until SIGINT or SIGTERM (options as `arun`)."""
        self._runner.run(**options)

    def start(self, **options: Any) -> App:
        """Run all roles in a background thread of this process (tests, notebooks)."""
        self._runner.start(**options)
        return self

    def stop(self) -> None:
        """Stop the background roles (they hand back the tasks they hold) and close,
        the transport too: a broker's connections are not left open behind."""
        self._runner.stop()
        self.close()

    def __enter__(self) -> App:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------ internals, deprecated
    @property
    def store(self) -> Store:
        _deprecated("store", "the App's client methods read and act on the store")
        return self._store

    @property
    def transport(self) -> Transport:
        _deprecated("transport", "App.alisten reads the status queues")
        return self._transport

    def plans(self) -> dict[str, Plan]:
        _deprecated("plans()", "a Worker plans with the workflows it is given")
        return self._plans()

    def new_task(self, workflow: str, input: Any = None, *, task_id: str | None = None,
                 reply_to: str | None = None) -> NewTask:
        _deprecated("new_task()", "use App.submit")
        return self._new_task(workflow, input, task_id=task_id, reply_to=reply_to)

    def worker(self, **options: Any) -> Worker:
        _deprecated("worker()", "use App.run, App.arun or App.start")
        return self._worker(**options)

    def _worker(self, **options: Any) -> Worker:
        return self._runner.worker(**options)
