-- sasflow schema 10 on PostgreSQL: a step's write updates its task row in place.
-- PostgreSQL rewrites a row on its own page without touching any index (a HOT
-- update) only when no indexed column changes and the page has room. A step
-- changes the task's complete_by and updated_at and nothing else indexed, so:
-- - the dashboard's throughput reads `ended_at`, set once, when the task ends
--   (as SQLite's 0009_ended_at.sql), not `updated_at`;
-- - the supervisor finds the tasks in flight by their workflow, not by their
--   complete-by: the index holds only locked tasks, and its sweep reads each of
--   them (as many as the schedulers run at once), where every step of every task
--   wrote two entries to the complete-by indexes before;
-- - task and step pages keep 30% free for the rows' new versions;
-- - history, append-only and read by task, keeps its one index (task_id, id):
--   nothing looks an entry up by id alone.
ALTER TABLE tasks ADD COLUMN ended_at double precision;
UPDATE tasks SET ended_at = updated_at
    WHERE state IN ('cancelled', 'compensated', 'error', 'processed');
DROP INDEX tasks_ended;
CREATE INDEX tasks_ended ON tasks (ended_at)
    WHERE state IN ('cancelled', 'compensated', 'error', 'processed');

DROP INDEX tasks_locked;
DROP INDEX tasks_expiring;
CREATE INDEX tasks_locked ON tasks (workflow) WHERE locked_by IS NOT NULL;

ALTER TABLE tasks SET (fillfactor = 70);
ALTER TABLE steps SET (fillfactor = 70);
ALTER TABLE history DROP CONSTRAINT history_pkey;
