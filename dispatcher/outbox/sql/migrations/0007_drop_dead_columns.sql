-- 0007: drop what the claim by row locks (0004) left unused: claim_token, claimed_at, sent_at
-- and the statuses IN_FLIGHT and SENT. The outbox stores PENDING, RETRY and DLQ only.
--
-- Rows first, so every row still to be dispatched is kept: a row left IN_FLIGHT by an enqueuer
-- of the old scheme becomes RETRY, due at once, with no attempt charged (as 0004 did); a SENT
-- row was published already and goes, as the enqueuer deletes every row it publishes.
--
-- On a live table. Dropping a column only marks it dropped in the catalog (no table rewrite);
-- the new check reads the rows once, and the outbox holds only what waits to be published.
-- All of it needs the table's ACCESS EXCLUSIVE lock, taken first; lock_timeout bounds how long
-- the application's INSERTs queue behind this migration while it waits for a long transaction:
-- past 5 s it fails, changes nothing, and the next `dispatcher migrate` tries again. The
-- setting is put back at the end, for the migrations after this one in the same transaction.
--
-- Processes of the previous version still running meanwhile (a rolling upgrade):
--   * an enqueuer since 0004 never reads or writes these columns or statuses: it keeps
--     claiming, publishing and settling as before;
--   * enqueue_dispatch of any version names only columns that remain: applications go on;
--   * `dispatcher dlq replay` of a version before this migration still writes claim_token:
--     it fails with "column claim_token does not exist" and replays nothing, until it is run
--     from the new version;
--   * an enqueuer older than 0004 (it claimed by writing IN_FLIGHT) has every claim refused by
--     the check: it dispatches nothing and loses nothing.
-- Idempotent: every step finds nothing left to do when run again.

SELECT set_config('outbox.lock_timeout_before_0007', current_setting('lock_timeout'), true);
SET LOCAL lock_timeout = '5s';
LOCK TABLE outbox IN ACCESS EXCLUSIVE MODE;

DELETE FROM outbox WHERE status = 'SENT';
UPDATE outbox SET status = 'RETRY', next_attempt_at = now(), updated_at = now()
 WHERE status = 'IN_FLIGHT';

-- 0001's check (named by PostgreSQL) is the one that allows IN_FLIGHT; it is replaced by one
-- of the same name without the dead statuses.
DO $$
DECLARE
    dead_check name;
BEGIN
    FOR dead_check IN
        SELECT conname FROM pg_constraint
         WHERE conrelid = 'outbox'::regclass AND contype = 'c'
           AND pg_get_constraintdef(oid) LIKE '%IN_FLIGHT%'
    LOOP
        EXECUTE format('ALTER TABLE outbox DROP CONSTRAINT %I', dead_check);
    END LOOP;
    IF NOT EXISTS (SELECT FROM pg_constraint
                    WHERE conrelid = 'outbox'::regclass AND conname = 'outbox_status_check') THEN
        ALTER TABLE outbox ADD CONSTRAINT outbox_status_check
            CHECK (status IN ('PENDING', 'RETRY', 'DLQ'));
    END IF;
END
$$;

ALTER TABLE outbox
    DROP COLUMN IF EXISTS claim_token,
    DROP COLUMN IF EXISTS claimed_at,
    DROP COLUMN IF EXISTS sent_at;

SELECT set_config('lock_timeout', current_setting('outbox.lock_timeout_before_0007'), true);
