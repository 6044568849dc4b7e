"""The embedded SQLite store: the verbs of sql_store.py over SQLite (store.py)."""

from sasflow.store.sqlite.store import SQLiteStore

__all__ = ["SQLiteStore"]
