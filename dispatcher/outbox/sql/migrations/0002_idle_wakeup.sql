-- 0002: NOTIFY only while an enqueuer is idle and listening.
--
-- A transaction that has sent NOTIFY takes a database-wide lock at commit and holds it through
-- its WAL flush, so with an unconditional NOTIFY every business transaction that writes an
-- outbox row commits one at a time. Enqueuers now announce themselves here when they go idle
-- (and withdraw when a full batch shows they are busy); the trigger notifies only while
-- someone is idle. Under load nobody is idle, so nobody notifies. The enqueuer's poll and its
-- follow-up claims after announcing close the race with commits already in flight.

CREATE TABLE IF NOT EXISTS outbox_idle (
    enqueuer     TEXT PRIMARY KEY,
    listener_pid INT NOT NULL,
    since        TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- SECURITY DEFINER: an application role that may only INSERT into outbox still fires it.
CREATE OR REPLACE FUNCTION composer_notify_outbox() RETURNS TRIGGER
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM outbox_idle) THEN
        PERFORM pg_notify('outbox_new', '');
    END IF;
    RETURN NULL;
END;
$$;
