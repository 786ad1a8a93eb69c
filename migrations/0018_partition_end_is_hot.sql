-- Migration: ending a partition writes no index entry.
--
-- step_partition_claimable (migration 0015) indexed the STARTING partitions of each plan
-- (WHERE status = 'STARTING'). A column that a partial index's predicate reads counts as an
-- indexed column: every UPDATE that writes status could not be a heap-only (HOT) update, so
-- each partition end (STARTED to COMPLETED, FAILED or STOPPED: status, exit, counters, owner,
-- lease, version; no key) wrote a new entry into all five indexes of step_partition.
--
-- STARTING and "no worker" are the same partitions (step_partition_worker_shape:
-- (status = 'STARTING') = (worker_step_execution_id IS NULL)), so the claimable index now says
-- so by the worker column, which a claim writes anyway and an end never does. A partition end
-- is then a HOT update whenever its page has room, and the claim reads the same first entry
-- of the same plan (queries/partitions.sql claim_step_partition).
--
-- The fill factor leaves a fifth of each new page of step_partition free, so the end of a
-- partition finds room next to its row. It applies to pages filled from now on; nothing is
-- rewritten.
--
-- Locks: the new index is built IF NOT EXISTS while writes to step_partition wait (plans,
-- claims, ends, lease renewals; chunk commits go on); it reads the table once. On a large,
-- busy database build it beforehand with CREATE INDEX CONCURRENTLY under the same name
-- (docs/dba.md); this statement then finds it. Dropping the old index takes ACCESS EXCLUSIVE
-- on step_partition until COMMIT, which follows at once (or drop it first with DROP INDEX
-- CONCURRENTLY). SET (fillfactor) takes SHARE UPDATE EXCLUSIVE and changes the catalog only.

-- squawk-ignore require-concurrent-index-creation
CREATE INDEX IF NOT EXISTS step_partition_unassigned -- noqa: PG01
ON pybatch.step_partition (step_execution_id, partition_ordinal)
WHERE worker_step_execution_id IS NULL;

COMMENT ON INDEX pybatch.step_partition_unassigned IS
'Partitions without a worker (STARTING) of each plan in ordinal order: the next claimable one.';

-- squawk-ignore require-concurrent-index-deletion
DROP INDEX IF EXISTS pybatch.step_partition_claimable; -- noqa: PG01

ALTER TABLE pybatch.step_partition SET (fillfactor = 80);
