-- sasflow schema 5 on PostgreSQL: each instance's heartbeat lease (as SQLite's
-- 0004_instance_lease.sql). Gone once beat_at + lease < the database's clock.
ALTER TABLE instances ADD COLUMN lease double precision NOT NULL DEFAULT 10.0;
