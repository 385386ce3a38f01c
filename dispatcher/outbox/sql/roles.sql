-- Least-privilege roles for outbox-dispatcher (see docs/security.md).
--
-- Not a migration: an administrator runs it once per database, after `dispatcher migrate`,
-- as the owner of the outbox tables (the role that migrated). Idempotent: re-running it
-- resets the grants and settings below.
--
--   psql "$ADMIN_DATABASE_URL" -v ON_ERROR_STOP=1 -f dispatcher/outbox/sql/roles.sql
--   psql "$ADMIN_DATABASE_URL" -c "ALTER ROLE outbox_enqueuer PASSWORD '...'"   (and outbox_app)
--
-- outbox_app       the application's role for dispatching: INSERT into outbox, and EXECUTE
--                  outbox_cancel_run (cancel_run: as the owner it records the cancel and deletes
--                  that run's waiting rows, migration 0011), nothing else.
--                  The outbox_notify trigger needs nothing more: its WHEN clause takes a
--                  shared advisory lock (migration 0005), which every role may, and its
--                  function reads the row as its owner (SECURITY DEFINER, migration 0008).
--                  Grant the role's privileges on your business tables yourself, or make your
--                  application's role a member (GRANT outbox_app TO myapp).
-- outbox_enqueuer  `dispatcher enqueuer`: claim/update/delete outbox rows, write outbox_dlq,
--                  journal its batches in outbox_batches, relay and delete committed cancels
--                  (outbox_cancel), read the schema version. No INSERT into
--                  outbox, no DDL, no TRUNCATE.
--
-- `dispatcher migrate`, `status` and `dlq replay` run as the owner (an operator's role).
--
-- Role settings (ALTER ROLE ... SET) apply to sessions that log in as the role itself; a login
-- role that is only a member of these roles must get the same settings of its own.

DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'outbox_app') THEN
        CREATE ROLE outbox_app LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION;
    END IF;
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'outbox_enqueuer') THEN
        CREATE ROLE outbox_enqueuer LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION;
    END IF;
    EXECUTE format('GRANT CONNECT ON DATABASE %I TO outbox_app, outbox_enqueuer',
                   current_database());
    EXECUTE format('GRANT USAGE ON SCHEMA %I TO outbox_app, outbox_enqueuer', current_schema());
    EXECUTE format('REVOKE CREATE ON SCHEMA %I FROM outbox_app, outbox_enqueuer',
                   current_schema());
END
$$;

REVOKE ALL ON outbox, outbox_dlq, outbox_batches, outbox_cancel, outbox_schema_version
    FROM outbox_app, outbox_enqueuer;
REVOKE ALL ON FUNCTION outbox_cancel_run(text) FROM PUBLIC, outbox_enqueuer;

-- The application: enqueue_dispatch is a plain INSERT (no RETURNING, no ON CONFLICT).
GRANT INSERT ON outbox TO outbox_app;
-- cancel_run: one call, run as the owner; the role reads and deletes nothing itself.
GRANT EXECUTE ON FUNCTION outbox_cancel_run(text) TO outbox_app;

-- The enqueuer: exactly the statements of sql/queries.sql it runs.
GRANT SELECT, UPDATE, DELETE ON outbox TO outbox_enqueuer;           -- lock, settle, recover
GRANT SELECT, INSERT, DELETE ON outbox_batches TO outbox_enqueuer;   -- the batch journal
GRANT SELECT, INSERT, UPDATE ON outbox_dlq TO outbox_enqueuer;       -- move_to_dlq (ON CONFLICT)
GRANT SELECT, UPDATE, DELETE ON outbox_cancel TO outbox_enqueuer;  -- take_cancels (FOR UPDATE)
GRANT SELECT ON outbox_schema_version TO outbox_enqueuer;

-- Timeouts. The enqueuer's statements are short and its claims SKIP LOCKED: anything that
-- waits on a lock for seconds, runs for half a minute or sits idle inside a transaction is a
-- fault, and ending it rolls the batch back: its rows are due again. (Its LISTEN connection is idle
-- outside any transaction, which these settings leave alone.)
ALTER ROLE outbox_enqueuer SET statement_timeout = '30s';
ALTER ROLE outbox_enqueuer SET lock_timeout = '5s';
ALTER ROLE outbox_enqueuer SET idle_in_transaction_session_timeout = '60s';
-- The application's dispatching transactions: an outbox INSERT never waits on a lock (rows
-- are new), and an abandoned transaction must not hold a snapshot that stops vacuum of the
-- outbox, where every row is deleted within milliseconds.
ALTER ROLE outbox_app SET statement_timeout = '30s';
ALTER ROLE outbox_app SET lock_timeout = '5s';
ALTER ROLE outbox_app SET idle_in_transaction_session_timeout = '60s';
