-- Migration: a claim reads only its own plan's unassigned partitions.
--
-- step_partition_worker indexed worker_step_execution_id with its NULLs: the partitions that
-- have no worker yet, of every plan. A claim asks for the first partition of one plan WHERE
-- worker_step_execution_id IS NULL (queries/partitions.sql claim_step_partition). When the
-- table's statistics counted few such rows (taken while plans were being worked off), the
-- planner answered that condition from step_partition_worker: it read the unassigned
-- partitions of every plan, those of plans abandoned by a failed run too, and sorted them,
-- instead of reading the first entry of this plan in step_partition_unassigned. The claim then
-- cost more with every plan ever left unfinished.
--
-- Every other reader of step_partition_worker looks a worker up by its id, which is never NULL
-- (the foreign key's checks when a worker step is purged, recovery, the end), so the index
-- keeps only the rows that have a worker; "no worker" is answered by step_partition_unassigned
-- alone.
--
-- Locks: as in migration 0018, the new index is built IF NOT EXISTS while writes to
-- step_partition wait (plans, claims, ends, lease renewals; chunk commits go on); it reads the
-- table once. On a large, busy database build it beforehand with CREATE INDEX CONCURRENTLY
-- under the same name (docs/dba.md); this statement then finds it. Dropping the old index
-- takes ACCESS EXCLUSIVE on step_partition until COMMIT, which follows at once (or drop it
-- first with DROP INDEX CONCURRENTLY).

-- squawk-ignore require-concurrent-index-creation
CREATE INDEX IF NOT EXISTS step_partition_assigned_worker -- noqa: PG01
ON pybatch.step_partition (worker_step_execution_id)
WHERE worker_step_execution_id IS NOT NULL;

COMMENT ON INDEX pybatch.step_partition_assigned_worker IS
'The partition a worker step works on, by the worker''s id (partitions with a worker only).';

-- squawk-ignore require-concurrent-index-deletion
DROP INDEX IF EXISTS pybatch.step_partition_worker; -- noqa: PG01
