-- 0010: a notification is a hint that carries nothing; the dead encoding functions go.
--
-- 0008 made each committed row's notification carry the row (id, stream, task id, payload)
-- so an idle enqueuer could publish it without a claim. PostgreSQL has no permissions on
-- channels: any role that can connect could LISTEN and read every task, or NOTIFY and have
-- a task of its own making published to a stream of its choosing. Now the trigger is again
-- one per statement (0005's form) and sends the empty payload: "something committed". The
-- enqueuer answers with a claim, so every row it publishes is one it read from the table
-- under its own privileges; any other payload on the channel is ignored. A LISTENer learns
-- only that some transaction inserted outbox rows while an enqueuer was idle, and when.
-- No SECURITY DEFINER: pg_notify needs no privilege, and the function reads nothing.
-- PostgreSQL folds the identical notifications of one transaction into one, so a
-- transaction of many rows costs one notification, not one per row.
--
-- 0009's functions (outbox_fnv1a32, outbox_queue, outbox_route, outbox_resp, outbox_entry)
-- have had no caller since the claim returned plain columns again.
--
-- On a live table: replacing the trigger needs a lock that queues the application's
-- INSERTs behind it; lock_timeout bounds that wait (past it this changes nothing and
-- `dispatcher migrate` tries again), and is put back for the migrations after this one.
-- Idempotent.

SELECT set_config('outbox.lock_timeout_before_0010', current_setting('lock_timeout'), true);
SET LOCAL lock_timeout = '1s';

CREATE OR REPLACE FUNCTION composer_notify_outbox() RETURNS TRIGGER
LANGUAGE plpgsql SECURITY INVOKER AS $$
BEGIN
    PERFORM pg_notify('outbox_new', '');
    RETURN NULL;
END;
$$;

DROP TRIGGER IF EXISTS outbox_notify ON outbox;
CREATE TRIGGER outbox_notify AFTER INSERT ON outbox FOR EACH STATEMENT
    WHEN (NOT pg_try_advisory_xact_lock_shared(122468465667173))
    EXECUTE FUNCTION composer_notify_outbox();

DROP FUNCTION IF EXISTS outbox_entry(text, jsonb, text, text[]);
DROP FUNCTION IF EXISTS outbox_resp(text);
DROP FUNCTION IF EXISTS outbox_route(text, text, text, int);
DROP FUNCTION IF EXISTS outbox_queue(text);
DROP FUNCTION IF EXISTS outbox_fnv1a32(text);

SELECT set_config('lock_timeout', current_setting('outbox.lock_timeout_before_0010'), true);
