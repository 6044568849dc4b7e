"""What the layer under the store costs per statement: raw driver, a thin layer, SQLAlchemy.

The store's hot statements, each run N times in a row inside one transaction on
one held connection, by every layer in turn, on a fresh SQLite file and on a fresh
PostgreSQL schema (async there, as the store is):

- ``get``: the primary-key SELECT of one task row (sql.TASK_COLUMNS, 16 columns),
  every column then read by the layer's own access (index, key or attribute);
- ``fence``: the fenced UPDATE of one transition (sql.APPLY_TRANSITION; on
  PostgreSQL its one-row form), the scheduler's case (no lease); it must apply;
- ``history``: the INSERT of one history row (sql.INSERT_HISTORY).

Layers: ``raw`` (today's code: positional `?` / `%s`, tuples), ``thin`` (the same
statement with named parameters, rows by name: sqlite3.Row; psycopg dict_row, and
``thin_nt`` namedtuple_row), ``sa_text`` (SQLAlchemy `text()` with bound parameters,
row._mapping) and ``sa_core`` (select/update/insert constructs built once, SQLAlchemy's
compiled cache, rows by attribute). Parameters are built before the clock starts, so
the figures are the layer's: execute, fetch, read. µs per statement, wall
(perf_counter) and CPU of this process (process_time; PostgreSQL's server work is not
in it), median of --rounds; the order of the layers rotates each round.

Usage: python bench/store_layer.py [--n 2000] [--rounds 5] [--dbs sqlite,pg]
PostgreSQL: BENCH_STORE_LAYER_PG (default postgresql://postgres@127.0.0.1:5432/test);
a schema of its own, dropped at the end. Needs the `bench` extra (SQLAlchemy).
Prints one JSON line; the table in markdown on stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import sqlite3
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import closing, contextmanager
from importlib import resources
from typing import Any

import common as C

try:
    import greenlet  # noqa: F401  (SQLAlchemy's asyncio extension runs on it)
    import sqlalchemy as sa
    from sqlalchemy.ext.asyncio import create_async_engine
except ImportError as missing:
    sys.exit(f"store_layer.py needs SQLAlchemy with asyncio ({missing.name} is missing):"
             " pip install -e '.[bench]'")

import psycopg
from psycopg.rows import dict_row, namedtuple_row, tuple_row

from sasflow.store import pg_sql, sql

PG_URL = os.environ.get("BENCH_STORE_LAYER_PG") or "postgresql://postgres@127.0.0.1:5432/test"
STATEMENTS = ("get", "fence", "history")
OWNER, VERSION, EPOCH = "w1", "v1", 7

# ---------------------------------------------------------------- the statements
# raw: the store's own text where it has one statement per row (SQLite; PostgreSQL's
# SELECT); the PostgreSQL store writes transitions and history in batches
# (pg_sql.APPLY_TRANSITIONS), so their one-row forms are sql.py's in PostgreSQL's words.
PG_FENCE_POSITIONAL = """
UPDATE tasks SET state = %s, phase = %s, cursor = %s, locked_by = %s, complete_by = %s,
                 available_at = %s, failure_count = %s, error = %s,
                 epoch = %s, updated_at = %s, version = %s
WHERE task_id = %s AND epoch = %s AND state = %s AND locked_by IS NOT DISTINCT FROM %s::text
  AND phase = %s AND cursor = %s AND version IS NOT DISTINCT FROM %s::text
  AND (%s::float8 IS NULL OR complete_by < %s)
  AND (%s::text IS NULL OR EXISTS (SELECT 1 FROM leases WHERE name = %s AND holder = %s
                                   AND epoch = %s))
"""
PG_HISTORY_POSITIONAL = sql.INSERT_HISTORY.replace("?", "%s")

# thin: named blocks; `:name` for sqlite3 and SQLAlchemy's text(), `%(name)s` for psycopg.
NAMED_GET = f"SELECT {sql.TASK_COLUMNS} FROM tasks WHERE task_id = :task_id"
NAMED_HISTORY = """
INSERT INTO history (task_id, step, phase, at, actor, epoch, from_state, to_state, why)
VALUES (:task_id, :step, :phase, :at, :actor, :epoch, :from_state, :to_state, :why)
"""
_NAMED_FENCE = """
UPDATE tasks SET state = :state, phase = :phase, cursor = :cursor, locked_by = :locked_by,
                 complete_by = :complete_by, available_at = :available_at,
                 failure_count = :failure_count, error = :error,
                 epoch = :new_epoch, updated_at = :updated_at, version = :version
