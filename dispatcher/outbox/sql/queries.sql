-- Named queries of the outbox. Each block starts with "-- name: <name>"; parameters are
-- psycopg named placeholders. Times are always the database clock (now()).

-- name: insert_dispatch
-- One outbox row, written in the caller's transaction.
INSERT INTO outbox (id, task_id, stream, payload, type, status, next_attempt_at,
                    max_retries, backoff_seconds)
VALUES (%(id)s, %(task_id)s, %(stream)s, %(payload)s, %(type)s, 'PENDING', %(not_before)s,
        %(max_retries)s, %(backoff_seconds)s);

-- name: prepare_claim_batch
-- The claim: due rows locked by the enqueuer's open transaction, which publishes them and
-- deletes them before it commits. Prepared once per session (ClaimStatement runs it; $1 is
-- the batch size): parsed and planned once, not for every batch (planning cost PostgreSQL
-- 0.2-0.7 ms a batch: 2026-12-03, benchmarks/NOTES.md, "Figures the code's comments
-- quote"). Columns in the order of ClaimedRow's fields (the batch reads them
-- positionally), then the transaction's id, which the batch's journal row records (locking
-- a row assigned it before the row comes out); the payload as JSON text. LIMIT
-- sits above the row locking, so at most "limit" rows are locked (an "id IN (SELECT ...
-- LIMIT n FOR UPDATE SKIP LOCKED)" under an UPDATE may be re-run by the planner and claim
-- more than n). Rows scheduled for a time that has come go first (they have waited
-- longest), then rows due at once by age; each part walks its own partial index from the
-- first due row, so rows not yet due are never read. Suspects are left to claim_probe.
-- The payload is made text only for the rows locked: the locking parts are MATERIALIZED
-- and return it as stored, because an expression in their select list is computed by the
-- index scan below the row locking, for every row it walks past too. With batches in
-- flight the next claim walks past the rows they hold, and turning those payloads into
-- text (detoasting them first) was most of PostgreSQL's work per row at 4 KB.
PREPARE outbox_claim_batch (int) AS
WITH scheduled AS MATERIALIZED (
    SELECT id, stream, payload, attempt_count, max_retries, backoff_seconds, created_at,
           task_id
      FROM outbox
     WHERE status IN ('PENDING', 'RETRY') AND next_attempt_at IS NOT NULL AND NOT suspect
       AND next_attempt_at <= statement_timestamp()
     ORDER BY next_attempt_at
     LIMIT $1
       FOR UPDATE SKIP LOCKED
), fresh AS MATERIALIZED (
    SELECT id, stream, payload, attempt_count, max_retries, backoff_seconds, created_at,
           task_id
      FROM outbox
     WHERE status IN ('PENDING', 'RETRY') AND next_attempt_at IS NULL AND NOT suspect
     ORDER BY created_at
     LIMIT greatest($1 - (SELECT count(*) FROM scheduled), 0)
       FOR UPDATE SKIP LOCKED
), claimed AS (
    SELECT * FROM scheduled
    UNION ALL
    SELECT * FROM fresh
)
SELECT id, stream, payload::text AS payload, attempt_count, max_retries, backoff_seconds,
       extract(epoch FROM statement_timestamp() - created_at)::float8 AS age_seconds, task_id,
       pg_current_xact_id_if_assigned()::text AS xact
  FROM claimed;

-- name: prepare_claim_probe
-- One due suspect alone (same columns as prepare_claim_batch): if it kills this enqueuer
-- too, the journal shows a batch of one and recovery knows whom to charge. The transaction
-- id is read above the locking part (in its select list it would be read before the lock).
PREPARE outbox_claim_probe AS
WITH suspect AS MATERIALIZED (
    SELECT id, stream, payload, attempt_count, max_retries, backoff_seconds, created_at,
           task_id
      FROM outbox
     WHERE status IN ('PENDING', 'RETRY') AND suspect
       AND next_attempt_at <= statement_timestamp()
     ORDER BY next_attempt_at
     LIMIT 1
       FOR UPDATE SKIP LOCKED
)
SELECT id, stream, payload::text AS payload, attempt_count, max_retries, backoff_seconds,
       extract(epoch FROM statement_timestamp() - created_at)::float8 AS age_seconds, task_id,
       pg_current_xact_id_if_assigned()::text AS xact
  FROM suspect;

-- name: suspects_due_in
-- Seconds until the next suspect is due (<= 0: now); NULL when there is none.
SELECT extract(epoch FROM min(next_attempt_at) - now())::float8 AS due_in
  FROM outbox
 WHERE status IN ('PENDING', 'RETRY') AND suspect;

