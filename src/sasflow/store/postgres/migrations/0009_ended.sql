-- sasflow schema 9 on PostgreSQL: the dashboard's throughput (SPEC U4; as SQLite's
-- 0008_ended.sql). The tasks that ended, by when: a range scan of the last hour's,
-- kept only for tasks in an end state, so a step's update never writes to it.
CREATE INDEX tasks_ended ON tasks (updated_at)
    WHERE state IN ('cancelled', 'compensated', 'error', 'processed');
