-- Migration: a partition claim reads one partition and its commit checks one step.
--
-- 1. The open-step check of a step reads that step, not every step of its execution.
-- Migration 0006 refuses, at COMMIT, a transaction that leaves a step open (STARTING, STARTED,
-- STOPPING) under a finished job execution: its deferred trigger runs
-- check_finished_execution_has_no_open_step for every step inserted or moved to an open
-- status, and for every execution moved to a finished one. For a step, the function looked
-- for any open step of the step's execution; its plan read every step of the execution before
-- it looked at the execution's status, so each worker step a partitioned step's claim creates
-- read all the workers created before it (a plan of 1,024 partitions read up to 1,024 rows per
-- claim, and a claim cost twice the server time of the statement itself).
--
-- The step's own row is all the check needs: every open step was inserted or moved there by a
-- statement that queued its own check, and an execution that finishes still checks all its
-- steps, once. So for a step the function now reads that step and its execution by primary
-- key: still open, under a finished execution, is refused as before (same SQLSTATE 23514, same
-- constraint name). The result is the same for every transaction; only the work differs.
-- CREATE OR REPLACE FUNCTION changes the body in the catalog only; the triggers of migration
-- 0006 keep calling it by name, and a transaction already running keeps the body it started
-- with.
--
-- 2. step_partition_claimable: the STARTING partitions of each plan in ordinal order, which is
-- what a claim looks for (queries/partitions.sql claim_step_partition). Without it the claim's
-- cached plan read every partition of the plan and sorted them to take the first STARTING one,
-- so a claim cost more the larger the plan; with it the claim reads the first entry. The
-- index holds only STARTING partitions, so it stays as small as the unclaimed work.
--
-- No data moves. Lint: CONCURRENTLY cannot run in the migrator's transaction, so the index is
-- built IF NOT EXISTS while writes to step_partition wait (plans, claims, ends, lease
-- renewals; chunk commits go on); it reads the table once. On a large, busy database build it
-- beforehand by hand with CREATE INDEX CONCURRENTLY under the same name (docs/dba.md); this
-- statement then finds it and does nothing.

-- squawk-ignore require-concurrent-index-creation
CREATE INDEX IF NOT EXISTS step_partition_claimable -- noqa: PG01
ON pybatch.step_partition (step_execution_id, partition_ordinal)
WHERE status = 'STARTING';

COMMENT ON INDEX pybatch.step_partition_claimable IS
'STARTING partitions of each plan in ordinal order: the next claimable one.';

CREATE OR REPLACE FUNCTION pybatch.check_finished_execution_has_no_open_step()
RETURNS TRIGGER
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- The status filters live here, not in a WHEN clause: a WHEN clause would make the status
    -- columns depend on the trigger (ALTER COLUMN ... TYPE would need it dropped first). Each
    -- branch is planned only when it runs, so NEW needs only the columns it reads.
    IF TG_TABLE_NAME = 'job_execution' THEN
        -- A finished execution: none of its steps may still be open.
        IF NEW.status NOT IN ('STOPPED', 'FAILED', 'COMPLETED', 'ABANDONED') OR NOT EXISTS (
            SELECT 1
            FROM pybatch.step_execution AS s
            INNER JOIN pybatch.job_execution AS e ON s.job_execution_id = e.id
            WHERE
                e.id = NEW.id
                AND e.status IN ('STOPPED', 'FAILED', 'COMPLETED', 'ABANDONED')
                AND s.status IN ('STARTING', 'STARTED', 'STOPPING')
        ) THEN
            RETURN NULL;
        END IF;
    -- An open step: it may not still be open under a finished execution.
    ELSIF NEW.status NOT IN ('STARTING', 'STARTED', 'STOPPING') OR NOT EXISTS (
        SELECT 1
        FROM pybatch.step_execution AS s
        INNER JOIN pybatch.job_execution AS e ON s.job_execution_id = e.id
        WHERE
            s.id = NEW.id
            AND s.status IN ('STARTING', 'STARTED', 'STOPPING')
            AND e.status IN ('STOPPED', 'FAILED', 'COMPLETED', 'ABANDONED')
    ) THEN
        RETURN NULL;
    END IF;
    RAISE EXCEPTION 'a finished job execution has an unfinished step'
    USING
        ERRCODE = 'check_violation',
        CONSTRAINT = TG_NAME,
        SCHEMA = 'pybatch',
        TABLE = TG_TABLE_NAME;
END;
$$;
