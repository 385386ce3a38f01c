-- 0004: a batch is claimed by the row locks of one short transaction, not by a status.
--
-- The enqueuer locks due rows (FOR UPDATE SKIP LOCKED), publishes them and deletes them in the
-- same transaction. If it crashes or hangs, PostgreSQL ends the transaction (the client is
-- gone, or idle_in_transaction_session_timeout fires) and the rows are simply unlocked, still
-- PENDING: no status to reset, and a late write by the old enqueuer cannot happen because its
-- transaction no longer exists. Claiming by UPDATE to IN_FLIGHT, then deleting, cost a write
-- per row more and needed a time-based reset.
--
-- What a rollback cannot record is the attempt: a row that kills every enqueuer that takes it
-- would be retried for ever. So each batch writes a journal row (in its own, autocommitted
-- statement) naming its transaction and rows, and deletes it in the transaction that settles
-- the batch. A journal row whose transaction is no longer in progress belongs to a batch that
-- never settled: maintenance counts an attempt for its rows (dead-lettering the exhausted).
-- UNLOGGED: no WAL for this bookkeeping; after a PostgreSQL crash it is empty, which only
-- forgets the attempts of the batches open at that moment.
--
-- Bounded lock waits (added later, for databases still upgrading from before it): DROP INDEX
-- takes the table's ACCESS EXCLUSIVE lock, and the application's INSERTs queue behind its
-- request while it waits; past lock_timeout (5 s) the run fails, changes nothing, and
-- `dispatcher migrate` tries again. The setting is put back at the end.
SELECT set_config('outbox.lock_timeout_before_0004', current_setting('lock_timeout'), true);
SET LOCAL lock_timeout = '5s';
CREATE UNLOGGED TABLE IF NOT EXISTS outbox_batches (
    token      UUID PRIMARY KEY,
    xact       xid8 NOT NULL,
    ids        TEXT[] NOT NULL,
    enqueuer   TEXT NOT NULL,
    started_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- Rows an earlier enqueuer left claimed or sent under the old scheme.
DELETE FROM outbox WHERE status = 'SENT';
UPDATE outbox
   SET status = 'RETRY', next_attempt_at = now(), claim_token = NULL, claimed_at = NULL,
       updated_at = now()
 WHERE status = 'IN_FLIGHT';
DROP INDEX IF EXISTS idx_outbox_in_flight;

SELECT set_config('lock_timeout', current_setting('outbox.lock_timeout_before_0004'), true);