WHERE task_id = :task_id AND epoch = :epoch AND state = :from_state
  AND locked_by {same} {owner} AND phase = :from_phase AND cursor = :from_cursor
  AND version {same} {from_version}
  AND ({expired_before} IS NULL OR complete_by < :expired_before)
  AND ({lease} IS NULL OR EXISTS (SELECT 1 FROM leases WHERE name = :lease
                                  AND holder = :lease_holder AND epoch = :lease_epoch))
"""
SQLITE_NAMED_FENCE = _NAMED_FENCE.format(
    same="IS", owner=":owner", from_version=":from_version",
    expired_before=":expired_before", lease=":lease")
# PostgreSQL needs the types of parameters that may be NULL; text() reads `:x::text`
# as no parameter, hence CAST.
PG_TEXT_FENCE = _NAMED_FENCE.format(
    same="IS NOT DISTINCT FROM", owner="CAST(:owner AS text)",
    from_version="CAST(:from_version AS text)",
    expired_before="CAST(:expired_before AS float8)", lease="CAST(:lease AS text)")


def pyformat(named: str) -> str:
    """A `:name` block in psycopg's `%(name)s` words (CAST(:x AS t) works in both)."""
    return re.sub(r"(?<![:\w]):(\w+)", r"%(\1)s", named)


PG_NAMED = {"get": pyformat(NAMED_GET), "fence": pyformat(PG_TEXT_FENCE),
            "history": pyformat(NAMED_HISTORY)}

# sa_core: the tables as SQLAlchemy sees them (only what the statements touch), and
# the statements built once; one construct for both dialects.
META = sa.MetaData()
TASKS = sa.Table(
    "tasks", META,
    sa.Column("task_id", sa.Text, primary_key=True), sa.Column("workflow", sa.Text),
    sa.Column("input", sa.Text), sa.Column("state", sa.Text), sa.Column("phase", sa.Text),
    sa.Column("cursor", sa.Integer), sa.Column("locked_by", sa.Text),
    sa.Column("complete_by", sa.Float), sa.Column("available_at", sa.Float),
    sa.Column("failure_count", sa.Integer), sa.Column("epoch", sa.BigInteger),
    sa.Column("reply_to", sa.Text), sa.Column("error", sa.Text),
    sa.Column("created_at", sa.Float), sa.Column("updated_at", sa.Float),
    sa.Column("version", sa.Text))
LEASES = sa.Table("leases", META, sa.Column("name", sa.Text, primary_key=True),
                  sa.Column("holder", sa.Text), sa.Column("epoch", sa.BigInteger))
HISTORY = sa.Table(
    "history", META, sa.Column("id", sa.BigInteger, primary_key=True),
    sa.Column("task_id", sa.Text), sa.Column("step", sa.Text), sa.Column("phase", sa.Text),
    sa.Column("at", sa.Float), sa.Column("actor", sa.Text), sa.Column("epoch", sa.BigInteger),
    sa.Column("from_state", sa.Text), sa.Column("to_state", sa.Text), sa.Column("why", sa.Text))


def _param(name: str, kind: Any = sa.Text) -> Any:
    return sa.bindparam(name, type_=kind)


CORE_GET = sa.select(TASKS).where(TASKS.c.task_id == _param("task_id"))
CORE_FENCE = (
    sa.update(TASKS)
    .where(TASKS.c.task_id == _param("k_task_id"), TASKS.c.epoch == _param("epoch", sa.BigInteger),
           TASKS.c.state == _param("from_state"),
           TASKS.c.locked_by.is_not_distinct_from(_param("owner")),
           TASKS.c.phase == _param("from_phase"),
           TASKS.c.cursor == _param("from_cursor", sa.Integer),
           TASKS.c.version.is_not_distinct_from(_param("from_version")),
           # SQLAlchemy casts a text or integer parameter for psycopg, not a float one
           sa.or_(sa.cast(_param("expired_before", sa.Float), sa.Float).is_(None),
                  TASKS.c.complete_by < _param("expired_before", sa.Float)),
           sa.or_(_param("lease").is_(None), sa.exists().where(
               LEASES.c.name == _param("lease"), LEASES.c.holder == _param("lease_holder"),
               LEASES.c.epoch == _param("lease_epoch", sa.BigInteger))))
    .values(state=_param("state"), phase=_param("phase"), cursor=_param("cursor", sa.Integer),
            locked_by=_param("locked_by"), complete_by=_param("complete_by", sa.Float),
            available_at=_param("available_at", sa.Float),
            failure_count=_param("failure_count", sa.Integer), error=_param("error"),
            epoch=_param("new_epoch", sa.BigInteger), updated_at=_param("updated_at", sa.Float),
            version=_param("version")))
