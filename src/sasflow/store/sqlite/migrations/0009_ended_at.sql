-- sasflow schema 9: when a task ended, set once as it ends (rows.task_values), for the
-- dashboard's throughput. `updated_at` changes with every step, and on PostgreSQL an
-- index over a column a step changes is written at every step (its 0010).
ALTER TABLE tasks ADD COLUMN ended_at REAL;
UPDATE tasks SET ended_at = updated_at
    WHERE state IN ('cancelled', 'compensated', 'error', 'processed');
DROP INDEX tasks_ended;
CREATE INDEX tasks_ended ON tasks (ended_at)
    WHERE state IN ('cancelled', 'compensated', 'error', 'processed');
