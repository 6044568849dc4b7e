"""The in-memory store's alert deliveries (E8): the verbs of AlertDeliveryStore over
one Data, each under its lock as the SQL stores' run in one transaction, with the
same rules as their statements (queries.sql take_alert_delivery, settle_alerts)."""

from __future__ import annotations

from collections.abc import Callable, Collection

import msgspec

from sasflow.store.memory.data import Data
from sasflow.store.records import Alert, AlertDelivery, DeliveryRecord

__all__ = ["Deliveries"]


class Deliveries:
    """Alert deliveries to webhooks, kept beside the alerts of one Data."""

    _data: Data
    now: Callable[[], float]

    async def take_alert_deliveries(self, webhooks: Collection[str], limit: int, *,
                                    lease: float, attempts: int, max_age: float
                                    ) -> list[AlertDelivery]:
        labels = list(webhooks)
        if not labels or limit <= 0:
            return []
        taken: list[AlertDelivery] = []
        with self._data.lock:
            now = self.now()
            oldest = now - max_age
            rows, done = self._data.deliveries, self._data.delivery_done
            for alert in self._pending():
                if alert.acknowledged_at is not None or alert.at < oldest or all(
                        _settled(rows.get((alert.id, label)), now, attempts)
                        for label in labels):
                    done[alert.id] = now
            pending = self._pending()  # oldest first: ids grow
            for label in labels:
                due = [a for a in pending if a.acknowledged_at is None and a.at >= oldest
                       and _due(rows.get((a.id, label)), now, attempts)][:limit]
                for alert in due:
                    row = rows.get((alert.id, label))
                    if row is None:
                        row = rows[alert.id, label] = DeliveryRecord(
                            alert_id=alert.id, url=label, tries=0, due_at=now)
                    row.tries += 1
                    row.due_at = now + lease
                    taken.append(AlertDelivery(alert=msgspec.structs.replace(alert), url=label,
                                               attempt=row.tries))
        return sorted(taken, key=lambda d: (d.alert.id, d.url))

    def _pending(self) -> list[Alert]:
        done = self._data.delivery_done
        return [alert for alert in self._data.alerts if alert.id not in done]

    async def record_alert_delivery(self, delivery: AlertDelivery, *,
                                    error: str | None = None,
                                    retry_at: float | None = None) -> bool:
        with self._data.lock:
            now = self.now()
            row = self._data.deliveries.get((delivery.alert.id, delivery.url))
            if (row is None or row.tries != delivery.attempt
                    or row.delivered_at is not None or row.gave_up_at is not None):
                return False  # a later attempt was taken, or it is settled
            row.delivered_at = now if error is None else None
            row.gave_up_at = now if error is not None and retry_at is None else None
            row.due_at = now if retry_at is None else retry_at
            row.last_error = error if error is not None else row.last_error
            return True

    async def alert_deliveries(self, alert_id: int) -> list[DeliveryRecord]:
        with self._data.lock:
            return sorted((msgspec.structs.replace(row)
                           for (of, _), row in self._data.deliveries.items() if of == alert_id),
                          key=lambda row: row.url)


def _settled(row: DeliveryRecord | None, now: float, attempts: int) -> bool:
    """Delivered, given up, or out of attempts with the last one's lease passed."""
    return row is not None and (row.delivered_at is not None or row.gave_up_at is not None
                                or (row.tries >= attempts and row.due_at <= now))


def _due(row: DeliveryRecord | None, now: float, attempts: int) -> bool:
    """Never taken, or taken again now: its lease or backoff passed, attempts left."""
    return row is None or (row.due_at <= now and row.tries < attempts
                           and row.delivered_at is None and row.gave_up_at is None)
