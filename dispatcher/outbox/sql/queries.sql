-- Named queries of the outbox. Each block starts with "-- name: <name>"; parameters are
-- psycopg named placeholders. Times are always the database clock (now()).

-- name: insert_dispatch
-- One outbox row, written in the caller's transaction.
INSERT INTO outbox (id, task_id, stream, payload, type, status, next_attempt_at,
                    max_retries, backoff_seconds)
VALUES (%(id)s, %(task_id)s, %(stream)s, %(payload)s, %(type)s, 'PENDING', %(not_before)s,
        %(max_retries)s, %(backoff_seconds)s);

-- name: claim_batch
-- A MATERIALIZED CTE is evaluated once, so the row set is fixed by its LIMIT; the
-- spec page's "WHERE id IN (SELECT ... LIMIT n FOR UPDATE SKIP LOCKED)" may be re-run by
-- the planner (e.g. as the inner side of a join) and claim more than n rows.
WITH due AS MATERIALIZED (
    SELECT id FROM outbox
     WHERE status IN ('PENDING', 'RETRY')
       AND (next_attempt_at IS NULL OR next_attempt_at <= now())
     ORDER BY created_at
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
)
UPDATE outbox o
   SET status = 'IN_FLIGHT', claim_token = %(token)s, claimed_at = now(), updated_at = now()
  FROM due
 WHERE o.id = due.id
RETURNING o.id, o.stream, o.payload::text AS payload, o.attempt_count, o.max_retries,
          o.backoff_seconds, extract(epoch FROM now() - o.created_at)::float8 AS age_seconds;

-- name: delete_sent
-- Only the claim that published a row may delete it.
DELETE FROM outbox
 WHERE id = ANY(%(ids)s) AND claim_token = %(token)s AND status = 'IN_FLIGHT';

-- name: mark_sent
-- Fallback when delete_sent failed: the maintenance loop deletes SENT rows later, and
-- recovery does not republish them.
UPDATE outbox SET status = 'SENT', sent_at = now(), updated_at = now()
 WHERE id = ANY(%(ids)s) AND claim_token = %(token)s AND status = 'IN_FLIGHT';

-- name: release_claims
-- Shutdown: rows claimed but not published go back to PENDING, attempt not counted.
UPDATE outbox SET status = 'PENDING', claim_token = NULL, claimed_at = NULL, updated_at = now()
 WHERE id = ANY(%(ids)s) AND claim_token = %(token)s AND status = 'IN_FLIGHT';

-- name: schedule_retries
UPDATE outbox o
   SET status = 'RETRY', attempt_count = r.attempt,
       next_attempt_at = now() + make_interval(secs => r.delay),
       last_error = r.error, claim_token = NULL, claimed_at = NULL, updated_at = now()
  FROM unnest(%(ids)s::text[], %(attempts)s::int[], %(delays)s::float8[], %(errors)s::text[])
       AS r(id, attempt, delay, error)
 WHERE o.id = r.id AND o.claim_token = %(token)s AND o.status = 'IN_FLIGHT';

-- name: move_to_dlq
WITH moved AS (
    UPDATE outbox o
       SET status = 'DLQ', attempt_count = r.attempt, last_error = r.error,
           claim_token = NULL, claimed_at = NULL, updated_at = now()
      FROM unnest(%(ids)s::text[], %(attempts)s::int[], %(errors)s::text[])
           AS r(id, attempt, error)
     WHERE o.id = r.id AND o.claim_token = %(token)s AND o.status = 'IN_FLIGHT'
    RETURNING o.*
)
INSERT INTO outbox_dlq (id, task_id, stream, payload, type, last_error, attempts,
                        max_retries, backoff_seconds, created_at, moved_at)
SELECT id, task_id, stream, payload, type, last_error, attempt_count,
       max_retries, backoff_seconds, created_at, now()
  FROM moved
ON CONFLICT (id) DO UPDATE
   SET last_error = EXCLUDED.last_error, attempts = EXCLUDED.attempts, moved_at = now();

