"""SQLite's connections: how the store's file is made, opened and read, and what
its errors mean.

The file and its -wal and -shm companions are readable by their owner only
(R5): the store creates the file 0600, and SQLite gives the companions the
file's own mode. A full disk or an I/O error is a StoreError naming the file,
never a raw sqlite3 error.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Callable, Mapping
from typing import Any

import msgspec

from sasflow.errors import StoreError
from sasflow.model import Phase, StepState, TaskState

__all__ = ["Checkpointer", "bind", "connect", "create_private", "store_error"]

_encode = msgspec.json.encode


def create_private(path: str) -> None:
    """Create the store's file readable by its owner only, unless it exists (R5)."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        pass
    except OSError as error:
        raise StoreError(f"cannot create SQLite store {path}: {error.strerror}") from error


def _bind_as_they_are() -> None:
    """Let NULLs, BLOBs and the model's states reach SQLite without the sqlite3
    module's adaptation search.

    Before binding a parameter that is not exactly an int, float or str, the module
    looks for an adapter: a miss in its registry, then ``__adapt__`` on its
    protocol class and ``__conform__`` on the value. On Python 3.11 the first of
    these formats an AttributeError and throws it away, about 1.2 µs each time,
    and a step binds some forty such values (its task's, steps' and history's
    None columns and states): 8% of the instructions of a step in
    `bench/observability.py` (docs/benchmarks.md). An adapter in the registry ends
    the search at its first look. These hand on what the miss would have bound:
    None as None (``{}.get`` answers None for it), bytes as themselves, a bool as
    1 or 0, and a state (a StrEnum) as its plain text. One the application registered for a
    type is left in place.
    """
    unchanged: dict[type, Callable[[Any], Any]] = {type(None): {}.get, bytes: bytes,
                                                   bool: int}
    for state in (TaskState, StepState, Phase):
        unchanged[state] = str.__str__
    for kind, adapter in unchanged.items():
        if (kind, sqlite3.PrepareProtocol) not in sqlite3.adapters:
            sqlite3.register_adapter(kind, adapter)


_bind_as_they_are()


def connect(path: str, synchronous: str) -> sqlite3.Connection:
    """A connection whose rows are read by column name (sqlite3.Row)."""
    try:
        conn = sqlite3.connect(path, timeout=30.0, isolation_level=None,
                               check_same_thread=False)
    except sqlite3.Error as error:
        raise StoreError(f"cannot open SQLite store {path}: {error}") from error
    conn.row_factory = sqlite3.Row
    conn.execute("PRAGMA busy_timeout = 30000")
    conn.execute(f"PRAGMA synchronous = {synchronous}")
    return conn


def bind(params: Mapping[str, Any]) -> Mapping[str, Any]:
    """Parameters as SQLite takes them: a list travels as JSON text (read by json_each)."""
    if not any(isinstance(value, list) for value in params.values()):
        return params
    return {name: _encode(value).decode() if isinstance(value, list) else value
            for name, value in params.items()}


# what a failing SQLite primary result code says about the store (the rest: "failed")
_WHY = {sqlite3.SQLITE_FULL: "is out of disk space", sqlite3.SQLITE_IOERR: "had an I/O error",
        sqlite3.SQLITE_CANTOPEN: "cannot be opened", sqlite3.SQLITE_READONLY: "is read-only",
        sqlite3.SQLITE_CORRUPT: "is corrupt", sqlite3.SQLITE_NOTADB: "is not a database",
        sqlite3.SQLITE_BUSY: "stayed locked", sqlite3.SQLITE_LOCKED: "stayed locked",
        sqlite3.SQLITE_PERM: "is not accessible"}


def store_error(path: str, error: BaseException) -> BaseException:
    """What SQLite raised, as sasflow's error when the cause is the store's, not ours."""
    if not isinstance(error, sqlite3.Error) or isinstance(error, sqlite3.ProgrammingError):
        return error
    code = getattr(error, "sqlite_errorcode", None)
    why = _WHY.get(code & 0xFF if isinstance(code, int) else -1, "failed")
    translated = StoreError(f"SQLite store {path} {why}: {error}")
    translated.__cause__ = error
    return translated


class Checkpointer:
    """Copies the WAL back into the database file in a thread of its own.

    SQLite's automatic checkpoint runs inside whichever commit crosses the
    threshold, on the writer's critical path; here it runs beside it (and,
    being C code that releases the GIL, on the other core). PASSIVE never blocks
    a writer or a reader.
    """

    _EVERY_S = 0.1

    def __init__(self, connect: Callable[[], sqlite3.Connection]) -> None:
        self._connect = connect
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sasflow-sqlite-checkpoint",
                                        daemon=True)
        self._thread.start()

    def _run(self) -> None:
        conn = self._connect()
        try:
            while not self._stop.wait(self._EVERY_S):
                try:
                    conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                except sqlite3.Error:  # busy or locked: the next round will do
                    continue
        finally:
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
