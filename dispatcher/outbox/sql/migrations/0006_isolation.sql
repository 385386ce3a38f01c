-- 0006: a crashed batch is not a verdict on all its rows, and claims skip rows not yet due.
--
-- suspect: the row was in a batch that never settled, together with other rows. Nobody knows
-- which of them (if any) killed the enqueuer, so none is charged an attempt; they come back
-- after a short jittered delay and are claimed one per batch (a probe, journalled with
-- probe = true). Only a probe that does not settle counts an attempt, for its single row: the
-- row that kills every enqueuer still reaches the DLQ, and its batch-mates go out uncharged.
--
-- The claim used to walk idx_outbox_pending_next in created_at order and filter on
-- next_attempt_at, reading every row scheduled for later (not_before, retries backing off) on
-- every claim. Now rows due at once (next_attempt_at IS NULL) and rows scheduled for a time
-- have an index each, keyed by what the claim orders them by, so a claim reads only due rows.

-- On a live table: lock_timeout bounds how long the application's INSERTs queue behind this
-- migration's lock on outbox while it waits for a long transaction; past it the run rolls
-- back and `dispatcher migrate` tries again (dispatcher/outbox/schema.py).
SET LOCAL lock_timeout = '5s';

ALTER TABLE outbox ADD COLUMN IF NOT EXISTS suspect BOOLEAN NOT NULL DEFAULT false;
ALTER TABLE outbox_batches ADD COLUMN IF NOT EXISTS probe BOOLEAN NOT NULL DEFAULT false;

CREATE INDEX IF NOT EXISTS idx_outbox_fresh ON outbox (created_at)
    WHERE status IN ('PENDING', 'RETRY') AND next_attempt_at IS NULL AND NOT suspect;
CREATE INDEX IF NOT EXISTS idx_outbox_scheduled ON outbox (next_attempt_at)
    WHERE status IN ('PENDING', 'RETRY') AND next_attempt_at IS NOT NULL AND NOT suspect;
CREATE INDEX IF NOT EXISTS idx_outbox_suspect ON outbox (next_attempt_at)
    WHERE status IN ('PENDING', 'RETRY') AND suspect;
DROP INDEX IF EXISTS idx_outbox_pending_next;
