-- sasflow schema 11 on PostgreSQL: a step's write updates its task row in place.
-- A task's row is rewritten at every step, with a new complete-by. While that column
-- was indexed (tasks_expiring), no rewrite could be made in place (a HOT update: no
-- index entry), so each step added an entry to every index of the table. The index
-- now holds `sweep_at`: no later than the task's complete-by, and left as it is by a
-- step whose complete-by is later (queries.sql, fragment `applied`). A claim sets it
-- to the first step's complete-by; the supervisor, when it has passed without the
-- task expiring, moves it up to the complete-by (next_expiry_of): one write per task
-- that runs past its first deadline, instead of index entries at every step. So the
-- sweep still costs what has expired, plus the tasks whose bound passed.
ALTER TABLE tasks ADD COLUMN sweep_at double precision;
UPDATE tasks SET sweep_at = complete_by WHERE locked_by IS NOT NULL;
DROP INDEX tasks_expiring;
CREATE INDEX tasks_expiring ON tasks (workflow, sweep_at) WHERE locked_by IS NOT NULL;
-- room on each page for a task row's new versions
ALTER TABLE tasks SET (fillfactor = 70);
