-- sasflow schema 8: the dashboard's throughput (SPEC U4). The tasks that ended, by
-- when: a range scan of the last hour's, with entries only for tasks in an end state.
CREATE INDEX tasks_ended ON tasks (updated_at)
    WHERE state IN ('cancelled', 'compensated', 'error', 'processed');