CORE_HISTORY = sa.insert(HISTORY)

# ---------------------------------------------------------------- the parameters


def fence_params(task_id: str, now: float) -> dict[str, Any]:
    """A transition that keeps the task where it is (same epoch, state and owner), so
    the fence holds on every pass; only updated_at changes."""
    return {"state": "running", "phase": "do", "cursor": 0, "locked_by": OWNER,
            "complete_by": now + 300.0, "available_at": now, "failure_count": 0,
            "error": None, "new_epoch": EPOCH, "updated_at": now, "version": VERSION,
            "task_id": task_id, "epoch": EPOCH, "from_state": "running", "owner": OWNER,
            "from_phase": "do", "from_cursor": 0, "from_version": VERSION,
            "expired_before": None, "lease": None, "lease_holder": None, "lease_epoch": None}


def fence_positional(p: dict[str, Any]) -> tuple[Any, ...]:
    """sql.APPLY_TRANSITION's order: the new values, then the fence."""
    return (p["state"], p["phase"], p["cursor"], p["locked_by"], p["complete_by"],
            p["available_at"], p["failure_count"], p["error"], p["new_epoch"],
            p["updated_at"], p["version"], p["task_id"], p["epoch"], p["from_state"],
            p["owner"], p["from_phase"], p["from_cursor"], p["from_version"],
            p["expired_before"], p["expired_before"], p["lease"], p["lease"],
            p["lease_holder"], p["lease_epoch"])


def history_params(task_id: str, now: float) -> dict[str, Any]:
    return {"task_id": task_id, "step": "a", "phase": "do", "at": now, "actor": OWNER,
            "epoch": EPOCH, "from_state": "pending", "to_state": "running", "why": "claimed"}


class Params:
    """Every statement's parameters for one pass, in each layer's shape: `positional`
    (tuples in the statement's order), `named` (dicts), `core` (dicts as update()
    names them)."""

    def __init__(self, ids: list[str]) -> None:
        now = time.time()
        fences = [fence_params(t, now) for t in ids]
        histories = [history_params(t, now) for t in ids]
        self.args: dict[tuple[str, str], list[Any]] = {
            ("get", "positional"): [(t,) for t in ids],
            ("get", "named"): [{"task_id": t} for t in ids],
            ("fence", "positional"): [fence_positional(f) for f in fences],
            ("fence", "named"): fences,
            # update() SETs every column a parameter is named after: the WHERE's
            # task_id goes by another name there
            ("fence", "core"): [{**{k: v for k, v in f.items() if k != "task_id"},
                                 "k_task_id": f["task_id"]} for f in fences],
            ("history", "positional"): [tuple(h.values()) for h in histories],
            ("history", "named"): histories}
        self.args[("get", "core")] = self.args[("get", "named")]
        self.args[("history", "core")] = self.args[("history", "named")]


# ---------------------------------------------------------------- reading a row


def by_index(r: Any) -> tuple[Any, ...]:
    return (r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[8], r[9], r[10], r[11],
            r[12], r[13], r[14], r[15])


def by_key(r: Any) -> tuple[Any, ...]:
    return (r["task_id"], r["workflow"], r["input"], r["state"], r["phase"], r["cursor"],
            r["locked_by"], r["complete_by"], r["available_at"], r["failure_count"],
            r["epoch"], r["reply_to"], r["error"], r["created_at"], r["updated_at"],
            r["version"])


def by_attr(r: Any) -> tuple[Any, ...]:
    return (r.task_id, r.workflow, r.input, r.state, r.phase, r.cursor, r.locked_by,
            r.complete_by, r.available_at, r.failure_count, r.epoch, r.reply_to, r.error,
            r.created_at, r.updated_at, r.version)


