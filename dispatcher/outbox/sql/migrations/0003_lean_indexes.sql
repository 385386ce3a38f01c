-- 0003: one index fewer to maintain on every claim.
--
-- 0001's idx_outbox_status (status, created_at) is updated by every claim (status
-- changes, so the UPDATE is never HOT) and by every insert, yet no query needs it: the claim
-- uses idx_outbox_pending_next, recovery uses idx_outbox_in_flight, and status counts scan a
-- table that is nearly empty when the system is healthy. Measured: the SQL-only
-- claim -> delete cycle drains faster without it (benchmarks/RESULTS.md).
--
-- Bounded lock waits (added later, for databases still upgrading from before it): DROP INDEX
-- takes the table's ACCESS EXCLUSIVE lock, and the application's INSERTs queue behind its
-- request while it waits; past lock_timeout (5 s) the run fails, changes nothing, and
-- `dispatcher migrate` tries again. The setting is put back at the end.
SELECT set_config('outbox.lock_timeout_before_0003', current_setting('lock_timeout'), true);
SET LOCAL lock_timeout = '5s';
DROP INDEX IF EXISTS idx_outbox_status;

SELECT set_config('lock_timeout', current_setting('outbox.lock_timeout_before_0003'), true);
