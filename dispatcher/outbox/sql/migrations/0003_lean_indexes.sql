-- 0003: one index fewer to maintain on every claim.
--
-- 0001's idx_outbox_status (status, created_at) is updated by every claim (status
-- changes, so the UPDATE is never HOT) and by every insert, yet no query needs it: the claim
-- uses idx_outbox_pending_next, recovery uses idx_outbox_in_flight, and status counts scan a
-- table that is nearly empty when the system is healthy. Measured: the SQL-only
-- claim -> delete cycle drains faster without it (benchmarks/RESULTS.md).
DROP INDEX IF EXISTS idx_outbox_status;
