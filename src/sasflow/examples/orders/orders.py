"""The example application's own table of orders, in the store's own database.

An order row and its task commit in ONE transaction (E1), and an agent reads the
order by the task's id (E4). The table lives where the store does, the SQLite file
of ``sqlite:///...`` or the PostgreSQL database of ``postgresql://...``, since
only then can both commit together.

``python -m sasflow.examples.orders.orders --orders N`` places N orders into the
store named by ``$SASFLOW_STORE``: how orders reach workers that run the example
on PostgreSQL (deploy/compose.yaml, the systemd units, the Kubernetes manifests).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sqlite3
import sys
import threading
import uuid
from collections.abc import Container, Iterable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from sasflow import App, PermanentError

__all__ = ["ORDERS_SCHEMA", "WORKFLOW", "Order", "place_orders", "read_order", "sample_orders"]

WORKFLOW = "process-order"

# Portable SQL: the same table on SQLite and PostgreSQL.
ORDERS_SCHEMA = """
CREATE TABLE IF NOT EXISTS orders (
    order_ref TEXT PRIMARY KEY,  -- = the task id
    order_id  INTEGER NOT NULL,
    amount    REAL NOT NULL,
    card      TEXT NOT NULL
)"""

_SELECT_ORDER = "SELECT order_id, amount, card FROM orders WHERE order_ref = %s"
_INSERT_ORDER = "INSERT INTO orders VALUES (%s, %s, %s, %s)"


@dataclass(frozen=True)
class Order:
    order_ref: str  # the task's id (E2)
    order_id: int
    amount: float
    card: str  # "declined" makes the payment service refuse it


def _store_url() -> str:
    return os.environ.get("SASFLOW_STORE", "sqlite:///sasflow.db")


def _on_postgres(url: str) -> bool:
    return url.startswith(("postgresql:", "postgres:"))


def _sqlite_path(url: str) -> str:
    return urlsplit(url).path.removeprefix("/")


class _Readers(threading.local):
    """Each thread's read-only connections, by store URL."""

    def __init__(self) -> None:
        self.by_url: dict[str, Any] = {}


_readers = _Readers()


def _reader(url: str) -> Any:
    """This thread's read-only connection to the store's database."""
    opened = _readers.by_url
    db = opened.get(url)
    if db is None:
        if _on_postgres(url):
            import psycopg

            db = psycopg.connect(url, autocommit=True)
        else:
            db = sqlite3.connect(f"file:{_sqlite_path(url)}?mode=ro", uri=True, timeout=30.0)
        opened[url] = db
    return db


def read_order(order_ref: str) -> dict[str, Any]:
    """E4: an agent reads the order's details itself, by the task's id."""
    url = _store_url()
    sql = _SELECT_ORDER if _on_postgres(url) else _SELECT_ORDER.replace("%s", "?")
    row = _reader(url).execute(sql, (order_ref,)).fetchone()
    if row is None:
        raise PermanentError(f"no order {order_ref}")
    return {"order_id": row[0], "amount": row[1], "card": row[2]}


def place_orders(app: App, orders: Iterable[Order]) -> None:
    """E1: each order row and its task commit together, in one transaction."""
    url = app.store_url or _store_url()
    with _writer(url) as (db, insert, transaction):
        for order in orders:
            with transaction():  # commits both, or neither
                db.execute(insert, (order.order_ref, order.order_id, order.amount,
                                    order.card))
                # E4: the task carries only the order's id; agents read the rest
                app.submit(WORKFLOW, {"order_id": order.order_id}, task_id=order.order_ref,
                           connection=db)


@contextlib.contextmanager
def _writer(url: str) -> Iterator[tuple[Any, str, Any]]:
    """A connection to the store's database with the orders table, its INSERT, and
    how to open a transaction on it."""
    if _on_postgres(url):
        import psycopg

        with psycopg.connect(url, autocommit=True) as pg:
            pg.execute(ORDERS_SCHEMA)
            yield pg, _INSERT_ORDER, pg.transaction
        return
    with contextlib.closing(sqlite3.connect(_sqlite_path(url), timeout=30.0)) as db:
        db.execute(ORDERS_SCHEMA)
        db.commit()
        yield db, _INSERT_ORDER.replace("%s", "?"), lambda: db


def sample_orders(count: int, *, prefix: str, declined: Container[int] = ()) -> list[Order]:
    """Orders 1..`count` with varied amounts, ids `prefix` + n; the cards of the
    orders numbered in `declined` will be refused."""
    return [Order(f"{prefix}{n}", n, round(5 + (n * 37 % 500) + n % 100 / 100, 2),
                  "declined" if n in declined else "ok")
            for n in range(1, count + 1)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sasflow.examples.orders.orders",
        description="Place example orders (order row + task in one transaction) into the"
                    " store named by $SASFLOW_STORE.")
    parser.add_argument("--orders", type=int, default=10, help="how many (default 10)")
    parser.add_argument("--decline-every", type=int, default=20,
                        help="every Nth order's card is declined (0: none; default 20)")
    args = parser.parse_args(argv)
    if args.orders < 1 or args.decline_every < 0:
        parser.error("--orders must be >= 1 and --decline-every >= 0")
    from sasflow.examples.orders.app import build_app

    app = build_app()
    prefix = f"order-{uuid.uuid4().hex[:6]}-"
    try:
        every = args.decline_every
        place_orders(app, sample_orders(args.orders, prefix=prefix, declined=range(
            every, args.orders + 1, every) if every else ()))
    except Exception as error:  # a missing schema, an unreachable database: one line
        print(f"placing orders failed: {error}", file=sys.stderr)
        return 1
    finally:
        app.close()
    print(f"placed {args.orders} orders {prefix}1 .. {prefix}{args.orders}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
