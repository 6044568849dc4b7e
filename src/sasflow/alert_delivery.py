"""Alert delivery: the store's alerts POSTed to webhooks, once each (SPEC E8).

It reads the alerts table, not this process's `on_alert` callbacks, so an alert
raised by any process is delivered. It runs beside the supervisor and works only
while that supervisor leads (M3): one process delivers at a time.

Once per alert and webhook, as far as the store can tell:

* before a POST the deliverer *takes* it in the store: its attempt is counted and
  the pair leased for the POST's time bound and a margin, so no other deliverer
  (a new leader, a restarted process) sends it meanwhile;
* after it, what came of it is recorded, fenced by that attempt's number:
  delivered; failed, due again after a jittered exponential backoff; or given up.
  A delivered pair is never taken again, so a restart sends nothing twice.
* A deliverer that dies between a POST and its record leaves the pair leased; it is
  sent again, once, when the lease ends. That is why a receiver dedupes by the
  ``X-Sasflow-Alert-Id`` header (webhooks.py).

What is tried again: connection errors, timeouts, 5xx and 429 (not sooner than its
Retry-After), up to `attempts` POSTs and never once the alert is `max_age` old. A
3xx or another 4xx is not: the receiver refused it. An acknowledged alert is not
sent, and its retries stop. The schedule lives in the store, so a restart keeps
both the count and the wait. A delivery that fails for good is logged once, in one
line per alert and webhook (each attempt only at debug level), and nothing here
stops the supervisor: every error is caught and logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sasflow.errors import StoreError
from sasflow.redact import scrub
from sasflow.store.interfaces import AlertDeliveryStore
from sasflow.store.records import AlertDelivery
from sasflow.webhooks import ALERT_ID_HEADER, SIGNATURE_HEADER, Webhooks, alert_body, sign

if TYPE_CHECKING:
    import httpx

__all__ = ["AlertDeliverer"]

log = logging.getLogger("sasflow.alerts")

# a taken POST is leased for its time bound and this much more: a deliverer that died
# holding it gives it back then
_LEASE_MARGIN_S = 30.0
_ERROR_CHARS = 300  # of a failure's text, kept and logged


@dataclass(frozen=True, slots=True)
class _Failure:
    why: str
    retry: bool  # a failure worth trying again (the receiver did not refuse it)
    retry_after: float = 0.0  # seconds a 429 or 503 asked to wait


class AlertDeliverer:
    """POSTs the alerts of `store` to `webhooks` while `leading()` says so."""

    def __init__(self, store: AlertDeliveryStore, webhooks: Webhooks, *,
                 leading: Callable[[], bool] = lambda: True, interval: float = 1.0,
                 timeout: float = 10.0, attempts: int = 10, backoff: float = 1.0,
                 max_backoff: float = 300.0, max_age: float = 86400.0, batch: int = 32,
                 wall_clock: Callable[[], float] = time.time) -> None:
        """`interval`: seconds between two looks at the store; `timeout`: the bound on
        one POST, from connecting to the answer's last byte; `attempts`, `max_age`:
        the bounds on the POSTs of one alert to one webhook (at most that many, and
        none once it is that old); `backoff`, `max_backoff`: the first wait after a
        failure and the longest, doubling in between, each made random between its
        half and itself; `batch`: the POSTs sent at once, per webhook; `wall_clock`:
        the signature's timestamp (the receiver compares it with its own clock)."""
        if interval <= 0 or timeout <= 0 or attempts < 1 or batch < 1 or max_age <= 0:
            raise ValueError("interval, timeout and max_age must be > 0,"
                             " attempts and batch >= 1")
        self.store = store
        self.webhooks = webhooks
        self.leading = leading
        self.interval = interval
        self.timeout = timeout
        self.attempts = attempts
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.max_age = max_age
        self.batch = batch
        self.wall_clock = wall_clock
        self.looks = 0  # how many times it has looked for alerts to send
        self._urls = webhooks.by_label
        self._client: httpx.AsyncClient | None = None

    async def __aenter__(self) -> AlertDeliverer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

    async def run(self) -> None:
        """Every interval while leading, deliver what is due; at once again after a
        full batch. Until cancelled: no error ends it."""
        try:
            while True:
                full = False
                if self.leading():
                    try:
                        full = await self.deliver() >= self.batch
                    except StoreError as error:  # the store logs its outage itself
                        log.warning("alert delivery: %s", error)
                    except Exception:  # whatever it was, the next look may go better
                        log.exception("alert delivery failed")
                self.looks += 1
                if not full:
                    await asyncio.sleep(self.interval)
        finally:
            await self.aclose()

    async def deliver(self) -> int:
        """Take the POSTs due now and send them, together; how many were taken."""
        taken = await self.store.take_alert_deliveries(
            list(self._urls), self.batch, lease=self.timeout + _LEASE_MARGIN_S,
            attempts=self.attempts, max_age=self.max_age)
        outcomes = await asyncio.gather(*(self._deliver(d) for d in taken),
                                        return_exceptions=True)
        for outcome in outcomes:  # (each was recorded, or not, by itself)
            if isinstance(outcome, Exception):
                raise outcome
        return len(taken)

    async def _deliver(self, delivery: AlertDelivery) -> None:
        if delivery.alert.acknowledged_at is not None:
            return  # acknowledged as it was taken: it is done with at the next look
        failure = await self._post(delivery)
        if failure is None:
            await self.store.record_alert_delivery(delivery)
            log.debug("alert %d delivered to %s", delivery.alert.id, delivery.url)
            return
        retry_at = self._retry_at(delivery, failure)
        recorded = await self.store.record_alert_delivery(delivery, error=failure.why,
                                                          retry_at=retry_at)
        if retry_at is not None or not recorded:
            log.debug("alert %d not delivered to %s (attempt %d): %s", delivery.alert.id,
                      delivery.url, delivery.attempt, failure.why)
        elif not failure.retry:
            log.warning("alert %d not delivered to %s: %s (not retried)",
                        delivery.alert.id, delivery.url, failure.why)
        else:
            log.warning("alert %d not delivered to %s after %d attempt(s), given up: %s",
                        delivery.alert.id, delivery.url, delivery.attempt, failure.why)

    async def _post(self, delivery: AlertDelivery) -> _Failure | None:
        """One signed POST; None once the receiver took it (2xx)."""
        url = self._urls[delivery.url]
        body = alert_body(delivery.alert)
        headers = {"Content-Type": "application/json",
                   ALERT_ID_HEADER: str(delivery.alert.id),
                   SIGNATURE_HEADER: sign(self.webhooks.secret, body, int(self.wall_clock()))}
        # imported here: every worker and command loads this module, and only those
        # told of webhooks post (httpx takes ~80 ms to import, a third of `sasflow`'s)
        import httpx

        if self._client is None:
            self._client = httpx.AsyncClient(timeout=self.timeout, follow_redirects=False)
        try:
            async with asyncio.timeout(self.timeout):  # httpx bounds each phase, not the sum
                response = await self._client.post(url, content=body, headers=headers)
        except (httpx.TimeoutException, TimeoutError):
            return _Failure(f"no answer within {self.timeout:g}s", retry=True)
        except (httpx.HTTPError, OSError) as error:
            # (an error's text may quote the URL: never its credentials)
            why = scrub(f"{type(error).__name__}: {error}".removesuffix(": "), url)
            return _Failure(why[:_ERROR_CHARS], retry=True)
        status = response.status_code
        if 200 <= status < 300:
            return None
        why = f"HTTP {status} {response.reason_phrase}".strip()
        if status == 429 or status >= 500:
            return _Failure(why, retry=True, retry_after=_seconds(response))
        return _Failure(why, retry=False)

    def _retry_at(self, delivery: AlertDelivery, failure: _Failure) -> float | None:
        """When to try again (store time), or None: refused, or out of attempts or age."""
        if not failure.retry or delivery.attempt >= self.attempts:
            return None
        wait = min(self.max_backoff, self.backoff * 2 ** (delivery.attempt - 1))
        wait = max(random.uniform(wait / 2, wait), min(failure.retry_after, self.max_backoff))
        retry_at = self.store.now() + wait
        return retry_at if retry_at < delivery.alert.at + self.max_age else None


def _seconds(response: httpx.Response) -> float:
    """A Retry-After given in seconds (its date form is ignored: the backoff applies)."""
    with contextlib.suppress(ValueError):
        return max(0.0, float(response.headers.get("Retry-After", "")))
    return 0.0
