-- Migration: a finished job execution has no unfinished step.
--
-- A step, a partitioned parent or a partition worker that stayed STARTED under a STOPPED,
-- FAILED, COMPLETED or ABANDONED execution could still commit chunks (its compare-and-swap
-- wanted only STARTED), and the next attempt resumed from its still-moving checkpoint: rows were
-- loaded twice. pybatch now ends the unfinished steps of an execution in the transaction that
-- finishes it (queries/steps.sql end_unfinished_step_executions), and this migration makes the
-- database refuse any transaction that would leave one behind, whoever writes it.
--
-- Existing rows: unfinished steps under a finished execution are ended FAILED (STALE_RECOVERED,
-- their owner is gone or was recovered), at the execution's end time, and the partitions their
-- workers held are released the same way. A step can only reach this state through the defect
-- this migration closes, so the rows are few; the UPDATEs touch only them.
--
-- The checks are deferred constraint triggers: they run at COMMIT, after every statement of the
-- transaction, because an execution and its steps end in separate statements of one
-- transaction. Creating a trigger takes a SHARE ROW EXCLUSIVE lock on the table for the length of
-- this migration's transaction only; it rewrites and scans nothing.

WITH ended AS (
    UPDATE pybatch.step_execution AS s
    SET
        status = 'FAILED',
        exit_code = 'FAILED',
        failure_category = 'STALE_RECOVERED',
        failure_id = s.id,
        ended_at = GREATEST(s.updated_at, s.started_at, s.created_at, e.ended_at),
        updated_at = GREATEST(s.updated_at, s.started_at, s.created_at, e.ended_at),
        version = s.version + 1
    FROM pybatch.job_execution AS e
    WHERE
        s.job_execution_id = e.id
        AND s.status IN ('STARTING', 'STARTED', 'STOPPING')
        AND e.status IN ('STOPPED', 'FAILED', 'COMPLETED', 'ABANDONED')
    RETURNING s.id
)

UPDATE pybatch.step_partition AS p
SET
    status = 'FAILED',
    exit_code = 'FAILED',
    worker_owner_token = NULL,
    worker_lease_expires_at = NULL,
    version = p.version + 1
FROM ended
WHERE p.worker_step_execution_id = ended.id AND p.status = 'STARTED';

CREATE FUNCTION pybatch.check_finished_execution_has_no_open_step()
RETURNS TRIGGER
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    checked_id BIGINT;
BEGIN
    -- The status filters live here, not in a WHEN clause: a WHEN clause would make the status
    -- columns depend on the trigger (ALTER COLUMN ... TYPE would need it dropped first). Each
    -- branch is planned only when it runs, so NEW needs only the column it reads.
    IF TG_TABLE_NAME = 'job_execution' THEN
        IF NEW.status NOT IN ('STOPPED', 'FAILED', 'COMPLETED', 'ABANDONED') THEN
            RETURN NULL;
        END IF;
        checked_id := NEW.id;
    ELSE
        IF NEW.status NOT IN ('STARTING', 'STARTED', 'STOPPING') THEN
            RETURN NULL;
        END IF;
        checked_id := NEW.job_execution_id;
    END IF;
    IF EXISTS (
        SELECT 1
        FROM pybatch.step_execution AS s
        INNER JOIN pybatch.job_execution AS e ON s.job_execution_id = e.id
        WHERE
            e.id = checked_id
            AND e.status IN ('STOPPED', 'FAILED', 'COMPLETED', 'ABANDONED')
            AND s.status IN ('STARTING', 'STARTED', 'STOPPING')
    ) THEN
        RAISE EXCEPTION 'a finished job execution has an unfinished step'
        USING
            ERRCODE = 'check_violation',
            CONSTRAINT = TG_NAME,
            SCHEMA = 'pybatch',
            TABLE = TG_TABLE_NAME;
    END IF;
    RETURN NULL;
END;
$$;

COMMENT ON FUNCTION pybatch.check_finished_execution_has_no_open_step() IS
'Constraint trigger body: refuses a transaction that leaves a step STARTING, STARTED or STOPPING '
'under a STOPPED, FAILED, COMPLETED or ABANDONED job execution.';

-- An execution that finishes must have ended its steps by COMMIT.
CREATE CONSTRAINT TRIGGER job_execution_finished_has_no_open_step
AFTER UPDATE OF status ON pybatch.job_execution
DEFERRABLE INITIALLY DEFERRED
FOR EACH ROW
EXECUTE FUNCTION pybatch.check_finished_execution_has_no_open_step();

-- A step cannot be created or reopened under an execution that has finished.
CREATE CONSTRAINT TRIGGER step_execution_open_under_unfinished_execution
AFTER INSERT OR UPDATE OF status ON pybatch.step_execution
DEFERRABLE INITIALLY DEFERRED
FOR EACH ROW
EXECUTE FUNCTION pybatch.check_finished_execution_has_no_open_step();
