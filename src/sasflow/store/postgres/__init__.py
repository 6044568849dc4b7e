"""The PostgreSQL store: the verbs of sql_store.py over PostgreSQL (store.py)."""

from sasflow.store.postgres.store import PostgresStore

__all__ = ["PostgresStore"]
