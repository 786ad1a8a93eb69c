-- Migration 0002: the index of the explorer's unresolved-executions pages (schema version 2).
--
-- `pybatch unresolved` (explore_unresolved_executions) lists the executions in STARTING,
-- STARTED, STOPPING or UNKNOWN in id order, a page at a time. Without this index the plan
-- reads every unresolved execution and sorts them to return the first page, so a page costs
-- more as unresolved executions accumulate; with it a page reads its rows in id order and
-- stops. The index holds only unresolved rows, so it stays small whatever the history.
--
-- No data moves. Lint: PG01 (no CONCURRENTLY) is suppressed because the migrator applies a
-- file in one transaction, where CONCURRENTLY cannot run. The build blocks writes to
-- job_execution (not reads) while it scans the table once. On a large, busy table a DBA can
-- build the same index first with CREATE INDEX CONCURRENTLY under this name (docs/dba.md);
-- IF NOT EXISTS then makes this file a no-op.

CREATE INDEX IF NOT EXISTS job_execution_unresolved_identity -- noqa: PG01
ON pybatch.job_execution (id)
WHERE status IN ('STARTING', 'STARTED', 'STOPPING', 'UNKNOWN');

COMMENT ON INDEX pybatch.job_execution_unresolved_identity IS
'Unresolved executions in id order: the explorer''s unresolved-executions pages.';
