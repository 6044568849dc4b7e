-- sasflow schema 4 on PostgreSQL: tasks carry their workflow's version, and alerts
-- may be about an incident rather than one task (as SQLite's 0003_versions.sql).
-- Rows written before get their version from their own steps, computed in Python
-- right after this script (store/rows.py: versions_of).

ALTER TABLE tasks ADD COLUMN version text;

DROP INDEX tasks_claimable;
CREATE INDEX tasks_claimable ON tasks (workflow, version, available_at)
    WHERE locked_by IS NULL AND state IN ('pending', 'compensating');

CREATE INDEX tasks_expiring ON tasks (workflow, complete_by) WHERE locked_by IS NOT NULL;

DROP INDEX tasks_state;
CREATE INDEX tasks_state ON tasks (state, workflow, version);

ALTER TABLE alerts ALTER COLUMN task_id DROP NOT NULL;
ALTER TABLE alerts ADD COLUMN incident text, ADD COLUMN count integer,
                   ADD COLUMN resolved_at double precision;
CREATE INDEX alerts_open ON alerts (incident) WHERE incident IS NOT NULL AND resolved_at IS NULL;