-- name: recover_stale
-- Claims older than the recovery age: the enqueuer died or hung. Counted as an attempt, so
-- a row that keeps killing its enqueuer ends in the DLQ. Clearing the token makes a late
-- delete or update by the old claimer touch nothing.
WITH stale AS MATERIALIZED (
    SELECT id FROM outbox
     WHERE status = 'IN_FLIGHT' AND claimed_at < now() - make_interval(secs => %(age)s)
     ORDER BY claimed_at
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
), reset AS (
    UPDATE outbox o
       SET status = CASE WHEN o.attempt_count + 1 > o.max_retries THEN 'DLQ' ELSE 'RETRY' END,
           attempt_count = o.attempt_count + 1,
           next_attempt_at = now(),
           last_error = 'claim expired: enqueuer did not finish within '
                        || %(age)s::text || ' s (crashed or paused)',
           claim_token = NULL, claimed_at = NULL, updated_at = now()
      FROM stale
     WHERE o.id = stale.id
    RETURNING o.*
), dead AS (
    INSERT INTO outbox_dlq (id, task_id, stream, payload, type, last_error, attempts,
                            max_retries, backoff_seconds, created_at, moved_at)
    SELECT id, task_id, stream, payload, type, last_error, attempt_count,
           max_retries, backoff_seconds, created_at, now()
      FROM reset WHERE status = 'DLQ'
    ON CONFLICT (id) DO UPDATE
       SET last_error = EXCLUDED.last_error, attempts = EXCLUDED.attempts, moved_at = now()
)
SELECT count(*) FILTER (WHERE status = 'RETRY') AS retried,
       count(*) FILTER (WHERE status = 'DLQ') AS dead
  FROM reset;

-- name: cleanup_sent
DELETE FROM outbox WHERE status = 'SENT';

-- name: status_counts
SELECT status, count(*) AS rows,
       extract(epoch FROM now() - min(created_at))::float8 AS oldest_age_seconds
  FROM outbox GROUP BY status;

-- name: dlq_count
SELECT count(*) FROM outbox_dlq;

-- name: dlq_list
SELECT id, task_id, stream, attempts, moved_at, last_error
  FROM outbox_dlq ORDER BY moved_at DESC, id LIMIT %(limit)s;

-- name: dlq_select
SELECT id FROM outbox_dlq WHERE %(all)s OR id = ANY(%(ids)s) ORDER BY id;

-- name: dlq_replay
-- Back to PENDING with attempts reset, in one statement (one transaction). The INSERT fires
-- outbox_notify, so enqueuers wake at once; a row still in outbox (status DLQ) is reset.
WITH picked AS (
    DELETE FROM outbox_dlq WHERE %(all)s OR id = ANY(%(ids)s) RETURNING *
)
INSERT INTO outbox (id, task_id, stream, payload, type, status, attempt_count, max_retries,
                    backoff_seconds, created_at, updated_at)
SELECT id, task_id, stream, payload, type, 'PENDING', 0, max_retries, backoff_seconds,
       now(), now()
  FROM picked
ON CONFLICT (id) DO UPDATE
   SET status = 'PENDING', attempt_count = 0, next_attempt_at = NULL, last_error = NULL,
       claim_token = NULL, claimed_at = NULL, created_at = now(), updated_at = now()
RETURNING id;

-- name: outbox_streams
SELECT DISTINCT stream FROM outbox;

-- name: announce_idle
INSERT INTO outbox_idle (enqueuer, listener_pid) VALUES (%(enqueuer)s, %(pid)s)
ON CONFLICT (enqueuer) DO UPDATE SET listener_pid = EXCLUDED.listener_pid, since = now();

-- name: withdraw_idle
DELETE FROM outbox_idle WHERE enqueuer = %(enqueuer)s;

-- name: forget_dead_listeners
-- Announcements of enqueuers whose listener connection is gone (crashed, killed).
DELETE FROM outbox_idle
 WHERE listener_pid NOT IN (SELECT pid FROM pg_stat_activity WHERE pid IS NOT NULL);