-- name: open_journal
-- Autocommitted on another session before the batch is published: if the batch's transaction
-- ends without settling (crash, timeout), this row outlives it and recovery counts an attempt.
-- The ids go in binary (%%b): a text array quotes each element with a regex in the client.
INSERT INTO outbox_batches (token, xact, ids, enqueuer, probe)
VALUES (%(token)s, %(xact)s::xid8, %(ids)b, %(enqueuer)s, %(probe)s);

-- name: close_journal
-- In the batch's own transaction: the journal row goes exactly when the settlement commits.
DELETE FROM outbox_batches WHERE token = %(token)s;

-- name: delete_claimed
-- Every row of this batch, which published whole: the batch's journal row names them (and
-- this transaction holds their locks), so their ids are not sent again.
DELETE FROM outbox
 WHERE id = ANY((SELECT ids FROM outbox_batches WHERE token = %(token)s)::text[]);

-- name: delete_published
-- Rows of this batch (locked by this transaction) whose entries Redis acknowledged.
DELETE FROM outbox WHERE id = ANY(%(ids)s);

-- name: schedule_retries
UPDATE outbox o
   SET status = 'RETRY', attempt_count = r.attempt,
       next_attempt_at = now() + make_interval(secs => r.delay),
       last_error = r.error, updated_at = now()
  FROM unnest(%(ids)s::text[], %(attempts)s::int[], %(delays)s::float8[], %(errors)s::text[])
       AS r(id, attempt, delay, error)
 WHERE o.id = r.id;

-- name: move_to_dlq
WITH moved AS (
    UPDATE outbox o
       SET status = 'DLQ', attempt_count = r.attempt, last_error = r.error, updated_at = now()
      FROM unnest(%(ids)s::text[], %(attempts)s::int[], %(errors)s::text[])
           AS r(id, attempt, error)
     WHERE o.id = r.id
    RETURNING o.*
)
INSERT INTO outbox_dlq (id, task_id, stream, payload, type, last_error, attempts,
                        max_retries, backoff_seconds, created_at, moved_at)
SELECT id, task_id, stream, payload, type, last_error, attempt_count,
       max_retries, backoff_seconds, created_at, now()
  FROM moved
ON CONFLICT (id) DO UPDATE
   SET last_error = EXCLUDED.last_error, attempts = EXCLUDED.attempts, moved_at = now();

