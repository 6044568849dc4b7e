-- sasflow schema 6: what the operator's list and alerts need (SPEC U4).

-- A page of the task list, newest or oldest first, of every state or of one: one
-- ordered range scan however many tasks the store holds (keyset pagination,
-- store/listing.py). SQLite updates an index only when its columns change, so these
-- cost a submission two entries and a step nothing. tasks_state (state, workflow,
-- version) stays: it answers the supervisor's census from the index alone.
CREATE INDEX tasks_created ON tasks (created_at, task_id);
CREATE INDEX tasks_listed ON tasks (state, created_at, task_id);

-- An operator acknowledges an alert: who, when and why. An acknowledged alert is
-- not delivered again.
ALTER TABLE alerts ADD COLUMN acknowledged_at REAL;
ALTER TABLE alerts ADD COLUMN acknowledged_by TEXT;
ALTER TABLE alerts ADD COLUMN acknowledged_why TEXT;
