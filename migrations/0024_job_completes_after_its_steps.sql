-- Migration: a job execution completes only when none of its steps is unfinished.
--
-- Why: a step's end now commits without waiting for its WAL flush (docs/contract.md,
-- Durability of commits). The run's end, which waits, carries it to disk; but a server crash or
-- a failover between the two loses the step's end, and the run's end may then reach a server
-- where that step is still STARTED. end_job_execution used to end such a step with the job,
-- as COMPLETED with the reason CANCELLED, so the history would say the job completed while the
-- step's own end (its exit status, its counters) was never recorded. It now refuses:
-- outcome StepsUnfinished, naming the first unfinished step, and changes nothing. The run then
-- ends FAILED (its unfinished steps with it), and a restart resumes the step from its last
-- committed checkpoint, so every row is still written once.
--
-- A run never asks to complete while one of its steps runs: run.step ends its step before it
-- returns, and a partitioned step ends every worker before its aggregation. Only a lost end
-- meets the new refusal. Endings as STOPPED or FAILED still end the unfinished steps with the
-- execution, as before.
--
-- The check reads the execution's steps through step_execution_execution_identity, under the
-- execution's row lock that the function already takes; a step is only started by the
-- execution's owner, the caller itself. The rest of the function is unchanged.
--
-- Locks: CREATE OR REPLACE FUNCTION rewrites one pg_proc row; no table is locked. A session
-- runs the new body from its next call.

CREATE OR REPLACE FUNCTION pybatch.end_job_execution(
    p_job_execution_id BIGINT,
    p_owner_token BYTEA,
    p_status TEXT,
    p_error_class TEXT,
    p_message TEXT,
    p_sqlstate TEXT,
    p_constraint_name TEXT,
    p_table_name TEXT,
    p_column_name TEXT,
    p_now TIMESTAMPTZ,
    OUT outcome TEXT,
    OUT details JSONB,
    OUT execution pybatch.job_execution -- noqa: CP05
)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    ended_as TEXT;
    failed BOOLEAN;
    unfinished_id BIGINT;
    unfinished_status TEXT;
BEGIN
    SELECT e.* INTO execution
    FROM pybatch.job_execution AS e
    WHERE e.id = p_job_execution_id
    FOR NO KEY UPDATE;
    IF execution.owner_token IS DISTINCT FROM p_owner_token
        OR execution.status NOT IN ('STARTING', 'STARTED', 'STOPPING') THEN
        outcome := 'ExecutionOwnershipLost';
        details := pg_catalog.JSONB_BUILD_OBJECT('id', p_job_execution_id);
        RETURN;
    END IF;
    ended_as := CASE WHEN execution.status = 'STOPPING' THEN 'STOPPED' ELSE p_status END;
    IF NOT (execution.status, ended_as) IN (
        ('STARTED', 'COMPLETED'),
        ('STARTED', 'STOPPED'),
        ('STOPPING', 'STOPPED'),
        ('STARTING', 'FAILED'),
        ('STARTED', 'FAILED'),
        ('STOPPING', 'FAILED')
    ) THEN
        outcome := 'IllegalTransition';
        details := pg_catalog.JSONB_BUILD_OBJECT(
            'from_status', execution.status, 'to_status', ended_as
        );
        RETURN;
    END IF;
    IF ended_as = 'COMPLETED' THEN
        SELECT s.id, s.status INTO unfinished_id, unfinished_status
        FROM pybatch.step_execution AS s
        WHERE
            s.job_execution_id = p_job_execution_id
            AND s.status IN ('STARTING', 'STARTED', 'STOPPING')
        ORDER BY s.id
        LIMIT 1;
        IF FOUND THEN
            outcome := 'StepsUnfinished';
            details := pg_catalog.JSONB_BUILD_OBJECT(
                'id', p_job_execution_id,
                'step_execution_id', unfinished_id,
                'status', unfinished_status
            );
            RETURN;
        END IF;
    END IF;
    failed := ended_as = 'FAILED';
    UPDATE pybatch.job_execution AS e
    SET
        status = ended_as,
        exit_code = ended_as,
        failure_category = CASE WHEN failed THEN 'USER_COMPONENT' ELSE e.failure_category END,
        failure_id = CASE WHEN failed THEN e.id ELSE e.failure_id END,
        failure_error_class = CASE WHEN failed THEN p_error_class END,
        failure_message = CASE WHEN failed THEN p_message END,
        failure_sqlstate = CASE WHEN failed THEN p_sqlstate END,
        failure_constraint = CASE WHEN failed THEN p_constraint_name END,
        failure_table = CASE WHEN failed THEN p_table_name END,
        failure_column = CASE WHEN failed THEN p_column_name END,
        ended_at = GREATEST(e.updated_at, p_now),
        updated_at = GREATEST(e.updated_at, p_now),
        version = e.version + CASE WHEN failed AND p_error_class IS NOT NULL THEN 3 ELSE 2 END
    WHERE e.id = p_job_execution_id
    RETURNING e.* INTO execution;
    PERFORM pybatch.end_unfinished_steps(
        p_job_execution_id, ended_as, 'CANCELLED', execution.ended_at
    );
    outcome := 'ended';
END;
$$;
COMMENT ON FUNCTION pybatch.end_job_execution(
    BIGINT, BYTEA, TEXT, TEXT, TEXT, TEXT, TEXT, TEXT, TEXT, TIMESTAMPTZ
) IS 'Ends a running execution as its owner; it completes only once none of its steps runs.';