-- name: discard_foreign_journal
-- Journal rows whose transaction id this cluster has not reached yet: brought by a dump and
-- restore (pg_dump copies UNLOGGED tables' data) from another cluster. pg_xact_status cannot
-- read them (it raises), and their batches are long gone; the rows they name are simply due.
DELETE FROM outbox_batches
 WHERE xact >= pg_snapshot_xmax(pg_current_snapshot())
RETURNING token;

-- name: recover_batches
-- Journal rows whose transaction is over (aborted: the enqueuer crashed, was cut off by
-- idle_in_transaction_session_timeout, or its commit failed) without settling the batch.
-- A probe (one suspect claimed alone) that did not settle counts an attempt for its row, as
-- a failed publish would, with the same backoff: a row that keeps killing enqueuers so ends
-- in the DLQ. The rows of any other batch become suspects, uncharged, due again after a
-- jittered delay of up to their backoff. Rows locked by a batch in progress are waited for
-- (the caller's lock_timeout bounds it), so no attempt is forgotten. A journal row this
-- cluster cannot read (see discard_foreign_journal) is left alone here.
WITH ended AS (
    DELETE FROM outbox_batches
     WHERE CASE WHEN xact >= pg_snapshot_xmax(pg_current_snapshot()) THEN false
                ELSE pg_xact_status(xact) IS DISTINCT FROM 'in progress' END
    RETURNING ids, probe
), named AS (
    SELECT id, bool_or(probe) AS probe FROM ended, unnest(ids) AS id GROUP BY id
), hit AS MATERIALIZED (
    SELECT o.id, named.probe,
           CASE WHEN o.max_retries > 0 THEN o.max_retries
                ELSE %(default_max_retries)s::int END AS max_retries,
           CASE WHEN o.backoff_seconds > 0 THEN o.backoff_seconds
                ELSE %(default_backoff)s::int END AS base
      FROM outbox o JOIN named ON named.id = o.id
     WHERE o.status IN ('PENDING', 'RETRY')
     ORDER BY o.id
       FOR UPDATE OF o
), reset AS (
    UPDATE outbox o
       SET suspect = true,
           status = CASE WHEN NOT hit.probe THEN o.status
                         WHEN o.attempt_count + 1 > hit.max_retries THEN 'DLQ'
                         ELSE 'RETRY' END,
           attempt_count = o.attempt_count + hit.probe::int,
           next_attempt_at = now() + make_interval(secs => CASE
               WHEN hit.probe THEN least(
                   hit.base + random() * hit.base * 2.0 ^ o.attempt_count, %(max_delay)s::float8)
               ELSE random() * hit.base END),
           last_error = CASE WHEN hit.probe
               THEN 'batch did not settle: its enqueuer crashed, hung past '
                    || 'idle_in_transaction_session_timeout, or lost its connection'
               ELSE o.last_error END,
           updated_at = now()
      FROM hit
     WHERE o.id = hit.id
    RETURNING o.*, hit.probe
), dead AS (
    INSERT INTO outbox_dlq (id, task_id, stream, payload, type, last_error, attempts,
                            max_retries, backoff_seconds, created_at, moved_at)
    SELECT id, task_id, stream, payload, type, last_error, attempt_count,
           max_retries, backoff_seconds, created_at, now()
      FROM reset WHERE status = 'DLQ'
    ON CONFLICT (id) DO UPDATE
       SET last_error = EXCLUDED.last_error, attempts = EXCLUDED.attempts, moved_at = now()
)
SELECT count(*) FILTER (WHERE probe AND status <> 'DLQ') AS retried,
       count(*) FILTER (WHERE status = 'DLQ') AS dead,
       count(*) FILTER (WHERE NOT probe) AS suspects
  FROM reset;

-- name: open_batches
-- Rows held by batches in progress (the IN_FLIGHT figure of status and metrics). Journal rows
-- of another cluster (see discard_foreign_journal) are not read.
SELECT coalesce(sum(cardinality(ids)), 0)::int AS rows, count(*)::int AS batches
  FROM outbox_batches
 WHERE CASE WHEN xact >= pg_snapshot_xmax(pg_current_snapshot()) THEN false
            ELSE pg_xact_status(xact) = 'in progress' END;

-- name: status_counts
SELECT status, count(*) AS rows,
       extract(epoch FROM now() - min(created_at))::float8 AS oldest_age_seconds
  FROM outbox GROUP BY status;

-- name: outbox_due_later
-- Rows waiting for their next_attempt_at (a retry's backoff, a not_before): the scheduled index.
SELECT count(*) FROM outbox WHERE status IN ('PENDING', 'RETRY') AND next_attempt_at > now();

-- name: dlq_count
SELECT count(*) FROM outbox_dlq;

-- name: dlq_list
SELECT id, task_id, stream, attempts, moved_at, last_error
  FROM outbox_dlq ORDER BY moved_at DESC, id LIMIT %(limit)s;

-- name: dlq_page
-- The console's page of outbox_dlq, newest first, after a (moved_at, id) cursor; run_id only
-- (never the payload) is read out of the row.
SELECT id, task_id, stream, attempts, moved_at, last_error, payload ->> 'run_id' AS run_id
  FROM outbox_dlq
 WHERE %(before_moved)s::timestamptz IS NULL
    OR (moved_at, id) < (%(before_moved)s::timestamptz, %(before_id)s::text)
 ORDER BY moved_at DESC, id DESC LIMIT %(limit)s;

-- name: dlq_payload
SELECT payload FROM outbox_dlq WHERE id = %(id)s;

-- name: run_search_chunk
-- One step of a run's search (the console), over outbox and outbox_dlq at once: per table the
-- next %(chunk)s rows by primary key from its cursor on (inclusive: '' is an id too; a NULL
-- cursor: that table was searched to its end, not read), the ids of the run's rows among them
-- and the id its next step starts from (NULL: read to the end). run_id is not indexed, on
-- purpose (an index would cost every dispatch a write, see 0011): a lookup reads a table a
-- chunk at a time, never all of it in one statement. A step stops early past %(most)s of the
-- run's rows, at the next one (stop is monotone in n: every row after a stop is one too).
WITH chunk AS MATERIALIZED (
    SELECT 'outbox' AS source, id, payload ->> 'run_id' = %(run_id)s AS hit
      FROM (SELECT id, payload FROM outbox
             WHERE %(outbox_from)s::text IS NOT NULL AND id >= %(outbox_from)s
             ORDER BY id LIMIT %(chunk)s + 1) o
    UNION ALL
    SELECT 'outbox_dlq', id, payload ->> 'run_id' = %(run_id)s
      FROM (SELECT id, payload FROM outbox_dlq
             WHERE %(dlq_from)s::text IS NOT NULL AND id >= %(dlq_from)s
             ORDER BY id LIMIT %(chunk)s + 1) d
), stops AS (
    SELECT source, id, coalesce(hit, false) AS hit,
           row_number() OVER w > %(chunk)s OR count(*) FILTER (WHERE hit) OVER w > %(most)s AS stop
      FROM chunk WINDOW w AS (PARTITION BY source ORDER BY id)
)
SELECT source,
       count(*) FILTER (WHERE NOT stop) AS examined,
       min(id) FILTER (WHERE stop) AS next_id,
       coalesce(array_agg(id ORDER BY id) FILTER (WHERE hit AND NOT stop), '{}') AS found
  FROM stops GROUP BY source;

-- name: run_outbox_rows
SELECT id, task_id, stream, status, attempt_count, next_attempt_at, last_error, created_at
  FROM outbox WHERE id = ANY(%(ids)s) ORDER BY id;

-- name: run_dlq_rows
SELECT id, task_id, stream, attempts, last_error, moved_at
  FROM outbox_dlq WHERE id = ANY(%(ids)s) ORDER BY id;

-- name: run_cancel_waiting
SELECT cancelled_at FROM outbox_cancel WHERE run_id = %(run_id)s;

-- name: dlq_select
SELECT id FROM outbox_dlq WHERE %(all)s OR id = ANY(%(ids)s) ORDER BY id;

-- name: dlq_delete
DELETE FROM outbox_dlq WHERE %(all)s OR id = ANY(%(ids)s) RETURNING id;

-- name: dlq_replay
-- Back to PENDING with attempts reset, in one statement (one transaction). Each row inserted
-- fires outbox_notify (an idle enqueuer publishes it at once); a row still in outbox (status
-- DLQ) is reset in place, which fires no INSERT trigger: the next claim or poll takes it.
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
       suspect = false, created_at = now(), updated_at = now()
RETURNING id;

-- name: take_idle_flag
-- On the enqueuer's own session (autocommitted: the shared try below ends with the
-- statement). Fails while another enqueuer holds the flag ("elsewhere"), or while a
-- transaction that inserted outbox rows without a NOTIFY is still open (it holds it shared).
WITH attempt AS MATERIALIZED (SELECT pg_try_advisory_lock(%(key)s) AS taken)
SELECT taken,
       CASE WHEN taken THEN false ELSE NOT pg_try_advisory_xact_lock_shared(%(key)s) END
           AS elsewhere
  FROM attempt;

-- name: idle_elsewhere
-- Whether another session holds the flag, without taking it (autocommitted: the shared try
-- ends with the statement).
SELECT NOT pg_try_advisory_xact_lock_shared(%(key)s) AS elsewhere;

-- name: ping
SELECT 1;

-- name: drop_idle_flag
SELECT pg_advisory_unlock_all();

-- name: vacuum_state
-- Dead tuples in the outbox, seconds since anything vacuumed it (NULL: never), and whether
-- this role may VACUUM it (owner or superuser).
SELECT s.n_dead_tup AS dead_tuples,
       extract(epoch FROM now() - greatest(s.last_vacuum, s.last_autovacuum))::float8
           AS since_vacuum,
       (pg_has_role(current_user, c.relowner, 'MEMBER')
        OR (SELECT rolsuper FROM pg_roles WHERE rolname = current_user)) AS may_vacuum
  FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid
 WHERE s.relid = 'outbox'::regclass;

-- name: vacuum_lock
-- One enqueuer vacuums at a time (session lock on a pooled autocommit connection).
SELECT pg_try_advisory_lock(%(key)s) AS taken;

-- name: vacuum_unlock
SELECT pg_advisory_unlock(%(key)s);

-- name: vacuum_outbox
-- Not in a transaction (VACUUM cannot be); SKIP_LOCKED: never wait behind a lock.
VACUUM (SKIP_LOCKED) outbox, outbox_batches;

-- name: cancel_run
-- In the caller's transaction: the run is cancelled (outbox_cancel) and its rows still
-- waiting in the outbox are deleted (how many: "removed"). See migration 0011.
SELECT outbox_cancel_run(%(run_id)s) AS removed;

-- name: take_cancels
-- In the relay's transaction, which commits once Redis recorded them: the oldest committed
-- cancels, locked (SKIP LOCKED: another enqueuer relays the others) and deleted.
DELETE FROM outbox_cancel
 WHERE run_id IN (SELECT run_id FROM outbox_cancel ORDER BY cancelled_at
                   LIMIT %(limit)s FOR UPDATE SKIP LOCKED)
RETURNING run_id;

-- name: cancels_waiting
-- Committed cancels no enqueuer has recorded in Redis yet.
SELECT count(*) FROM outbox_cancel;
