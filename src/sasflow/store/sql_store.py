"""The domain verbs of a SQL store, written once over a dialect (SPEC S10).

`SQLStore` says what each verb means: which named statement it runs (queries.py)
and how its rows become records (rows.py). A dialect (sqlite/, postgres/)
supplies the rest, the parts where the databases truly differ:

* how statements run: `_fetch` (a read, rows by name), `_fetch_tasks` (tasks with
  their steps), `_write` (statements in one transaction, safe to repeat);
* the hot writes: `submit`, `submit_in` (E1), `claim` and `apply`, each shaped by
  how its database commits (SQLite: one writer thread; PostgreSQL: group-committed
  bulk statements);
* wake-ups (`watch`, `on_finished`), the clock (`now`), error classification and
  migrations.
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from sasflow.model import Task, TaskState
from sasflow.store.interfaces import OUTBOX_LEASE_S, ClaimRule
from sasflow.store.listing import TaskQuery
from sasflow.store.records import (
    Alert,
    AlertDelivery,
    Census,
    DeliveryRecord,
    HistoryEntry,
    Instance,
    NewTask,
    OutboxMessage,
)
from sasflow.store.rows import (
    Row,
    alert_from_row,
    incident_params,
    instance_from_row,
    instance_params,
    letter_from_row,
    letter_params,
    task_from_row,
)
from sasflow.transition import Transition
from sasflow.transport.dead_letter import DeadLetter

__all__ = ["SQLStore", "Statement"]

# A statement to run: its name (queries.py) and its parameters
Statement = tuple[str, Mapping[str, Any]]


class SQLStore(abc.ABC):
    """Every verb of the Store interfaces, over the dialect methods below."""

    # ------------------------------------------------------------ the dialect
    @abc.abstractmethod
    def now(self) -> float:
        """The store's clock (seconds since the epoch)."""

    @abc.abstractmethod
    async def _fetch(self, name: str, params: Mapping[str, Any]) -> Sequence[Row]:
        """The rows of a read, by column name."""

    @abc.abstractmethod
    async def _fetch_tasks(self, name: str, params: Mapping[str, Any]) -> list[Task]:
        """The tasks a read of task rows selects, each with its steps."""

    @abc.abstractmethod
    async def _write(self, statements: Callable[[float], Sequence[Statement]]
                     ) -> list[Sequence[Row]]:
        """Run `statements(now)`, `now` read inside the transaction, in one transaction;
        the rows each returned. Repeated if its commit's answer is lost: every caller's
        statements are safe to repeat."""

    @abc.abstractmethod
    async def submit(self, task: NewTask, *, connection: Any = None) -> bool: ...

    @abc.abstractmethod
    async def submit_claimed(self, task: NewTask, owner: str, rule: ClaimRule
                             ) -> Task | None: ...

    @abc.abstractmethod
    def submit_in(self, connection: Any, task: NewTask) -> bool: ...

    @abc.abstractmethod
    async def _claim(self, owner: str, limit: int, rules: Mapping[str, ClaimRule]
                     ) -> list[Task]: ...

    @abc.abstractmethod
    async def apply(self, transition: Transition) -> bool: ...

    @abc.abstractmethod
    async def watch(self, wake: Callable[[float], None]) -> None: ...

    @abc.abstractmethod
    def on_finished(self, finished: Callable[[str], None]) -> Callable[[], None]: ...

    @abc.abstractmethod
    async def close(self) -> None: ...

    def closes_on(self, loop: asyncio.AbstractEventLoop) -> bool:
        return False  # (a dialect whose connections live on one loop says which)

    # ------------------------------------------------------------ client
    async def get(self, task_id: str) -> Task | None:
        found = await self._fetch_tasks("select_task", {"task_id": task_id})
        return found[0] if found else None

    async def list_tasks(self, query: TaskQuery) -> list[Task]:
        rows = await self._fetch(query.statement(), query.params())
        return [task_from_row(row) for row in rows]

    async def task_counts(self) -> dict[TaskState, int]:
        rows = await self._fetch("count_tasks", {})
        return {TaskState(row["state"]): row["tasks"] for row in rows}

    async def ended_per_minute(self, since: float) -> dict[int, dict[TaskState, int]]:
        rows = await self._fetch("count_ended", {"since": since})
        found: dict[int, dict[TaskState, int]] = {}
        for row in rows:
            found.setdefault(row["minute"], {})[TaskState(row["state"])] = row["tasks"]
        return found

    async def history(self, task_id: str) -> list[HistoryEntry]:
        rows = await self._fetch("select_history", {"task_id": task_id})
        return [HistoryEntry(task_id=task_id, **row) for row in rows]

    async def alerts(self, *, limit: int = 100, after: int = 0) -> list[Alert]:
        rows = await self._fetch("select_alerts", {"after": after, "limit": limit})
        return [alert_from_row(row) for row in rows]

    async def alert(self, alert_id: int) -> Alert | None:
        rows = await self._fetch("select_alert", {"id": alert_id})
        return alert_from_row(rows[0]) if rows else None

    async def acknowledge_alert(self, alert_id: int, *, by: str, why: str) -> Alert | None:
        await self._write(lambda now: [("acknowledge_alert",
                                        {"id": alert_id, "by": by, "why": why, "now": now})])
        return await self.alert(alert_id)

    # ------------------------------------------------------------ scheduler
    async def claim(self, owner: str, limit: int, rules: Mapping[str, ClaimRule]
                    ) -> list[Task]:
        if not rules or limit <= 0:
            return []
        return await self._claim(owner, limit, rules)

    # ------------------------------------------------------------ supervisor
    async def expired(self, limit: int, workflows: Collection[str] | None = None
                      ) -> list[Task]:
        params = {"now": self.now(), "limit": limit}
        if workflows is None:
            return await self._fetch_tasks("select_expired", params)
        return await self._fetch_tasks("select_expired_of",
                                       {**params, "workflows": list(workflows)})

    async def next_expiry(self, workflows: Collection[str] | None = None) -> float | None:
        if workflows is None:
            rows = await self._fetch("next_expiry", {})
        else:
            # (`now`: PostgreSQL moves up the supervisor's bounds that have passed)
            rows = await self._fetch("next_expiry_of", {"workflows": list(workflows),
                                                        "now": self.now()})
        due = rows[0]["due"] if rows else None
        return None if due is None else float(due)

    async def orphaned(self, limit: int, workflows: Collection[str] | None = None
                       ) -> list[Task]:
        return await self._fetch_tasks("select_orphaned", {
            "now": self.now(), "limit": limit,
            "workflows": None if workflows is None else list(workflows)})

    async def acquire_lease(self, name: str, holder: str, ttl: float) -> int | None:
        # safe to repeat: taking or renewing a lease we hold is the same write
        [rows] = await self._write(lambda now: [("acquire_lease", {
            "name": name, "holder": holder, "expires_at": now + ttl, "now": now})])
        held = rows[0] if rows else None
        return int(held["epoch"]) if held is not None and held["holder"] == holder else None

    async def census(self) -> Census:
        versions = await self._fetch("census_versions", {})
        agents = await self._fetch("census_agents", {})
        return Census(
            versions={(r["workflow"], r["version"]): r["tasks"] for r in versions},
            agents={(r["workflow"], r["version"], r["agent"]): r["tasks"] for r in agents})

    async def incidents(self) -> list[Alert]:
        rows = await self._fetch("select_open_incidents", {})
        return sorted((alert_from_row(row) for row in rows), key=lambda a: a.id)

    async def report_incidents(self, raised: Collection[Alert], resolved: Collection[str]
                               ) -> None:
        def statements(now: float) -> list[Statement]:
            return [*(("resolve_incident", {"now": now, "incident": incident})
                      for incident in [*resolved, *(a.incident for a in raised)]),
                    *(("insert_incident", incident_params(alert, now)) for alert in raised)]

        if raised or resolved:  # repeated after a lost commit: at worst an alert twice
            await self._write(statements)

    async def instances(self, *, instance_id: str | None = None) -> list[Instance]:
        rows = await self._fetch("select_instances", {"instance_id": instance_id})
        return [instance_from_row(row) for row in rows]

    async def forget_instances(self, before: float) -> int:
        # safe to repeat: what the first try deleted is not there to delete again
        [gone] = await self._write(lambda now: [("forget_instances", {"before": before})])
        return len(gone)

    # ------------------------------------------------------------ instances (R2)
    async def beat(self, instance: Instance, *, first: bool = False) -> None:
        # the same row again: safe to repeat
        await self._write(lambda now: [("beat", instance_params(instance, now, first))])

    async def stopped(self, instance_id: str) -> None:
        await self._write(lambda now: [("mark_stopped",
                                        {"instance_id": instance_id, "now": now})])

    # ------------------------------------------------------------ outbox (E11)
    async def take_outbox(self, queues: Collection[str] | None, limit: int
                          ) -> list[OutboxMessage]:
        names = None if queues is None else list(queues)
        if names == []:
            return []
        # repeating it after a lost commit only leases more: they go out when it ends
        [rows] = await self._write(lambda now: [("lease_outbox", {
            "until": now + OUTBOX_LEASE_S, "now": now, "queues": names, "limit": limit})])
        return sorted((OutboxMessage(id=r["id"], queue=r["queue"], body=bytes(r["body"]))
                       for r in rows), key=lambda m: m.id)

    async def ack_outbox(self, ids: Collection[int]) -> None:
        if ids:
            await self._write(lambda now: [("delete_outbox", {"ids": list(ids)})])

    # ------------------------------------------------------------ alert delivery (E8)
    async def take_alert_deliveries(self, webhooks: Collection[str], limit: int, *,
                                    lease: float, attempts: int, max_age: float
                                    ) -> list[AlertDelivery]:
        labels = list(webhooks)
        if not labels or limit <= 0:
            return []

        def statements(now: float) -> list[Statement]:
            bounds = {"now": now, "oldest": now - max_age, "max_tries": attempts}
            return [("settle_alerts", {**bounds, "webhooks": labels}),
                    *(("take_alert_delivery", {**bounds, "url": label, "until": now + lease,
                                               "limit": limit}) for label in labels)]

        # repeated after a lost commit, it takes others: those of the first try are
        # leased, and go out once their lease ends (as the outbox's)
        [_, *per_webhook] = await self._write(statements)
        taken = [row for rows in per_webhook for row in rows]
        if not taken:
            return []
        rows = await self._fetch("select_alerts_of",
                                 {"ids": sorted({row["alert_id"] for row in taken})})
        alerts = {alert.id: alert for alert in map(alert_from_row, rows)}
        return sorted((AlertDelivery(alert=alerts[row["alert_id"]], url=row["url"],
                                     attempt=row["tries"])
                       for row in taken if row["alert_id"] in alerts),
                      key=lambda d: (d.alert.id, d.url))

    async def record_alert_delivery(self, delivery: AlertDelivery, *,
                                    error: str | None = None,
                                    retry_at: float | None = None) -> bool:
        def statements(now: float) -> list[Statement]:
            return [("record_alert_delivery", {
                "alert_id": delivery.alert.id, "url": delivery.url,
                "attempt": delivery.attempt, "error": error,
                "delivered_at": now if error is None else None,
                "gave_up_at": now if error is not None and retry_at is None else None,
                "due_at": now if retry_at is None else retry_at})]

        # repeated after a lost commit, the fence finds it written and writes nothing
        [written] = await self._write(statements)
        return bool(written)

    async def alert_deliveries(self, alert_id: int) -> list[DeliveryRecord]:
        rows = await self._fetch("select_alert_deliveries", {"alert_id": alert_id})
        return [DeliveryRecord(**row) for row in rows]

    # ------------------------------------------------------------ dead letters (R3)
    async def add_dead_letter(self, letter: DeadLetter) -> None:
        # keyed by its id: safe to repeat
        await self._write(lambda now: [("insert_dead_letter", letter_params(letter))])

    async def dead_letters(self, *, limit: int = 100) -> list[DeadLetter]:
        rows = await self._fetch("oldest_dead_letters", {"limit": limit})
        return [letter_from_row(row) for row in rows]

    async def dead_letter(self, letter_id: str) -> DeadLetter | None:
        rows = await self._fetch("one_dead_letter", {"id": letter_id})
        return letter_from_row(rows[0]) if rows else None

    async def purge_dead_letters(self) -> int:
        [gone] = await self._write(lambda now: [("purge_dead_letters", {})])
        return len(gone)
