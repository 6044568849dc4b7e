-- sasflow schema 3: tasks carry their workflow's version (R4, M4), and an alert may
-- be about an incident (a workflow version or an agent that no running process
-- declares) rather than one task.
-- Rows written before get their version from their own steps, computed in Python
-- right after this script (store/rows.py: versions_of).

ALTER TABLE tasks ADD COLUMN version TEXT;

-- What schedulers poll: per workflow AND version, so a release never claims a task
-- planned for another shape.
DROP INDEX tasks_claimable;
CREATE INDEX tasks_claimable ON tasks (workflow, version, available_at)
    WHERE locked_by IS NULL AND state IN ('pending', 'compensating');

-- What the supervisor sweeps, per workflow it knows: tasks of a workflow no
-- process declares are never read, however many have expired.
CREATE INDEX tasks_expiring ON tasks (workflow, complete_by) WHERE locked_by IS NOT NULL;

-- The supervisor's census of unfinished work by workflow and version.
DROP INDEX tasks_state;
CREATE INDEX tasks_state ON tasks (state, workflow, version);

-- SQLite cannot drop a NOT NULL: the alerts table is rebuilt with task_id optional.
CREATE TABLE alerts_v3 (
    id          INTEGER PRIMARY KEY,
    task_id     TEXT,                 -- NULL for an incident's alert
    step        TEXT,
    agent       TEXT,
    at          REAL NOT NULL,
    message     TEXT NOT NULL,
    incident    TEXT,                 -- what the incident is about, e.g. workflow:NAME@VERSION
    count       INTEGER,              -- how many tasks it held when raised
    resolved_at REAL                  -- when it was gone (incidents only)
);
INSERT INTO alerts_v3 (id, task_id, step, agent, at, message)
    SELECT id, task_id, step, agent, at, message FROM alerts;
DROP TABLE alerts;
ALTER TABLE alerts_v3 RENAME TO alerts;
CREATE INDEX alerts_open ON alerts (incident) WHERE incident IS NOT NULL AND resolved_at IS NULL
