-- sasflow: messages no consumer could handle (SPEC R3), for the in-process
-- transport, whose queues die with their process: each dead letter is kept
-- here, where `sasflow dead-letters` reads it. A broker keeps its own.

CREATE TABLE dead_letters (
    id          TEXT PRIMARY KEY,         -- time-ordered
    queue       TEXT NOT NULL,            -- the queue it was taken from
    reason      TEXT NOT NULL,            -- the error of its last delivery
    deliveries  INTEGER NOT NULL,
    first_seen  REAL NOT NULL,            -- its first failed delivery
    at          REAL NOT NULL,            -- when it was dead-lettered
    body        BLOB NOT NULL
);
CREATE INDEX dead_letters_at ON dead_letters (at)
