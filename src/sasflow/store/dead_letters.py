"""The dead letters of the in-process transport, kept in the store (SPEC R3).

In-process queues die with their process, so a message none of their consumers
could handle is written here, where `sasflow dead-letters` finds it from any
process. The statements are the same for both databases but for how they name
parameters: SQLite's ``:name``, psycopg's ``%(name)s``.
"""

from __future__ import annotations

from typing import Any

from sasflow.transport.dead_letter import DeadLetter

__all__ = [
    "INSERT",
    "PURGE",
    "SELECT_OLDEST",
    "SELECT_ONE",
    "letter_from_row",
    "letter_params",
    "postgres",
]

_COLUMNS = "id, queue, reason, deliveries, first_seen, at, body"

# a repeated insert (a retried commit) changes nothing
INSERT = (f"INSERT INTO dead_letters ({_COLUMNS}) VALUES"
          " (:id, :queue, :reason, :deliveries, :first_seen, :at, :body)"
          " ON CONFLICT (id) DO NOTHING")
SELECT_OLDEST = f"SELECT {_COLUMNS} FROM dead_letters ORDER BY at, id LIMIT :limit"
SELECT_ONE = f"SELECT {_COLUMNS} FROM dead_letters WHERE id = :id"
PURGE = "DELETE FROM dead_letters"


def postgres(statement: str) -> str:
    """`statement` with psycopg's parameter markers."""
    for name in ("id", "queue", "reason", "deliveries", "first_seen", "at", "body", "limit"):
        statement = statement.replace(f":{name}", f"%({name})s")
    return statement


def letter_params(letter: DeadLetter) -> dict[str, Any]:
    return {"id": letter.id, "queue": letter.queue, "reason": letter.reason,
            "deliveries": letter.deliveries, "first_seen": letter.first_seen,
            "at": letter.at, "body": letter.body}


def letter_from_row(row: tuple[Any, ...]) -> DeadLetter:
    letter_id, queue, reason, deliveries, first_seen, at, body = row
    return DeadLetter(id=letter_id, queue=queue, reason=reason, deliveries=deliveries,
                      first_seen=first_seen, at=at, body=bytes(body))
