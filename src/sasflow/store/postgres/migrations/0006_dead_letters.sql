-- sasflow on PostgreSQL: messages no consumer could handle (SPEC R3), for the
-- in-process transport (as SQLite's 0005_dead_letters.sql).

CREATE TABLE dead_letters (
    id          text PRIMARY KEY,             -- time-ordered
    queue       text NOT NULL,                -- the queue it was taken from
    reason      text NOT NULL,                -- the error of its last delivery
    deliveries  integer NOT NULL,
    first_seen  double precision NOT NULL,    -- its first failed delivery
    at          double precision NOT NULL,    -- when it was dead-lettered
    body        bytea NOT NULL
);
CREATE INDEX dead_letters_at ON dead_letters (at);
