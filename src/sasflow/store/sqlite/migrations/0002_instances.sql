-- sasflow schema 2: the running worker instances, each with what it declares.
-- A worker writes its row when it starts and beats it (beat_at, on the store's
-- clock) while its roles make progress. Health probes read one row; supervisors
-- read them all to tell work that no running instance can take.

CREATE TABLE instances (
    instance_id TEXT PRIMARY KEY,
    host        TEXT NOT NULL,
    pid         INTEGER NOT NULL,
    roles       TEXT NOT NULL,            -- JSON array: scheduler, agent, supervisor
    agents      TEXT NOT NULL,            -- JSON array: the agents it serves
    workflows   TEXT NOT NULL,            -- JSON object: workflow name -> version
    started_at  REAL NOT NULL,
    beat_at     REAL NOT NULL,            -- last heartbeat
    stopped_at  REAL                      -- a clean shutdown; NULL while it runs
);
CREATE INDEX instances_beat ON instances (beat_at)
