-- 0008: while an enqueuer is idle, each committed row's notification carries the row.
--
-- The idle enqueuer used to wake on an empty notification and claim what had arrived (one
-- more round trip to PostgreSQL before the XADD). Now the notification carries what the
-- entry is built from, and the idle enqueuer publishes from it and deletes the rows after.
--
-- outbox_notify is a row-level constraint trigger, deferred to the commit, with the same
-- WHEN clause as in 0005: while nobody holds the idle flag the shared advisory lock is
-- granted, WHEN is false and nothing is queued or run (no more than the statement-level
-- trigger cost). While someone holds it, each inserted row queues one event, and at commit
-- the function reads the row as it is then (an UPDATE or DELETE later in the same transaction
-- counts, not the row as first inserted) and notifies, on the channel outbox_new:
--   * a row due now, PENDING and not a suspect, whose message fits a NOTIFY payload (under
--     8000 bytes): a JSON array [id, stream, task_id], then, if the row has a payload, a
--     newline and payload::text (the text the claim reads; JSON text never holds a raw
--     newline, so the first newline ends the array);
--   * anything else (a row due later, too big, gone): the empty payload, a plain wake-up that
--     falls back to the claim. PostgreSQL folds identical notifications of one transaction.
-- SECURITY DEFINER: the application's role may only INSERT, and the function reads the row.

-- On a live table: lock_timeout bounds how long the application's INSERTs queue behind this
-- migration's lock on outbox while it waits for a long transaction; past it the run rolls
-- back and `dispatcher migrate` tries again (dispatcher/outbox/schema.py).
SET LOCAL lock_timeout = '5s';

CREATE OR REPLACE FUNCTION composer_notify_outbox() RETURNS TRIGGER
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
    msg text;
BEGIN
    SELECT json_build_array(o.id, o.stream, o.task_id)::text
           || coalesce(E'\n' || o.payload::text, '')
      INTO msg
      FROM outbox o
     WHERE o.id = NEW.id AND o.status = 'PENDING' AND NOT o.suspect
       AND (o.next_attempt_at IS NULL OR o.next_attempt_at <= clock_timestamp());
    IF msg IS NULL OR octet_length(msg) >= 8000 THEN
        msg := '';
    END IF;
    PERFORM pg_notify('outbox_new', msg);
    RETURN NULL;
END;
$$;

DROP TRIGGER IF EXISTS outbox_notify ON outbox;
CREATE CONSTRAINT TRIGGER outbox_notify AFTER INSERT ON outbox
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW
    WHEN (NOT pg_try_advisory_xact_lock_shared(122468465667173))
    EXECUTE FUNCTION composer_notify_outbox();
