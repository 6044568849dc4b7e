-- sasflow schema 1 on PostgreSQL: the same tables as SQLite's 0001_initial.sql.
-- Times are seconds since the epoch (double precision) on the store's clock, so the
-- planner computes deadlines the same way on every store.

CREATE TABLE tasks (
    task_id       text PRIMARY KEY,
    workflow      text NOT NULL,
    input         text NOT NULL,              -- JSON, kept as written
    state         text NOT NULL,
    phase         text NOT NULL DEFAULT 'do', -- do: forward; undo: compensating
    cursor        integer NOT NULL DEFAULT 0, -- the step being run or undone
    locked_by     text,
    complete_by   double precision,
    available_at  double precision NOT NULL,  -- not claimable before (backoff, park)
    failure_count integer NOT NULL DEFAULT 0,
    epoch         bigint NOT NULL DEFAULT 0,  -- fencing token, +1 on every claim
    reply_to      text,
    error         text,
    created_at    double precision NOT NULL,
    updated_at    double precision NOT NULL
);

-- What schedulers poll: only unlocked, runnable tasks, in the order they may run.
CREATE INDEX tasks_claimable ON tasks (workflow, available_at)
    WHERE locked_by IS NULL AND state IN ('pending', 'compensating');

-- What the supervisor sweeps: only locked tasks, so a sweep costs what is expired.
CREATE INDEX tasks_locked ON tasks (complete_by) WHERE locked_by IS NOT NULL;

CREATE INDEX tasks_state ON tasks (state, workflow);
CREATE INDEX tasks_created ON tasks (created_at, task_id);

-- One row per unit of work: a step (phase 'do') or its compensation ('undo').
CREATE TABLE steps (
    task_id         text NOT NULL,
    phase           text NOT NULL,
    idx             integer NOT NULL,
    name            text NOT NULL,
    agent           text NOT NULL,
    state           text NOT NULL,
    attempts        integer NOT NULL DEFAULT 0,
    failure_count   integer NOT NULL DEFAULT 0,
    complete_by     double precision,
    idempotency_key text NOT NULL,
    result          text,                      -- JSON
    error           text,
    in_doubt        integer NOT NULL DEFAULT 0,
    updated_at      double precision NOT NULL,
    PRIMARY KEY (task_id, phase, idx)
);

-- Append-only: every transition of a task or unit, who made it and why.
CREATE TABLE history (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    task_id    text NOT NULL,
    step       text,
    phase      text,
    at         double precision NOT NULL,
    actor      text NOT NULL,
    epoch      bigint NOT NULL,
    from_state text,
    to_state   text NOT NULL,
    why        text
);
CREATE INDEX history_task ON history (task_id, id);

CREATE TABLE alerts (
    id      bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    task_id text NOT NULL,
    step    text,
    agent   text,
    at      double precision NOT NULL,
    message text NOT NULL
);

-- Status messages written with the state change they report, relayed later (E11).
CREATE TABLE outbox (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue        text NOT NULL,
    body         bytea NOT NULL,
    created_at   double precision NOT NULL,
    leased_until double precision NOT NULL DEFAULT 0  -- a relay is publishing it until then
);
CREATE INDEX outbox_queue ON outbox (queue, id);

CREATE TABLE leases (
    name       text PRIMARY KEY,
    holder     text NOT NULL,
    epoch      bigint NOT NULL,
    expires_at double precision NOT NULL
);
