-- sasflow schema 2 on PostgreSQL: each write names itself in the task rows it writes.
-- A write is one statement, so its result and its commit come back together; if the
-- connection dies before they arrive, the writer looks for its token here once the
-- database is back (store/pg_write.py): found, it committed; not found, it did not.
ALTER TABLE tasks ADD COLUMN last_write bigint;
