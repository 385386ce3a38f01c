-- 0011: cancelling a run (cancel_run, `dispatcher cancel --run R`).
--
-- outbox_cancel holds the runs cancelled by committed transactions until an enqueuer has
-- recorded them in Redis (workflow.cancel.runs, read by the workers) and deleted them here.
-- outbox_cancel_run(run) is what cancel_run calls in the application's transaction: it
-- writes that row and deletes the run's rows still waiting in the outbox (PENDING or RETRY,
-- payload run_id = run), skipping rows a batch holds locked right now (that batch publishes
-- them; the workers then cancel them). It runs as the owner (SECURITY DEFINER), so the
-- application's role needs EXECUTE on it and nothing more: no SELECT or DELETE on the
-- outbox, where it could read or remove other runs' rows. PUBLIC may not execute it.
-- The delete reads the outbox rows by payload (no index: an index on run_id would cost
-- every dispatch a write to save a rare cancel a scan of a table that is nearly empty).
--
-- The trigger wakes the enqueuers on the channel outbox_cancel with the empty payload: a hint
-- (channels have no permissions, anyone may NOTIFY it), answered by reading outbox_cancel.
-- Unconditional: a cancel is rare, and the commit lock a NOTIFY takes costs only its commit.
--
-- Processes of the previous version meanwhile: they never read these objects; a run
-- cancelled while only old enqueuers run waits here until a new one relays it.
-- Nothing here locks the outbox table for more than reading its definition. Idempotent.

CREATE TABLE IF NOT EXISTS outbox_cancel (
    run_id       TEXT PRIMARY KEY CHECK (run_id <> ''),
    cancelled_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE OR REPLACE FUNCTION outbox_cancel_run(run text) RETURNS bigint
LANGUAGE sql SECURITY DEFINER SET search_path FROM CURRENT AS $$
    INSERT INTO outbox_cancel (run_id) VALUES (run)
    ON CONFLICT (run_id) DO UPDATE SET cancelled_at = now();
    WITH gone AS (
        DELETE FROM outbox
         WHERE id IN (SELECT id FROM outbox
                       WHERE status IN ('PENDING', 'RETRY') AND payload ->> 'run_id' = run
                         FOR UPDATE SKIP LOCKED)
        RETURNING 1
    )
    SELECT count(*) FROM gone;
$$;
REVOKE ALL ON FUNCTION outbox_cancel_run(text) FROM PUBLIC;

CREATE OR REPLACE FUNCTION composer_notify_cancel() RETURNS TRIGGER
LANGUAGE plpgsql SECURITY INVOKER AS $$
BEGIN
    PERFORM pg_notify('outbox_cancel', '');
    RETURN NULL;
END;
$$;

DROP TRIGGER IF EXISTS outbox_cancel_notify ON outbox_cancel;
CREATE TRIGGER outbox_cancel_notify AFTER INSERT OR UPDATE ON outbox_cancel
    FOR EACH STATEMENT EXECUTE FUNCTION composer_notify_cancel();
