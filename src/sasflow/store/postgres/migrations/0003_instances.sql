-- sasflow schema 3 on PostgreSQL: the running worker instances (as SQLite's
-- 0002_instances.sql). beat_at is on the database's clock.

CREATE TABLE instances (
    instance_id text PRIMARY KEY,
    host        text NOT NULL,
    pid         integer NOT NULL,
    roles       jsonb NOT NULL,               -- scheduler, agent, supervisor
    agents      jsonb NOT NULL,               -- the agents it serves
    workflows   jsonb NOT NULL,               -- workflow name -> version
    started_at  double precision NOT NULL,
    beat_at     double precision NOT NULL,    -- last heartbeat
    stopped_at  double precision              -- a clean shutdown; NULL while it runs
);
CREATE INDEX instances_beat ON instances (beat_at);