def by_mapping(r: Any) -> tuple[Any, ...]:
    return by_key(r._mapping)


def check_row(values: tuple[Any, ...], task_id: str) -> None:
    assert values[0] == task_id and values[6] == OWNER, values


def check_applied(rowcount: int) -> None:
    assert rowcount == 1, "the fence must hold on every pass"


# ---------------------------------------------------------------- schema and rows


def migrations(dialect: str) -> list[str]:
    folder = resources.files("sasflow.store.migrations") / dialect
    return [f.read_text() for f in sorted(folder.iterdir(), key=lambda f: f.name)
            if f.name.endswith(".sql")]


TASK_ROW = ("INSERT INTO tasks (task_id, workflow, input, state, phase, cursor, locked_by,"
            " complete_by, available_at, failure_count, epoch, created_at, updated_at,"
            " version) VALUES (?, 'wf3', '{}', 'running', 'do', 0, ?, ?, ?, 0, ?, ?, ?, ?)")


def task_ids(n: int) -> list[str]:
    return [f"t{i:06d}" for i in range(n)]


def task_rows(ids: list[str]) -> list[tuple[Any, ...]]:
    now = time.time()
    return [(t, OWNER, now + 300.0, now, EPOCH, now, now, VERSION) for t in ids]


# ---------------------------------------------------------------- one timed pass
Sample = tuple[float, float]  # (wall µs, CPU µs) per statement


@contextmanager
def clock(n: int, into: list[Sample]) -> Iterator[None]:
    wall, cpu = time.perf_counter(), time.process_time()
    yield
    into.append(((time.perf_counter() - wall) / n * 1e6, (time.process_time() - cpu) / n * 1e6))


# A layer: run one statement kind over the pass's rows, in one transaction (SQLite's
# blocking passes are awaited as one step each, so both databases share run_rounds).
SqlitePass = Callable[[str, Params, list[str]], None]
AsyncPass = Callable[[str, Params, list[str]], Awaitable[None]]


def awaitable(run: SqlitePass) -> AsyncPass:
    async def pass_(kind: str, p: Params, ids: list[str]) -> None:
        run(kind, p, ids)
    return pass_


def sqlite_layers(path: str) -> tuple[dict[str, SqlitePass], Callable[[], None]]:
    """Each layer's pass and its close, on connections of its own to the file."""

    def connect(row_factory: Any = None) -> sqlite3.Connection:
        conn = sqlite3.connect(path, isolation_level=None)
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.row_factory = row_factory
        return conn

    raw, thin = connect(), connect(sqlite3.Row)

    def driver_pass(conn: sqlite3.Connection, named: bool) -> SqlitePass:
        get, fence, history = ((NAMED_GET, SQLITE_NAMED_FENCE, NAMED_HISTORY) if named
                               else (sql.SELECT_TASK, sql.APPLY_TRANSITION, sql.INSERT_HISTORY))
        read = by_key if named else by_index
        shape = "named" if named else "positional"

        def run(kind: str, p: Params, ids: list[str]) -> None:
            args = p.args[(kind, shape)]
            conn.execute("BEGIN")
            if kind == "get":
                for task_id, one in zip(ids, args, strict=True):
                    check_row(read(conn.execute(get, one).fetchone()), task_id)
            elif kind == "fence":
                for one in args:
                    check_applied(conn.execute(fence, one).rowcount)
            else:
                for one in args:
                    conn.execute(history, one)
            conn.execute("COMMIT")
        return run

    engine = sa.create_engine(f"sqlite+pysqlite:///{path}", poolclass=sa.pool.NullPool)
    sa_conns = [engine.connect(), engine.connect()]
    for conn in sa_conns:
        conn.exec_driver_sql("PRAGMA synchronous=NORMAL")
        conn.commit()

    def sa_pass(conn: sa.Connection, core: bool) -> SqlitePass:
        get, fence, history = ((CORE_GET, CORE_FENCE, CORE_HISTORY) if core else
                               (sa.text(NAMED_GET), sa.text(SQLITE_NAMED_FENCE),
                                sa.text(NAMED_HISTORY)))
        read = by_attr if core else by_mapping
        shape = "core" if core else "named"

        def run(kind: str, p: Params, ids: list[str]) -> None:
            args = p.args[(kind, shape)]
            with conn.begin():
                if kind == "get":
                    for task_id, one in zip(ids, args, strict=True):
                        check_row(read(conn.execute(get, one).fetchone()), task_id)
                elif kind == "fence":
                    for one in args:
                        check_applied(conn.execute(fence, one).rowcount)
                else:
                    for one in args:
                        conn.execute(history, one)
        return run

    def close() -> None:
        raw.close()
        thin.close()
        for conn in sa_conns:
            conn.close()
        engine.dispose()

    return {"raw": driver_pass(raw, False), "thin": driver_pass(thin, True),
            "sa_text": sa_pass(sa_conns[0], False), "sa_core": sa_pass(sa_conns[1], True)}, close


