-- sasflow schema 7: alerts delivered to webhooks (SPEC E8, alert_delivery.py).

-- When the deliverer was done with an alert: sent to (or given up for) every webhook,
-- acknowledged, or too old to send. Alerts raised before this version count as done:
-- a first webhook is not sent the whole history. The partial index holds the alerts
-- still pending, so finding them costs what they are, not what the table holds.
ALTER TABLE alerts ADD COLUMN delivery_done_at REAL;
UPDATE alerts SET delivery_done_at = at;
CREATE INDEX alerts_undelivered ON alerts (id) WHERE delivery_done_at IS NULL;

-- One alert's delivery to one webhook, named by its URL as redact() shows it (no
-- credential is written here).
CREATE TABLE alert_deliveries (
    alert_id     INTEGER NOT NULL,         -- alerts.id
    url          TEXT NOT NULL,
    tries        INTEGER NOT NULL,         -- POSTs taken, the one in flight included
    due_at       REAL NOT NULL,            -- not taken again before: a lease, a backoff
    delivered_at REAL,                     -- the receiver answered 2xx
    gave_up_at   REAL,                     -- refused (4xx), or out of attempts or time
    last_error   TEXT,                     -- the last failed attempt's
    PRIMARY KEY (alert_id, url)
)
