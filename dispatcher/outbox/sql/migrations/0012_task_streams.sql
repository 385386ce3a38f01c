-- 0012: a row names a task stream and nothing else.
--
-- The enqueuer XADDs each row to the stream it names, and the row is written by the
-- application's role: a row naming a key of the system's own (workflow.cancel.runs,
-- composer:limits:{q}, dispatcher:attempt:..., composer:stream_shards, workflow.dead.<q>)
-- made that key a stream and wedged what reads it. From here the table refuses them: a row's
-- stream is workflow.tasks.<queue>, or workflow.tasks.<queue>.<n> as older writers put it
-- (the pattern of dispatcher.stream.naming.TASK_STREAM_PATTERN, anchored), and the enqueuer
-- checks again before any XADD (a row from before this check goes to outbox_dlq).
--
-- Rows already in the outbox that name anything else move to outbox_dlq first, with the
-- reason: they could never be published now, and a CHECK holds for every UPDATE of a row, so
-- left in place they would fail their own retry or dead-lettering. The constraint is then
-- added NOT VALID: no scan of the table under its lock (the rows left are all valid: the
-- lock keeps writers out between the move and the constraint).
--
-- On a live table: SHARE ROW EXCLUSIVE (writers wait, readers and claims do not) for as long
-- as the move takes, after lock_timeout bounds the wait for it (past 5 s the run fails,
-- changes nothing, and `dispatcher migrate` tries again). The setting is put back at the end.
--
-- Processes of the previous version meanwhile: an application (any version) writing
-- enqueue_dispatch's rows goes on (they name workflow.tasks.<queue>); a writer of its own
-- naming another stream gets a check_violation and its transaction rolls back, committing
-- nothing. Enqueuers of the previous version never write the stream column: they go on.
-- `dispatcher dlq replay` of a moved row fails the check: replay refuses it.
-- Idempotent: the move finds nothing the second time; the constraint is added if missing.

SELECT set_config('outbox.lock_timeout_before_0012', current_setting('lock_timeout'), true);
SET LOCAL lock_timeout = '5s';
LOCK TABLE outbox IN SHARE ROW EXCLUSIVE MODE;

WITH moved AS (
    DELETE FROM outbox
     WHERE stream !~ '^workflow\.tasks\.([A-Za-z0-9_-]{1,200})(\.[0-9]+)?$'
    RETURNING *
)
INSERT INTO outbox_dlq (id, task_id, stream, payload, type, last_error, attempts,
                        max_retries, backoff_seconds, created_at, moved_at)
SELECT id, task_id, stream, payload, type,
       'NotATaskStream: ' || left(quote_literal(stream), 200)
           || ' is not a task stream (workflow.tasks.<queue>): refused by migration 0012',
       attempt_count, max_retries, backoff_seconds, created_at, now()
  FROM moved
ON CONFLICT (id) DO UPDATE
   SET last_error = EXCLUDED.last_error, moved_at = now();

DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_constraint
                    WHERE conname = 'outbox_stream_check' AND conrelid = 'outbox'::regclass) THEN
        ALTER TABLE outbox ADD CONSTRAINT outbox_stream_check
            CHECK (stream ~ '^workflow\.tasks\.([A-Za-z0-9_-]{1,200})(\.[0-9]+)?$') NOT VALID;
    END IF;
END
$$;

SELECT set_config('lock_timeout', current_setting('outbox.lock_timeout_before_0012'), true);
