-- Migration: a step's start reads the node's steps of its own instance only, whatever the
-- history of the node's name.
--
-- Why: start_step_execution (every run.step, through start_flow_step) finds the node's newest
-- step in the instance and counts the node's starts for the start limit, each by joining the
-- instance's executions to their steps of the node. Both statements run on generic plans
-- (plpgsql plans them once per session), and a generic plan cannot know how many steps share
-- the node's name: the statistics give it the average over all names. Where step names are
-- many (a date or a tenant in a name, or partitioned steps, whose workers each have a name of
-- their own), that average is a few rows, so PostgreSQL may join by merging the instance's
-- executions with every step of the name in the whole table (step_execution_logical_history):
-- a step start then read every step of that name ever run. With a history of 100,000
-- executions that each also ran a step of a name of its own, a one-step job's completion took
-- 4.7 times as long as on an empty database (bench.launch --many-step-names; server CPU 6
-- times).
--
-- Each statement now walks the instance's executions (job_execution_attempt_unique) and probes
-- each for the node's step (step_execution_logical_id_unique, at most one step per execution
-- and node): a LATERAL subquery with LIMIT cannot be turned into a join over the name's whole
-- history, so the work grows with the instance's attempts only. The function's results, refusals
-- and locks are unchanged.
--
-- Locks: CREATE OR REPLACE FUNCTION rewrites one pg_proc row; no table is locked. A session
-- runs the new body from its next call.

CREATE OR REPLACE FUNCTION pybatch.start_step_execution(
    p_job_execution_id BIGINT,
    p_owner_token BYTEA,
    p_step_name TEXT,
    p_node_id TEXT,
    p_start_limit BIGINT,
    p_now TIMESTAMPTZ,
    OUT outcome TEXT,
    OUT details JSONB,
    OUT step pybatch.step_execution -- noqa: CP05
)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    started BOOLEAN := p_owner_token IS NOT NULL;
    instance_id BIGINT;
BEGIN
    -- What is read after a lock must be current: each statement needs a new snapshot.
    IF pg_catalog.CURRENT_SETTING('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'pybatch runs its transitions READ COMMITTED'
        USING ERRCODE = 'invalid_transaction_state';
    END IF;
    SELECT e.job_instance_id INTO instance_id
    FROM pybatch.job_execution AS e
    WHERE e.id = p_job_execution_id;
    details := pg_catalog.JSONB_BUILD_OBJECT('id', p_job_execution_id);
    IF instance_id IS NULL THEN
        outcome := CASE WHEN started THEN 'ExecutionOwnershipLost' ELSE 'JobExecutionNotFound' END;
        RETURN;
    END IF;
    PERFORM
    FROM pybatch.job_instance AS i
    WHERE i.id = instance_id
    FOR UPDATE;
    IF started THEN
        PERFORM
        FROM pybatch.job_execution AS e
        WHERE
            e.id = p_job_execution_id
            AND e.owner_token = p_owner_token
            AND e.status IN ('STARTING', 'STARTED', 'STOPPING')
        FOR NO KEY UPDATE;
        IF NOT FOUND THEN
            outcome := 'ExecutionOwnershipLost';
            RETURN;
        END IF;
    END IF;
    details := NULL;
    -- The instance's attempts, newest first, each probed for the node's step: a node has at
    -- most one step per execution (step_execution_logical_id_unique).
    SELECT s.* INTO step
    FROM pybatch.job_execution AS e
    CROSS JOIN LATERAL (
        SELECT node_step.*
        FROM pybatch.step_execution AS node_step
        WHERE node_step.job_execution_id = e.id AND node_step.step_logical_id = p_node_id
        ORDER BY node_step.id DESC
        LIMIT 1
    ) AS s
    WHERE e.job_instance_id = instance_id
    ORDER BY e.attempt DESC
    LIMIT 1;
    IF started AND step.status = 'COMPLETED' THEN
        outcome := 'skipped';
        RETURN;
    END IF;
    IF EXISTS (
        SELECT
        FROM pybatch.step_execution AS s
        WHERE
            s.job_execution_id = p_job_execution_id
            AND (s.step_name = p_step_name OR s.step_logical_id = p_node_id)
    ) THEN
        outcome := 'DuplicateStep';
        details := pg_catalog.JSONB_BUILD_OBJECT(
            'job_execution_id', p_job_execution_id, 'step_name', p_step_name, 'node_id', p_node_id
        );
        RETURN;
    END IF;
    IF p_start_limit <= (
        SELECT pg_catalog.COUNT(*)
        FROM pybatch.job_execution AS e
        CROSS JOIN LATERAL (
            SELECT 1 AS started
            FROM pybatch.step_execution AS s
            WHERE s.job_execution_id = e.id AND s.step_logical_id = p_node_id
            LIMIT 1
        ) AS node_step
        WHERE e.job_instance_id = instance_id
    ) THEN
        outcome := 'StartLimitExceeded';
        details := pg_catalog.JSONB_BUILD_OBJECT(
            'instance_id', instance_id, 'node_id', p_node_id, 'limit', p_start_limit
        );
        RETURN;
    END IF;
    step := pybatch.insert_step_execution(
        p_job_execution_id, p_step_name, p_node_id, step.id, started, p_now
    );
    outcome := CASE WHEN started THEN 'started' ELSE 'created' END;
END;
$$;
