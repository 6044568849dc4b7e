"""Running an application's roles in this process: a Worker assembled from the
app's parts (store, transport, declarations, settings), served in the caller's
event loop (`App.arun`), in a fresh one until a signal (`App.run`), or in the
background thread (`App.start` ... `App.stop`)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from typing import TYPE_CHECKING, Any

from sasflow import event_loops
from sasflow.backends import Backends
from sasflow.background_loop import BackgroundLoop
from sasflow.declarations import Declarations
from sasflow.errors import ConfigurationError
from sasflow.signals import InProcessSignals
from sasflow.webhooks import from_environment
from sasflow.worker import Worker, WorkerSettings

if TYPE_CHECKING:
    from sasflow.metrics import Metrics

__all__ = ["Runner"]


class Runner:
    def __init__(self, backends: Backends, declared: Declarations, signals: InProcessSignals,
                 loop: BackgroundLoop) -> None:
        self._backends = backends
        self._declared = declared
        self._signals = signals
        self._loop = loop
        self._background: asyncio.Task[None] | None = None
        self._metrics: Metrics | None = None

    @property
    def metrics(self) -> Metrics:
        """The app's metrics: every worker it runs with metrics on counts here."""
        if self._metrics is None:
            from sasflow.metrics import Metrics  # when asked for: prometheus_client takes ~70 ms

            self._metrics = Metrics()
        return self._metrics

    def worker(self, **options: Any) -> Worker:
        """A worker over the app's parts; `options` are WorkerSettings' fields. The alert
        webhooks and their secret not given (or None) are the environment's
        ($SASFLOW_ALERT_WEBHOOKS, $SASFLOW_ALERT_WEBHOOK_SECRET)."""
        urls, secret = from_environment()
        if options.get("alert_webhooks") is None:
            options["alert_webhooks"] = urls
        if options.get("alert_webhook_secret") is None:
            options["alert_webhook_secret"] = secret
        settings = WorkerSettings(**options)
        return Worker(store=self._backends.store, transport=self._backends.transport,
                      workflows=self._declared.workflows, agents=self._declared.agents,
                      settings=settings, on_applied=self._signals.applied,
                      on_alert=self._signals.alerted, waiters=self._signals,
                      metrics=self.metrics if settings.metered else None)

    async def serve(self, worker: Worker) -> None:
        """Run `worker` until cancelled; meanwhile this process's submissions wake it."""
        with self._signals.scheduler(worker.scheduler):
            await worker.run()

    def run(self, **options: Any) -> None:
        async def main() -> None:
            task = asyncio.current_task()
            assert task is not None
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, task.cancel)
            try:
                with contextlib.suppress(asyncio.CancelledError):
                    await self.serve(self.worker(**options))
            finally:
                # closed in the loop it served: a broker client left open keeps
                # reconnecting, and swallows the cancellation that ends the loop (R2)
                transport = self._backends.detach_transport()
                if transport is not None:
                    await transport.close()

        event_loops.run(main())  # uvloop's where installed

    def start(self, **options: Any) -> None:
        if self._background is not None:
            raise ConfigurationError("this app is already running in the background")
        worker = self.worker(**options)

        async def launch() -> asyncio.Task[None]:
            return asyncio.create_task(self.serve(worker))

        self._background = self._loop.run(launch())

    def stop(self) -> None:
        background, self._background = self._background, None
        if background is None:
            return

        async def halt() -> None:
            background.cancel()
            await asyncio.gather(background, return_exceptions=True)
            # on the loop the roles used: a broker client is bound to its loop
            transport = self._backends.detach_transport()
            if transport is not None:
                await transport.close()

        self._loop.run(halt())
