-- sasflow schema 10 on PostgreSQL: fewer index entries a step. A task's row is
-- rewritten at every step, and each rewrite adds an entry to every index of the
-- table whose predicate it meets: PostgreSQL skips them (a HOT update) only when no
-- indexed column changed and the page has room. So:
-- - tasks_locked goes: tasks_expiring (workflow, complete_by), over the same locked
--   tasks, serves the supervisor, which always asks by workflow (R4); a look across
--   all workflows (a health probe) reads its entries whole;
-- - the dashboard's throughput reads `ended_at`, set once as a task ends (as SQLite's
--   0009_ended_at.sql), not `updated_at`, which every step changes. complete_by, which
--   tasks_expiring needs ordered, is now the one indexed column a step changes
--   (tests/contract/test_postgres_index_writes.py);
-- - step pages keep 30% free, for a step row's new versions on its own page: it has
--   one index, on columns that never change;
-- - history, append-only and read by task, keeps its one index (task_id, id):
--   nothing looks an entry up by id alone.
ALTER TABLE tasks ADD COLUMN ended_at double precision;
UPDATE tasks SET ended_at = updated_at
    WHERE state IN ('cancelled', 'compensated', 'error', 'processed');
DROP INDEX tasks_ended;
CREATE INDEX tasks_ended ON tasks (ended_at)
    WHERE state IN ('cancelled', 'compensated', 'error', 'processed');

DROP INDEX tasks_locked;

ALTER TABLE steps SET (fillfactor = 70);
ALTER TABLE history DROP CONSTRAINT history_pkey;
