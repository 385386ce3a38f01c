-- 0001: the outbox, its dead-letter table and the wake-up trigger (the layout existing outbox
-- writers share, plus a claim token so only the claimer of a row may delete or reschedule it).

-- On a live table: lock_timeout bounds how long the application's INSERTs queue behind this
-- migration's lock on outbox while it waits for a long transaction; past it the run rolls
-- back and `dispatcher migrate` tries again (dispatcher/outbox/schema.py).
SET LOCAL lock_timeout = '5s';

CREATE TABLE IF NOT EXISTS outbox (
    id              TEXT PRIMARY KEY,
    task_id         TEXT,
    stream          TEXT NOT NULL,
    payload         JSONB,
    type            TEXT,
    status          TEXT NOT NULL DEFAULT 'PENDING'
                    CHECK (status IN ('PENDING', 'RETRY', 'IN_FLIGHT', 'SENT', 'DLQ')),
    attempt_count   INT NOT NULL DEFAULT 0,
    max_retries     INT NOT NULL DEFAULT 5,
    next_attempt_at TIMESTAMPTZ,
    last_error      TEXT,
    backoff_seconds INT NOT NULL DEFAULT 5,
    created_at      TIMESTAMPTZ NOT NULL DEFAULT NOW(),
    updated_at      TIMESTAMPTZ NOT NULL DEFAULT NOW(),
    sent_at         TIMESTAMPTZ,
    claim_token     UUID,
    claimed_at      TIMESTAMPTZ
);

CREATE INDEX IF NOT EXISTS idx_outbox_status ON outbox (status, created_at);
-- Matches the claim query's filter and ORDER BY created_at.
CREATE INDEX IF NOT EXISTS idx_outbox_pending_next
    ON outbox (created_at) WHERE status IN ('PENDING', 'RETRY');
CREATE INDEX IF NOT EXISTS idx_outbox_task_id ON outbox (task_id) WHERE task_id IS NOT NULL;
-- Lets the maintenance loop find stale claims without scanning the table.
CREATE INDEX IF NOT EXISTS idx_outbox_in_flight
    ON outbox (claimed_at) WHERE status = 'IN_FLIGHT';

-- Rows are inserted and deleted within milliseconds: vacuum after a fixed number of dead
-- tuples, not a fraction of a table that is nearly always empty.
ALTER TABLE outbox SET (
    autovacuum_vacuum_scale_factor = 0.0,
    autovacuum_vacuum_threshold = 5000,
    autovacuum_vacuum_insert_scale_factor = 0.0,
    autovacuum_vacuum_insert_threshold = 5000,
    autovacuum_analyze_scale_factor = 0.0,
    autovacuum_analyze_threshold = 5000,
    autovacuum_vacuum_cost_delay = 0
);

CREATE TABLE IF NOT EXISTS outbox_dlq (
    id              TEXT PRIMARY KEY,
    task_id         TEXT,
    stream          TEXT NOT NULL,
    payload         JSONB,
    type            TEXT,
    last_error      TEXT,
    attempts        INT NOT NULL,
    max_retries     INT NOT NULL DEFAULT 5,
    backoff_seconds INT NOT NULL DEFAULT 5,
    created_at      TIMESTAMPTZ NOT NULL DEFAULT NOW(),
    moved_at        TIMESTAMPTZ NOT NULL DEFAULT NOW()
);

-- Wake outbox enqueuers (LISTEN outbox_new) when a transaction that inserted outbox rows
-- commits. Statement-level; PostgreSQL folds duplicate notifications within a transaction.
CREATE OR REPLACE FUNCTION composer_notify_outbox() RETURNS TRIGGER
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('outbox_new', '');
    RETURN NULL;
END;
$$;

DROP TRIGGER IF EXISTS outbox_notify ON outbox;
CREATE TRIGGER outbox_notify AFTER INSERT ON outbox
    FOR EACH STATEMENT EXECUTE FUNCTION composer_notify_outbox();
