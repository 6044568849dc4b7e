-- sasflow schema 8 on PostgreSQL: alerts delivered to webhooks (SPEC E8; as SQLite's
-- 0007_alert_delivery.sql, which says why).

ALTER TABLE alerts ADD COLUMN delivery_done_at double precision;
UPDATE alerts SET delivery_done_at = at;
CREATE INDEX alerts_undelivered ON alerts (id) WHERE delivery_done_at IS NULL;

CREATE TABLE alert_deliveries (
    alert_id     bigint NOT NULL,              -- alerts.id
    url          text NOT NULL,                -- as redact() shows it
    tries        integer NOT NULL,             -- POSTs taken, the one in flight included
    due_at       double precision NOT NULL,    -- not taken again before: a lease, a backoff
    delivered_at double precision,             -- the receiver answered 2xx
    gave_up_at   double precision,             -- refused (4xx), or out of attempts or time
    last_error   text,                         -- the last failed attempt's
    PRIMARY KEY (alert_id, url)
);
