-- Migration: a run's end releases its claimed partitions by probing its own steps' plans, never
-- by reading every STARTED partition of the history.
--
-- Why: end_unfinished_steps (every run's end, through end_job_execution; a recovery; a stop)
-- releases the partitions still claimed under the execution's steps. It found them with a join
-- of step_partition to step_execution on the execution id, and it runs on generic plans
-- (migration 0022). On a database whose history holds partitioned steps, the generic estimate
-- for "the steps of one execution" is the history's average, which plans of hundreds of worker
-- steps make large; the planner then read step_partition whole for its STARTED rows and joined
-- the execution's steps to them. Every run's end, of any job, read every partition ever
-- planned: with 100,000 partitions in the history, about 3,500 pages and 9 ms of server CPU at
-- the end of a one-step job that took 0.2 ms otherwise, growing with the history.
--
-- The release now looks up, for each step of the execution (step_execution_execution_identity),
-- that step's STARTED partitions (step_partition_parent_identity): a lateral subquery that the
-- planner cannot turn into a scan of the whole table, since it runs once per step with that
-- step's id. The partitions found are then updated by id, and the UPDATE checks their status
-- again, as the join did, so a partition that its worker ended meanwhile keeps its end. What
-- is released, and the lock order (the steps, then their partitions), are unchanged; so are
-- the function's other statement, its result and its settings.
--
-- Locks: CREATE OR REPLACE FUNCTION rewrites one pg_proc row; no table is locked. A session
-- runs the new body from its next call.

CREATE OR REPLACE FUNCTION pybatch.end_unfinished_steps(
    p_job_execution_id BIGINT,
    p_status TEXT,
    p_failure_category TEXT,
    p_ended_at TIMESTAMPTZ
)
RETURNS BIGINT
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    ended BIGINT;
BEGIN
    -- What is read after a lock must be current: each statement needs a new snapshot.
    IF pg_catalog.CURRENT_SETTING('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'pybatch runs its transitions READ COMMITTED'
        USING ERRCODE = 'invalid_transaction_state';
    END IF;
    PERFORM
    FROM pybatch.step_execution AS s
    WHERE
        s.job_execution_id = p_job_execution_id
        AND s.status IN ('STARTING', 'STARTED', 'STOPPING')
    ORDER BY s.id
    FOR NO KEY UPDATE;
    WITH ended_steps AS (
        UPDATE pybatch.step_execution AS s
        SET
            status = p_status,
            exit_code = p_status,
            failure_category = p_failure_category,
            failure_id = CASE WHEN p_failure_category IS NOT NULL THEN s.id END,
            ended_at = GREATEST(s.updated_at, s.started_at, s.created_at, p_ended_at),
            updated_at = GREATEST(s.updated_at, s.started_at, s.created_at, p_ended_at),
            version = s.version + 1
        WHERE
            s.job_execution_id = p_job_execution_id
            AND s.status IN ('STARTING', 'STARTED', 'STOPPING')
        RETURNING s.id
    ),

    released AS (
        UPDATE pybatch.step_partition AS p
        SET
            status = p_status,
            exit_code = p_status,
            worker_owner_token = NULL,
            worker_lease_expires_at = NULL,
            version = p.version + 1
        WHERE
            p.id = ANY(ARRAY(
                SELECT claimed.id
                FROM pybatch.step_execution AS parent
                CROSS JOIN LATERAL (
                    SELECT q.id
                    FROM pybatch.step_partition AS q
                    WHERE
                        q.step_execution_id = parent.id
                        AND q.status = 'STARTED'
                    -- Planned apart, once per step: never a scan of every plan's partitions.
                    OFFSET 0
                ) AS claimed
                WHERE parent.job_execution_id = p_job_execution_id
            ))
            AND p.status = 'STARTED'
        RETURNING p.id
    )

    -- A data-modifying CTE runs to completion whether or not the query reads it.
    SELECT pg_catalog.COUNT(*) INTO ended FROM ended_steps;
    RETURN ended;
END;
$$;
