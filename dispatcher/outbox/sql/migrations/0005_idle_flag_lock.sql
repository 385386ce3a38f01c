-- 0005: the idle flag is an advisory lock, tested in the trigger's WHEN clause.
--
-- 0002 read a table (outbox_idle) from a SECURITY DEFINER plpgsql function on every outbox
-- INSERT statement, even when nobody was idle: the application's insert tps was 0.84x (16
-- clients) and 0.83x (4) that without a trigger (2026-12-03 11:18 UTC, benchmarks/RESULTS.md
-- as of commit bddfcba). Now an idle enqueuer holds an exclusive session-level advisory lock (key below),
-- and the trigger's WHEN clause tries to take it shared for the inserting transaction:
--   * nobody idle: the shared lock is granted (no wait, no conflict with other inserters),
--     WHEN is false and no function runs at all;
--   * an enqueuer idle: the try fails, WHEN is true, and the function NOTIFYs at commit.
-- The shared lock is held until the inserting transaction ends, so an enqueuer can only take
-- the flag when no transaction that skipped the NOTIFY is still open: one claim right after
-- taking the flag sees every row committed without a notification. A flag dies with its
-- session, so a crashed enqueuer leaves nothing behind.
--
-- Key 0x6F626964_6C65 ("obidle"): shared with dispatcher/outbox/idle_flag.py IDLE_FLAG_KEY.

-- On a live table: lock_timeout bounds how long the application's INSERTs queue behind this
-- migration's lock on outbox while it waits for a long transaction; past it the run rolls
-- back and `dispatcher migrate` tries again (dispatcher/outbox/schema.py).
SET LOCAL lock_timeout = '5s';

CREATE OR REPLACE FUNCTION composer_notify_outbox() RETURNS TRIGGER
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('outbox_new', '');
    RETURN NULL;
END;
$$;

DROP TRIGGER IF EXISTS outbox_notify ON outbox;
CREATE TRIGGER outbox_notify AFTER INSERT ON outbox FOR EACH STATEMENT
    WHEN (NOT pg_try_advisory_xact_lock_shared(122468465667173))
    EXECUTE FUNCTION composer_notify_outbox();

DROP TABLE IF EXISTS outbox_idle;
