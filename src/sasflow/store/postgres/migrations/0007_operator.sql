-- sasflow schema 7 on PostgreSQL: what the operator's list and alerts need (SPEC U4;
-- as SQLite's 0006_operator.sql).

-- A page of the task list, by state, newest or oldest first: one ordered range scan
-- however many tasks the store holds (keyset pagination, store/listing.py). It takes
-- the place of (state, workflow, version): the supervisor's seldom census reads
-- those from the rows of the unfinished tasks instead, and every update of a task
-- keeps one index fewer than with both.
DROP INDEX tasks_state;
CREATE INDEX tasks_state ON tasks (state, created_at, task_id);

-- An operator acknowledges an alert: who, when and why. An acknowledged alert is
-- not delivered again.
ALTER TABLE alerts ADD COLUMN acknowledged_at double precision,
                   ADD COLUMN acknowledged_by text,
                   ADD COLUMN acknowledged_why text;