def measure_sqlite(n: int, rounds: int) -> dict[str, Any]:
    folder = C.scratch_dir("store_layer", f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")
    path = os.path.join(folder, "store.db")
    ids = task_ids(n)
    with closing(sqlite3.connect(path, isolation_level=None)) as conn:
        conn.execute("PRAGMA journal_mode=WAL")  # as the store opens its file
        for script in migrations("sqlite"):
            conn.executescript(script)
        conn.executemany(TASK_ROW, task_rows(ids))
    layers, close = sqlite_layers(path)
    try:
        return asyncio.run(run_rounds({name: awaitable(run) for name, run in layers.items()},
                                      ids, n, rounds))
    finally:
        close()
        C.remove_db(path)
        os.rmdir(folder)




# ---------------------------------------------------------------- PostgreSQL, async
async def pg_layers(schema: str) -> tuple[dict[str, AsyncPass], list[Callable[[], Any]]]:
    options = f"-c search_path={schema}"
    closers: list[Callable[[], Any]] = []

    async def connect(row_factory: Any) -> psycopg.AsyncConnection[Any]:
        conn = await psycopg.AsyncConnection.connect(PG_URL, options=options,
                                                     row_factory=row_factory)
        await conn.execute(pg_sql.SESSION_SETUP)
        await conn.commit()
        closers.append(conn.close)
        return conn

    def driver_pass(conn: psycopg.AsyncConnection[Any], named: bool,
                    read: Callable[[Any], tuple[Any, ...]]) -> AsyncPass:
        get, fence, history = ((PG_NAMED["get"], PG_NAMED["fence"], PG_NAMED["history"])
                               if named else
                               (pg_sql.SELECT_TASK, PG_FENCE_POSITIONAL, PG_HISTORY_POSITIONAL))
        shape = "named" if named else "positional"

        async def run(kind: str, p: Params, ids: list[str]) -> None:
            args = p.args[(kind, shape)]
            async with conn.transaction():
                if kind == "get":
                    for task_id, one in zip(ids, args, strict=True):
                        cur = await conn.execute(get, one)
                        check_row(read(await cur.fetchone()), task_id)
                elif kind == "fence":
                    for one in args:
                        check_applied((await conn.execute(fence, one)).rowcount)
                else:
                    for one in args:
                        await conn.execute(history, one)
        return run

    layers: dict[str, AsyncPass] = {
        "raw": driver_pass(await connect(tuple_row), False, by_index),
        "thin": driver_pass(await connect(dict_row), True, by_key),
        "thin_nt": driver_pass(await connect(namedtuple_row), True, by_attr)}

    engine = create_async_engine(PG_URL.replace("postgresql://", "postgresql+psycopg://"),
                                 connect_args={"options": options},
                                 poolclass=sa.pool.NullPool)

    async def sa_pass(core: bool) -> AsyncPass:
        conn = await engine.connect()
        closers.append(conn.close)
        await conn.exec_driver_sql(pg_sql.SESSION_SETUP)
        await conn.commit()
        get, fence, history = ((CORE_GET, CORE_FENCE, CORE_HISTORY) if core else
                               (sa.text(NAMED_GET), sa.text(PG_TEXT_FENCE),
                                sa.text(NAMED_HISTORY)))
        read = by_attr if core else by_mapping
        shape = "core" if core else "named"

        async def run(kind: str, p: Params, ids: list[str]) -> None:
            args = p.args[(kind, shape)]
            async with conn.begin():
                if kind == "get":
                    for task_id, one in zip(ids, args, strict=True):
                        check_row(read((await conn.execute(get, one)).fetchone()), task_id)
                elif kind == "fence":
                    for one in args:
                        check_applied((await conn.execute(fence, one)).rowcount)
                else:
                    for one in args:
                        await conn.execute(history, one)
        return run

    layers["sa_text"] = await sa_pass(False)
    layers["sa_core"] = await sa_pass(True)
    closers.append(engine.dispose)
    return layers, closers


async def measure_pg_async(schema: str, n: int, rounds: int) -> dict[str, Any]:
    ids = task_ids(n)
    layers, closers = await pg_layers(schema)
    try:
        return await run_rounds(layers, ids, n, rounds)
    finally:
        for close in reversed(closers):
            await close()


def measure_pg(n: int, rounds: int) -> dict[str, Any]:
    schema = f"storebench_{os.getpid()}"
    with psycopg.connect(PG_URL, autocommit=True) as admin:
        admin.execute(f"CREATE SCHEMA {schema}")
        try:
            with psycopg.connect(PG_URL, options=f"-c search_path={schema}") as conn:
                for script in migrations("postgres"):
                    conn.execute(script.encode())  # several statements, no parameters
                with conn.cursor() as cur:
                    cur.executemany(TASK_ROW.replace("?", "%s"), task_rows(task_ids(n)))
            return asyncio.run(measure_pg_async(schema, n, rounds))
        finally:
            admin.execute(f"DROP SCHEMA {schema} CASCADE")


# ---------------------------------------------------------------- rounds and medians


def summary(samples: dict[str, dict[str, list[Sample]]]) -> dict[str, Any]:
    # the best round beside the median: on a shared machine the noise only adds
    return {layer: {kind: {"wall_us": round(statistics.median(w for w, _ in runs), 1),
                           "cpu_us": round(statistics.median(c for _, c in runs), 1),
                           "wall_best_us": round(min(w for w, _ in runs), 1),
                           "cpu_best_us": round(min(c for _, c in runs), 1),
                           "wall_runs_us": [round(w, 1) for w, _ in runs]}
                    for kind, runs in kinds.items()}
            for layer, kinds in samples.items()}


def rotated(names: list[str], by: int) -> list[str]:
    by %= len(names)
    return names[by:] + names[:by]


async def run_rounds(layers: dict[str, AsyncPass], ids: list[str], n: int,
                     rounds: int) -> dict[str, Any]:
    params = Params(ids)
    for warm in layers.values():  # caches, prepared and compiled statements, pages
        for kind in STATEMENTS:
            await warm(kind, params, ids)
    samples: dict[str, dict[str, list[Sample]]] = {name: {k: [] for k in STATEMENTS}
                                                   for name in layers}
    for r in range(rounds):
        for name in rotated(list(layers), r):
            for kind in STATEMENTS:
                with clock(n, samples[name][kind]):
                    await layers[name](kind, params, ids)
    return summary(samples)


def table(results: dict[str, Any]) -> str:
    """µs per statement, median of the rounds (best round in brackets)."""
    lines = ["| db | layer | " + " | ".join(f"{k} wall | {k} CPU" for k in STATEMENTS) + " |",
             "|---|---|" + "---:|" * (2 * len(STATEMENTS))]
    for db, layers in results.items():
        for layer, kinds in layers.items():
            lines.append(f"| {db} | {layer} | " + " | ".join(
                f"{m['wall_us']} ({m['wall_best_us']}) | {m['cpu_us']} ({m['cpu_best_us']})"
                for m in (kinds[k] for k in STATEMENTS)) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=2000, help="statements per pass")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--dbs", default="sqlite,pg")
    a = ap.parse_args()
    measure = {"sqlite": measure_sqlite, "pg": measure_pg}
    results = {db: measure[db](a.n, a.rounds) for db in a.dbs.split(",")}
    print(table(results), file=sys.stderr)
    C.emit({"peer": "sasflow", "bench": "store_layer", "n": a.n, "rounds": a.rounds,
            "sqlalchemy": sa.__version__, "psycopg": psycopg.__version__,
            "sqlite": sqlite3.sqlite_version, "results": results})


if __name__ == "__main__":
    main()
