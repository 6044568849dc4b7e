"""The distributed state store: PostgreSQL through psycopg 3 (SPEC S10, M1, M3, E1).

Why psycopg 3 (rather than asyncpg): native asyncio with a maintained pool
(psycopg_pool.AsyncConnectionPool), server-side parameter binding, pipeline mode,
COPY and LISTEN/NOTIFY, and one driver for the sync and async sides, so
`submit_in` can join an application's ordinary psycopg transaction (E1). It is
maintained by the author of psycopg2.

* claim: per workflow `SELECT ... FOR UPDATE SKIP LOCKED LIMIT n`, then the
  claim transitions applied in the same transaction, so concurrent schedulers on
  any number of hosts take disjoint tasks without waiting (M1).
* apply and submit: group-committed (commit.py): the writes waiting when a
  transaction starts share one bulk statement (bulk.py), and a write whose
  commit's answer was lost is found again by its token, so no write is lost or
  applied twice by a restart.
* wake-ups (wake.py): work made claimable NOTIFYs in its transaction, heard by
  `watch`; a batch that ends tasks NOTIFYs their ids, heard by `on_finished`,
  and one that wrote status messages says so, heard by `watch_outbox`.
* connections, faults and the database's clock: connections.py.

Times are seconds since the epoch (double precision) so the planner is the same
for every store. Migrations run at open under an advisory lock (migrations.py).

The URL is a libpq one: ``postgresql://user@host:5432/db``; to keep the tables
in a schema of their own add ``?options=-csearch_path%3DNAME``.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import psycopg

from sasflow.errors import ConfigurationError
from sasflow.model import Task
from sasflow.redact import redact, scrub
from sasflow.store import queries
from sasflow.store.interfaces import ClaimRule
from sasflow.store.postgres.backoff import Backoff
from sasflow.store.postgres.bulk import (
    Claimed,
    Notices,
    Outcome,
    Write,
    insert_sync,
    needs_transaction,
    new_token,
    write_batch,
    written,
)
from sasflow.store.postgres.commit import GroupCommit
from sasflow.store.postgres.connections import Connections, Lost
from sasflow.store.postgres.reads import (
    GuestReads,
    ReadBatch,
    read_of,
    read_text_of,
    tasks_of_rows,
    tasks_with_steps,
)
from sasflow.store.postgres.wake import (
    CommitNotices,
    FinishedListener,
    listen_for_statuses,
    listen_for_work,
)
from sasflow.store.records import NewTask
from sasflow.store.rows import (
    Row,
    check_legal,
    claim_transition,
    claimed_at_submission,
)
from sasflow.store.sql_store import SQLStore, Statement
from sasflow.transition import Transition

__all__ = ["PostgresStore"]

log = logging.getLogger("sasflow.store.postgres")

_Q = queries.load("postgres", "pyformat")
# statements that answer with rows (in pipeline mode a cursor cannot tell before its
# result has come, and asking would cost a round trip of its own)
_ANSWERS = frozenset(name for name, text in _Q.items()
                     if text.startswith(("SELECT", "WITH")) or "RETURNING" in text)


class PostgresStore(SQLStore):
    """Tasks, steps, history, alerts, outbox and leases in one PostgreSQL database."""

    def __init__(self, conninfo: str, *, clock: Callable[[], float] | None = None,
                 create: bool = True, pool_size: int = 10,
                 reconnect_for: float | None = None, stalled_after: float | None = None,
                 answer_within: float | None = None) -> None:
        self._db = Connections(conninfo, clock=clock, create=create, pool_size=pool_size)
        if reconnect_for is not None:
            self._db.reconnect_for = reconnect_for
        if answer_within is not None:  # (seconds a call waits for the server's answers)
            self._db.answer_within = answer_within
        if stalled_after is not None:  # (seconds in one transaction that make it stalled)
            self._db.stalled.after = stalled_after
        self.conninfo = conninfo
        self._commit: GroupCommit[Write, bool] | None = None
        self._notices = CommitNotices(self._db)
        self._reads: ReadBatch | None = None
        self._finished = FinishedListener(conninfo, self._db.connect_timeout(),
                                          self._db.answer_within)
        self._guests = GuestReads(
            conninfo, statement=read_text_of, setup=_Q["session_setup"],
            rows_to_tasks=tasks_of_rows,
            connect_timeout=self._db.connect_timeout(), answer_within=self._db.answer_within,
            fallback=lambda ids: self._db.at_home(lambda: self._read_at_home(ids)))
        self._db.on_new_home(self._new_home)

    @classmethod
    def from_url(cls, url: str, *, clock: Callable[[], float] | None = None,
                 create: bool = True) -> PostgresStore:
        if url.startswith("postgres:"):  # libpq knows both schemes; keep one spelling
            url = "postgresql:" + url[len("postgres:"):]
        try:
            psycopg.conninfo.conninfo_to_dict(url)
        except psycopg.ProgrammingError as error:
            raise ConfigurationError(f"bad PostgreSQL URL {redact(url)!r}: {scrub(str(error), url)}"
                                     ) from None  # the cause quotes the URL
        return cls(url, clock=clock, create=create)

    # the settings and state that callers see
    @property
    def reconnect_for(self) -> float:
        """How long a call waits for a lost database to come back (seconds)."""
        return self._db.reconnect_for

    @reconnect_for.setter
    def reconnect_for(self, seconds: float) -> None:
        self._db.reconnect_for = seconds

    @property
    def answer_within(self) -> float:
        """Seconds a call waits for the server's answers before giving its connection
        up as lost (silent.py)."""
        return self._db.answer_within

    @property
    def schema_checked(self) -> bool:
        """Whether this store has checked its schema (its first use): until then a
        blocking submission goes through the loop, whose opening of the store waits out
        an outage (own_connection.py)."""
        return self._db.schema_ready

    @property
    def migrations_applied(self) -> list[str]:
        return self._db.migrations_applied

    @property
    def outage(self) -> Any:
        return self._db.outage

    def now(self) -> float:
        return self._db.now()

    def _new_home(self) -> None:
        self._commit = GroupCommit(self._write_batch)
        self._reads = ReadBatch(self._read_at_home)

    async def _run(self, job: Any, **how: Any) -> Any:
        return await self._db.at_home(lambda: self._db.run(job, **how))

    # ------------------------------------------------------------ statements
    async def _fetch(self, name: str, params: Mapping[str, Any]) -> Sequence[Row]:
        async def job(conn: psycopg.AsyncConnection[Any]) -> list[Row]:
            return await (await conn.execute(_Q[name], params)).fetchall()

        rows: list[Row] = await self._run(job, transaction=False)
        return rows

    async def _fetch_tasks(self, name: str, params: Mapping[str, Any]) -> list[Task]:
        return tasks_of_rows(await self._fetch(name, params))

    async def _write(self, statements: Callable[[float], Sequence[Statement]]
                     ) -> list[Sequence[Row]]:
        async def job(conn: psycopg.AsyncConnection[Any]) -> list[Sequence[Row]]:
            results: list[Sequence[Row]] = []
            for name, params in statements(self.now()):  # (now: after the clock's measure)
                cursor = await conn.execute(_Q[name], params)
                results.append(await cursor.fetchall() if name in _ANSWERS else [])
            return results

        answer: list[Sequence[Row]] = await self._run(job)
        return answer

    # ------------------------------------------------------------ writing
    async def _write_batch(self, batch: Sequence[Write]) -> list[Outcome]:
        """One group-commit batch, written exactly once, whatever the connection does."""
        backoff = self._db.backoff()
        outcomes: dict[str, Outcome] = {}
        pending = list(batch)
        while pending:
            token = new_token()
            try:
                done = await self._write_once(pending, token, backoff)
            except Lost as lost:
                found = await self._written([w.task_id for w in pending], token, backoff, lost)
                if found:  # it committed: what applied is what carries its token
                    for write in pending:
                        if isinstance(write, Transition) or write.task_id in found:
                            outcomes[write.task_id] = write.task_id in found
                    # a submission without it existed already: ask again to learn why
                    pending = [w for w in pending if w.task_id not in outcomes]
                if pending:
                    await backoff.wait(None)  # (not written: write it again)
                continue
            outcomes.update(zip((w.task_id for w in pending), done, strict=True))
            pending = []
        return [outcomes[write.task_id] for write in batch]

    async def _write_once(self, batch: Sequence[Write], token: int, backoff: Backoff
                          ) -> list[Outcome]:
        notices = Notices()

        async def job(conn: psycopg.AsyncConnection[Any]) -> list[Outcome]:
            nonlocal notices
            notices = Notices()  # (run again after a conflict)
            return await write_batch(conn, batch, token, self.now(), notices=notices)

        outcomes = await self._db.run(job, transaction=needs_transaction(batch),
                                      lost="raise", backoff=backoff)
        if notices:
            self._notices.tell(notices)
        if self._db.plans.due(len(batch)):
            await self._db.replan()
        return outcomes

    async def _written(self, task_ids: Sequence[str], token: int, backoff: Backoff,
                       lost: Lost) -> set[str]:
        """After a lost answer: which of these tasks the write with `token` wrote."""
        backoff.note(lost)
        found: set[str] = await self._db.run(lambda conn: written(conn, task_ids, token),
                                             transaction=False, backoff=backoff)
        if found:
            log.warning("a write's answer was lost (%s); it had committed", lost)
        return found

    def _group_commit(self, write: Write) -> Awaitable[bool]:
        """What became of `write` once its batch committed: on the open pool's home loop
        the batch's future itself (a coroutine between a step and its write would live as
        long as the write, walked by the collector); else the way there."""
        if self._db.open_here():
            assert self._commit is not None
            return self._commit.enqueue(write)
        return self._db.at_home(functools.partial(self._enqueue_at_home, write))

    def _enqueue_at_home(self, write: Write) -> Awaitable[bool]:
        """(On the home loop.) `write` queued there, the store opened first if it is not."""
        assert self._commit is not None
        if self._db.opened:  # (a future: handed to another loop with no task around it)
            return self._commit.enqueue(write)

        async def opened_first() -> bool:
            assert self._commit is not None
            await self._db.open(self._db.backoff())
            return await self._commit(write)

        return opened_first()

    # ------------------------------------------------------------ reading
    async def get(self, task_id: str) -> Task | None:
        """Concurrent reads share one statement; a read from another loop than the
        pool's is answered on a connection of that loop (reads.py)."""
        if self._db.opened and not self._db.is_home(asyncio.get_running_loop()):
            return await self._guests.get(task_id)

        async def read() -> Task | None:
            assert self._reads is not None
            return await self._reads(task_id)

        return await self._db.at_home(read)

    async def _read_at_home(self, task_ids: Sequence[str]) -> list[Task]:
        return await self._fetch_tasks(*read_of(task_ids))

    # ------------------------------------------------------------ submission
    async def submit(self, task: NewTask, *, connection: Any = None) -> bool:
        if isinstance(connection, psycopg.AsyncConnection):
            [outcome] = await write_batch(connection, [task], new_token(), self.now())
            if isinstance(outcome, Exception):
                raise outcome
            return outcome
        if connection is not None:
            return self.submit_in(connection, task)
        return await self._group_commit(task)

    async def submit_claimed(self, task: NewTask, owner: str, rule: ClaimRule
                             ) -> Task | None:
        now = self.now()
        claim, claimed = claimed_at_submission(rule, task, owner, now)
        if not await self._group_commit(Claimed(task, claim)):
            return None
        return claimed

    def submit_claimed_in(self, connection: psycopg.Connection[Any], task: NewTask, owner: str,
                          rule: ClaimRule) -> Task | None:
        """`submit_claimed` with the caller's connection (the blocking submit's own), in
        its transaction: one statement. Only once the schema is checked
        (`schema_checked`): the blocking submit goes through the loop before."""
        now = self.now()
        claim, claimed = claimed_at_submission(rule, task, owner, now)
        return claimed if insert_sync(connection, Claimed(task, claim), now) else None

    def submit_in(self, connection: Any, task: NewTask) -> bool:
        """Write the task with the caller's psycopg connection, in its transaction (E1).

        Nothing is committed here: the task commits, or rolls back, with the
        caller's own rows (and schedulers are notified only if it commits).
        """
        if not isinstance(connection, psycopg.Connection):
            raise ConfigurationError(
                "connection must be a psycopg.Connection to the store's database")
        if not self._db.schema_ready:  # the caller's transaction may be the store's first use
            self._db.ensure_schema()
        return insert_sync(connection, task, self.now())

    # ------------------------------------------------------------ scheduler
    async def _claim(self, owner: str, limit: int, rules: Mapping[str, ClaimRule]
                     ) -> list[Task]:
        # only the versions declared here (R4): (workflow, version) of each rule
        shapes = [{"workflow": name, "version": rule.version} for name, rule in rules.items()]
        token = new_token()
        locked: list[str] = []

        async def job(conn: psycopg.AsyncConnection[Any]) -> list[Task]:
            now = self.now()
            rows: list[Row] = []
            async with conn.cursor() as cur:
                for shape in shapes:
                    await cur.execute(_Q["select_claimable"], {**shape, "now": now,
                                                               "limit": limit})
                    rows.extend(await cur.fetchall())
            if not rows:  # nothing written: no WAL flush at commit
                return []
            if len(shapes) > 1:  # the earliest runnable first, whatever their workflow;
                # the rows left over are unlocked again at commit
                rows = sorted(rows, key=lambda row: row["available_at"])[:limit]
            tasks = await tasks_with_steps(conn, rows)
            planned = [claimed for task in tasks
                       if (claimed := claim_transition(rules[task.workflow], task, owner, now))]
            tasks = [task for _, task in planned]  # as claimed
            transitions = [transition for transition, _ in planned]
            locked[:] = [task.task_id for task in tasks]
            applied = await write_batch(conn, transitions, token, now) if transitions else []
            return [task for task, ok in zip(tasks, applied, strict=True) if ok is True]

        async def claim_here() -> list[Task]:
            backoff = self._db.backoff()
            try:
                return await self._db.run(job, lost="raise", backoff=backoff)
            except Lost as lost:
                # the answer was lost: the claim committed if its token is there
                found = await self._written(locked, token, backoff, lost) if locked else set()
                if not found:
                    return []
                claimed = await self._fetch_tasks("select_tasks", {"task_ids": list(found)})
                return [task for task in claimed if task.locked_by == owner]

        return await self._db.at_home(claim_here)

    async def apply(self, transition: Transition) -> bool:
        check_legal(transition)  # refused before it can share a batch with others
        return await self._group_commit(transition)

    # ------------------------------------------------------------ wake-ups
    def on_finished(self, finished: Callable[[str], None]) -> Callable[[], None]:
        """Call `finished(task_id)`, from another thread, when a commit by any process
        ends a task (wake.py: LISTEN on a connection of its own); returns the
        unsubscribe."""
        return self._finished.subscribe(finished)

    async def watch(self, wake: Callable[[float], None]) -> None:
        await listen_for_work(self.conninfo, self._db, wake)

    async def watch_outbox(self, written: Callable[[], None]) -> None:
        await listen_for_statuses(self.conninfo, self._db, written)

    def closes_on(self, loop: asyncio.AbstractEventLoop) -> bool:
        # the pool lives on the loop that first used it, and is closed there
        return self._db.lives_on(loop)

    async def close(self) -> None:
        self._commit = self._reads = None
        await self._notices.sent()
        await asyncio.to_thread(self._finished.close)
        await self._guests.close()
        await self._db.close()
