-- Migration 0014: the transitions of a run, each one statement (schema version 14).
--
-- A launch, a step's start, a step's end and a run's end each were several statements (lock,
-- read, compare-and-swap, exit status, failure reason ...), and each statement a round trip.
-- Each is now one plpgsql function, called by one statement of queries/, which pybatch sends
-- as a transaction of its own in one round trip (UnitOfWork.commit_statement). The guards are
-- the same and stay in the database: the instance row lock serializing launches and step
-- starts, one unresolved execution per instance (job_execution_one_unresolved), the owner
-- token in the predicate of every write of a run, the transition table, start limits, the
-- exit status and the failure reason of the same transition.
--
-- Each function returns `outcome`: what it did (a lower-case word), or the refusal - the
-- name of the pybatch error that reports it (docs/errors.md), with that error's fields in
-- `details` - and the row it wrote or found, of its table's row type; a refusal writes
-- nothing. The caller decodes both strictly: an outcome or a field it does not know fails
-- closed. They run with the caller's rights (SECURITY INVOKER): grants and the job-family
-- policies of 0008 apply as to the statements they replace. Each statement of a function
-- takes a new snapshot (READ COMMITTED), so what is read after a lock is current; the
-- functions that rely on it refuse any other isolation level (SQLSTATE 25000). Lock order,
-- as everywhere: the instance, then the job execution, then its steps.
--
-- Locks: CREATE FUNCTION changes the catalog only; nothing is rewritten or scanned.

-- End every unfinished step of an execution that is ending, and release the partitions its
-- plans still have claimed: STOPPED when the execution stopped, else FAILED with the given
-- category. Locks the steps first (in id order), which waits for in-flight chunk commits and
-- partition claims; the UPDATEs then run on a new snapshot that sees every worker step such a
-- claim committed meanwhile. Timestamps never move backwards nor precede the step's start.
CREATE FUNCTION pybatch.end_unfinished_steps(
    p_job_execution_id BIGINT,
    p_status TEXT,
    p_failure_category TEXT,
    p_ended_at TIMESTAMPTZ
)
RETURNS BIGINT
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
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
        FROM pybatch.step_execution AS parent
        WHERE
            p.step_execution_id = parent.id
            AND parent.job_execution_id = p_job_execution_id
            AND p.status = 'STARTED'
        RETURNING p.id
    )

    -- A data-modifying CTE runs to completion whether or not the query reads it.
    SELECT pg_catalog.COUNT(*) INTO ended FROM ended_steps;
    RETURN ended;
END;
$$;

COMMENT ON FUNCTION pybatch.end_unfinished_steps(BIGINT, TEXT, TEXT, TIMESTAMPTZ) IS
'Ends the unfinished steps of an ending job execution and releases their claimed partitions.';

-- The definition a launch of job p_job_name runs: its id (outcome NULL), or why there is
-- none - DefinitionJobMismatch (the definition names another job), UnsupportedManifestVersion
-- (format outside 1..3), unregistered (the revision is unknown: the caller registers it and
-- tries again), DefinitionDrift (the revision is registered with another manifest digest).
CREATE FUNCTION pybatch.definition_of(
    p_job_name TEXT,
    p_definition_job_name TEXT,
    p_manifest_format INTEGER,
    p_definition_revision TEXT,
    p_manifest_digest BYTEA,
    OUT outcome TEXT,
    OUT details JSONB,
    OUT definition_id BIGINT
)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    digest BYTEA;
BEGIN
    IF p_definition_job_name <> p_job_name THEN
        outcome := 'DefinitionJobMismatch';
        details := pg_catalog.JSONB_BUILD_OBJECT(
            'expected', p_job_name, 'actual', p_definition_job_name
        );
        RETURN;
    END IF;
    IF p_manifest_format NOT BETWEEN 1 AND 3 THEN
        outcome := 'UnsupportedManifestVersion';
        details := pg_catalog.JSONB_BUILD_OBJECT('format', p_manifest_format);
        RETURN;
    END IF;
    SELECT d.id, d.manifest_digest INTO definition_id, digest
    FROM pybatch.job_definition AS d
    WHERE d.job_name = p_job_name AND d.definition_revision = p_definition_revision;
    IF definition_id IS NULL THEN
        outcome := 'unregistered';
    ELSIF digest <> p_manifest_digest THEN
        outcome := 'DefinitionDrift';
        details := pg_catalog.JSONB_BUILD_OBJECT(
            'job_name', p_job_name, 'revision', p_definition_revision
        );
    END IF;
END;
$$;

COMMENT ON FUNCTION pybatch.definition_of(TEXT, TEXT, INTEGER, TEXT, BYTEA) IS
'The registered definition a launch runs, or why there is none.';

-- A new attempt of an instance: the first, or a restart after FAILED or STOPPED. Under the
-- instance row's lock (which serializes launches, restarts and step starts), refused in this
-- order: JobInstanceNotFound; CompletedInstance, AbandonedInstance (the latest attempt, or the
-- tombstone of a purged history, says so); ExecutionAlreadyActive (an unresolved attempt is in
-- the way: execution is it, and its lease is judged on the database clock); definition_of's
-- outcomes, unless the caller resolved p_definition_id itself (it registered the definition
-- after unregistered); IncompatibleDefinition (a new definition without an upgrade edge from
-- the latest attempt's). Otherwise the attempt is
-- counted and inserted: STARTING and unclaimed (outcome created) without p_owner_token, else
-- STARTED, owned by it with its host and a lease on the database clock (outcome launched).
-- Nothing is written unless it created or launched. The instance and the latest attempt
-- (previous) come back whole, for the caller to decode: a launch never builds on a corrupt
-- row; execution is the new attempt, or the attempt in the way.
CREATE FUNCTION pybatch.create_job_execution(
    p_job_instance_id BIGINT,
    p_definition_id BIGINT,
    p_definition_job_name TEXT,
    p_manifest_format INTEGER,
    p_definition_revision TEXT,
    p_manifest_digest BYTEA,
    p_owner_token BYTEA,
    p_owner_host TEXT,
    p_lease_ms BIGINT,
    p_now TIMESTAMPTZ,
    OUT outcome TEXT,
    OUT details JSONB,
    OUT instance pybatch.job_instance, -- noqa: CP05
    OUT execution pybatch.job_execution, -- noqa: CP05
    OUT previous pybatch.job_execution, -- noqa: CP05
    OUT lease_expired BOOLEAN,
    OUT lease_remaining_ms BIGINT
)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    definition_id BIGINT;
    upgrade_from BIGINT;
    launched BOOLEAN := p_owner_token IS NOT NULL;
BEGIN
    -- What is read after a lock must be current: each statement needs a new snapshot.
    IF pg_catalog.CURRENT_SETTING('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'pybatch runs its transitions READ COMMITTED'
        USING ERRCODE = 'invalid_transaction_state';
    END IF;
    SELECT i.* INTO instance
    FROM pybatch.job_instance AS i
    WHERE i.id = p_job_instance_id
    FOR UPDATE;
    IF instance.id IS NULL THEN
        outcome := 'JobInstanceNotFound';
        details := pg_catalog.JSONB_BUILD_OBJECT('id', p_job_instance_id);
        RETURN;
    END IF;
    -- Parameters that are no object could not even be copied: the instance is corrupt.
    IF pg_catalog.JSONB_TYPEOF(instance.identifying_parameters) IS DISTINCT FROM 'object' THEN
        outcome := 'Unavailable';
        details := '{}';
        RETURN;
    END IF;
    -- Read under the lock: the latest attempt as the previous holder left it.
    SELECT e.* INTO execution
    FROM pybatch.job_execution AS e
    WHERE e.job_instance_id = p_job_instance_id
    ORDER BY e.attempt DESC
    LIMIT 1;
    previous := execution;
    outcome := CASE COALESCE(execution.status, instance.final_status)
        WHEN 'COMPLETED' THEN 'CompletedInstance'
        WHEN 'ABANDONED' THEN 'AbandonedInstance'
        WHEN 'STARTING' THEN 'ExecutionAlreadyActive'
        WHEN 'STARTED' THEN 'ExecutionAlreadyActive'
        WHEN 'STOPPING' THEN 'ExecutionAlreadyActive'
        WHEN 'UNKNOWN' THEN 'ExecutionAlreadyActive'
    END;
    details := pg_catalog.JSONB_BUILD_OBJECT(
        'id', p_job_instance_id, 'purged', execution.id IS NULL
    );
    IF outcome = 'ExecutionAlreadyActive' THEN
        details := pg_catalog.JSONB_BUILD_OBJECT(
            'instance_id', p_job_instance_id,
            'execution_id', execution.id,
            'status', execution.status
        );
        lease_expired := COALESCE(
            execution.lease_expires_at <= pg_catalog.CLOCK_TIMESTAMP(), FALSE
        );
        lease_remaining_ms := GREATEST(
            EXTRACT(EPOCH FROM execution.lease_expires_at - pg_catalog.CLOCK_TIMESTAMP()) * 1000, 0
        );
    END IF;
    definition_id := p_definition_id;
    IF outcome IS NULL AND definition_id IS NULL THEN
        SELECT d.outcome, d.details, d.definition_id INTO outcome, details, definition_id
        FROM pybatch.definition_of(
            instance.job_name,
            p_definition_job_name,
            p_manifest_format,
            p_definition_revision,
            p_manifest_digest
        ) AS d;
    END IF;
    -- Two definitions of one job never share a digest: another definition than the latest
    -- attempt's needs a direct upgrade edge.
    IF outcome IS NULL AND execution.definition_id <> definition_id THEN
        IF NOT EXISTS (
            SELECT
            FROM pybatch.definition_upgrade AS u
            WHERE
                u.from_definition_id = execution.definition_id
                AND u.to_definition_id = definition_id
        ) THEN
            outcome := 'IncompatibleDefinition';
            details := pg_catalog.JSONB_BUILD_OBJECT('instance_id', p_job_instance_id);
        END IF;
        upgrade_from := execution.definition_id;
    END IF;
    IF outcome IS NOT NULL THEN
        RETURN;
    END IF;
    UPDATE pybatch.job_instance AS i
    SET last_attempt = i.last_attempt + 1
    WHERE i.id = p_job_instance_id;
    INSERT INTO pybatch.job_execution AS e (
        job_instance_id,
        definition_id,
        upgrade_from_definition_id,
        restart_of_execution_id,
        attempt,
        status,
        exit_code,
        parameters,
        context_format,
        context_schema,
        context_schema_version,
        context_payload,
        created_at,
        started_at,
        updated_at,
        version,
        owner_token,
        owner_host,
        lease_expires_at
    )
    VALUES (
        p_job_instance_id,
        definition_id,
        upgrade_from,
        execution.id,
        instance.last_attempt + 1,
        CASE WHEN launched THEN 'STARTED' ELSE 'STARTING' END,
        'UNKNOWN',
        instance.identifying_parameters,
        1,
        'oxide_batch.empty.v1',
        1,
        CAST('{}' AS JSONB),
        p_now,
        CASE WHEN launched THEN p_now END,
        p_now,
        -- A launch is created STARTING (version 0), claimed and moved to STARTED (version 1).
        CASE WHEN launched THEN 1 ELSE 0 END,
        p_owner_token,
        p_owner_host,
        pg_catalog.CLOCK_TIMESTAMP() + p_lease_ms * INTERVAL '1 millisecond'
    )
    RETURNING e.* INTO execution;
    outcome := CASE WHEN launched THEN 'launched' ELSE 'created' END;
    details := NULL;
END;
$$;

COMMENT ON FUNCTION pybatch.create_job_execution(
    BIGINT, BIGINT, TEXT, INTEGER, TEXT, BYTEA, BYTEA, TEXT, BIGINT, TIMESTAMPTZ
) IS 'Creates the next attempt of an instance, or launches it STARTED and owned.';

-- Launch the instance of (job name, instance key) as p_owner_token: the instance is created
-- when absent (job_instance_identity_unique settles concurrent creators: the loser reads the
-- winner's row with a new snapshot), but only once its definition is usable, so a launch that
-- cannot run creates nothing; then create_job_execution launches it. Outcomes are
-- create_job_execution's, but ConcurrentModification for an instance a purge removed
-- meanwhile, and Unavailable when the stored parameters are not the key's.
CREATE FUNCTION pybatch.launch_job_execution(
    p_job_name TEXT,
    p_instance_key BYTEA,
    p_identifying_parameters JSONB,
    p_definition_id BIGINT,
    p_definition_job_name TEXT,
    p_manifest_format INTEGER,
    p_definition_revision TEXT,
    p_manifest_digest BYTEA,
    p_owner_token BYTEA,
    p_owner_host TEXT,
    p_lease_ms BIGINT,
    p_now TIMESTAMPTZ,
    OUT outcome TEXT,
    OUT details JSONB,
    OUT instance pybatch.job_instance, -- noqa: CP05
    OUT execution pybatch.job_execution, -- noqa: CP05
    OUT previous pybatch.job_execution, -- noqa: CP05
    OUT lease_expired BOOLEAN,
    OUT lease_remaining_ms BIGINT
)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    instance_id BIGINT;
    stored JSONB := p_identifying_parameters;
    created RECORD;
BEGIN
    SELECT i.id, i.identifying_parameters INTO instance_id, stored
    FROM pybatch.job_instance AS i
    WHERE i.job_name = p_job_name AND i.instance_key = p_instance_key;
    IF instance_id IS NULL AND p_definition_id IS NULL THEN
        SELECT d.outcome, d.details INTO outcome, details
        FROM pybatch.definition_of(
            p_job_name,
            p_definition_job_name,
            p_manifest_format,
            p_definition_revision,
            p_manifest_digest
        ) AS d;
    END IF;
    IF outcome IS NOT NULL THEN
        RETURN;
    END IF;
    IF instance_id IS NULL THEN
        INSERT INTO pybatch.job_instance AS i (
            job_name, instance_key, identifying_parameters, created_at
        )
        VALUES (p_job_name, p_instance_key, p_identifying_parameters, p_now)
        ON CONFLICT ON CONSTRAINT job_instance_identity_unique DO NOTHING
        RETURNING i.id, i.identifying_parameters INTO instance_id, stored;
        IF instance_id IS NULL THEN
            SELECT i.id, i.identifying_parameters INTO instance_id, stored
            FROM pybatch.job_instance AS i
            WHERE i.job_name = p_job_name AND i.instance_key = p_instance_key;
        END IF;
    END IF;
    IF instance_id IS NOT NULL AND stored IS DISTINCT FROM p_identifying_parameters THEN
        outcome := 'Unavailable';
        details := '{}';
        RETURN;
    END IF;
    SELECT * INTO created
    FROM pybatch.create_job_execution(
        instance_id,
        p_definition_id,
        p_definition_job_name,
        p_manifest_format,
        p_definition_revision,
        p_manifest_digest,
        p_owner_token,
        p_owner_host,
        p_lease_ms,
        p_now
    );
    outcome := created.outcome;
    details := created.details;
    instance := created.instance;
    execution := created.execution;
    previous := created.previous;
    lease_expired := created.lease_expired;
    lease_remaining_ms := created.lease_remaining_ms;
    IF outcome = 'JobInstanceNotFound' THEN
        outcome := 'ConcurrentModification';
        details := '{}';
    END IF;
END;
$$;

COMMENT ON FUNCTION pybatch.launch_job_execution(
    TEXT, BYTEA, JSONB, BIGINT, TEXT, INTEGER, TEXT, BYTEA, BYTEA, TEXT, BIGINT, TIMESTAMPTZ
) IS 'Launches or restarts the instance of a key in one statement: STARTED, owned and leased.';

-- Insert a step of an execution: STARTING (version 0), or STARTED (version 1: created STARTING
-- and started at once) with p_started, with the durable state of step p_source_id copied
-- (counters, checkpoint, context, retry, skip and no-rollback counts, fault state), or fresh
-- without one. Name and logical id uniqueness arbitrate duplicates.
CREATE FUNCTION pybatch.insert_step_execution(
    p_job_execution_id BIGINT,
    p_step_name TEXT,
    p_node_id TEXT,
    p_source_id BIGINT,
    p_started BOOLEAN,
    p_now TIMESTAMPTZ
)
RETURNS pybatch.step_execution -- noqa: CP05
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    inserted pybatch.step_execution;
BEGIN
    IF p_source_id IS NULL THEN
        -- A fresh step: empty state; counters and fault state are the columns' defaults (zero,
        -- the empty fault-state envelope).
        INSERT INTO pybatch.step_execution AS s (
            job_execution_id,
            step_name,
            step_logical_id,
            status,
            exit_code,
            checkpoint_format,
            checkpoint_schema,
            checkpoint_schema_version,
            checkpoint_payload,
            context_format,
            context_schema,
            context_schema_version,
            context_payload,
            created_at,
            started_at,
            updated_at,
            version
        )
        VALUES (
            p_job_execution_id,
            p_step_name,
            p_node_id,
            CASE WHEN p_started THEN 'STARTED' ELSE 'STARTING' END,
            'UNKNOWN',
            1,
            'oxide_batch.empty.v1',
            1,
            CAST('{}' AS JSONB),
            1,
            'oxide_batch.empty.v1',
            1,
            CAST('{}' AS JSONB),
            p_now,
            CASE WHEN p_started THEN p_now END,
            p_now,
            CASE WHEN p_started THEN 1 ELSE 0 END
        )
        RETURNING s.* INTO inserted;
    ELSE
        -- Every durable field of the source: counters, checkpoint, context, retry, skip and
        -- no-rollback counts, the fault-state envelope.
        INSERT INTO pybatch.step_execution AS s (
            job_execution_id,
            step_name,
            step_logical_id,
            status,
            exit_code,
            read_count,
            processed_count,
            write_count,
            filter_count,
            commit_count,
            rollback_count,
            checkpoint_format,
            checkpoint_schema,
            checkpoint_schema_version,
            checkpoint_payload,
            context_format,
            context_schema,
            context_schema_version,
            context_payload,
            read_retry_count,
            process_retry_count,
            write_retry_count,
            read_skip_count,
            process_skip_count,
            write_skip_count,
            no_rollback_count,
            fault_state_format,
            fault_state_schema,
            fault_state_schema_version,
            fault_state_payload,
            fault_state_checksum,
            created_at,
            started_at,
            updated_at,
            version
        )
        SELECT
            p_job_execution_id,
            p_step_name,
            p_node_id,
            CASE WHEN p_started THEN 'STARTED' ELSE 'STARTING' END,
            'UNKNOWN',
            src.read_count,
            src.processed_count,
            src.write_count,
            src.filter_count,
            src.commit_count,
            src.rollback_count,
            src.checkpoint_format,
            src.checkpoint_schema,
            src.checkpoint_schema_version,
            src.checkpoint_payload,
            src.context_format,
            src.context_schema,
            src.context_schema_version,
            src.context_payload,
            src.read_retry_count,
            src.process_retry_count,
            src.write_retry_count,
            src.read_skip_count,
            src.process_skip_count,
            src.write_skip_count,
            src.no_rollback_count,
            src.fault_state_format,
            src.fault_state_schema,
            src.fault_state_schema_version,
            src.fault_state_payload,
            src.fault_state_checksum,
            p_now,
            CASE WHEN p_started THEN p_now END,
            p_now,
            CASE WHEN p_started THEN 1 ELSE 0 END
        FROM pybatch.step_execution AS src
        WHERE src.id = p_source_id
        RETURNING s.* INTO inserted;
    END IF;
    RETURN inserted;
END;
$$;

COMMENT ON FUNCTION pybatch.insert_step_execution(BIGINT, TEXT, TEXT, BIGINT, BOOLEAN, TIMESTAMPTZ)
IS 'Inserts a step, fresh or with the durable state of a source step copied.';

-- Start a node's step in an execution, with the durable state of the node's newest step in
-- the instance (counters, checkpoint, context, retry and skip counts, fault state), fresh
-- without one. With p_owner_token, as the running execution's owner: skipped if that newest
-- step is COMPLETED, else created STARTED (outcome started); without, created STARTING (outcome
-- created) for the caller to start. Refusals: JobExecutionNotFound, ExecutionOwnershipLost (not
-- this owner's execution, or not active), DuplicateStep (the name or node is taken in the
-- execution), StartLimitExceeded (the node started as often as allowed in the instance). The
-- instance row lock serializes starts across attempts, so the count and the insert never
-- interleave.
CREATE FUNCTION pybatch.start_step_execution(
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
    SELECT s.* INTO step
    FROM pybatch.job_execution AS e
    INNER JOIN pybatch.step_execution AS s
        ON e.id = s.job_execution_id AND s.step_logical_id = p_node_id
    WHERE e.job_instance_id = instance_id
    ORDER BY e.attempt DESC, s.id DESC
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
        INNER JOIN pybatch.step_execution AS s
            ON e.id = s.job_execution_id AND s.step_logical_id = p_node_id
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

COMMENT ON FUNCTION pybatch.start_step_execution(BIGINT, BYTEA, TEXT, TEXT, BIGINT, TIMESTAMPTZ)
IS 'Starts a node''s step with the newest state of the node, or finds it completed earlier.';

-- Create a step of an execution (STARTING) under its name; in a restart attempt with the durable
-- state of the same step of the previous attempt - the step the definition upgrade maps it to,
-- when the attempt upgraded its definition. Refused in this order: JobExecutionNotFound,
-- DuplicateStep, InvalidDefinitionUpgrade (no mapping entry), RestartStateNotFound (no source
-- step). The execution comes back whole, for the caller to decode: no step begins under a
-- corrupt one.
CREATE FUNCTION pybatch.create_step_execution(
    p_job_execution_id BIGINT,
    p_step_name TEXT,
    p_now TIMESTAMPTZ,
    OUT outcome TEXT,
    OUT details JSONB,
    OUT execution pybatch.job_execution, -- noqa: CP05
    OUT step pybatch.step_execution -- noqa: CP05
)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    source_name TEXT := p_step_name;
    source_id BIGINT;
BEGIN
    SELECT e.* INTO execution
    FROM pybatch.job_execution AS e
    WHERE e.id = p_job_execution_id;
    IF execution.id IS NULL THEN
        outcome := 'JobExecutionNotFound';
        details := pg_catalog.JSONB_BUILD_OBJECT('id', p_job_execution_id);
        RETURN;
    END IF;
    IF EXISTS (
        SELECT
        FROM pybatch.step_execution AS s
        WHERE
            s.job_execution_id = p_job_execution_id
            AND (s.step_name = p_step_name OR s.step_logical_id = p_step_name)
    ) THEN
        outcome := 'DuplicateStep';
        details := pg_catalog.JSONB_BUILD_OBJECT(
            'job_execution_id', p_job_execution_id, 'step_name', p_step_name, 'node_id', p_step_name
        );
        RETURN;
    END IF;
    IF execution.restart_of_execution_id IS NOT NULL THEN
        IF execution.upgrade_from_definition_id IS NOT NULL THEN
            SELECT m.source_step_name INTO source_name
            FROM pybatch.definition_upgrade AS u
            CROSS JOIN LATERAL pg_catalog.JSONB_EACH_TEXT(u.step_mapping)
                AS m (source_step_name, target_step_name)
            WHERE
                u.from_definition_id = execution.upgrade_from_definition_id
                AND u.to_definition_id = execution.definition_id
                AND m.target_step_name = p_step_name;
            IF NOT FOUND THEN
                outcome := 'InvalidDefinitionUpgrade';
                details := pg_catalog.JSONB_BUILD_OBJECT('execution_id', p_job_execution_id);
                RETURN;
            END IF;
        END IF;
        SELECT s.id INTO source_id
        FROM pybatch.step_execution AS s
        WHERE
            s.job_execution_id = execution.restart_of_execution_id
            AND s.step_name = source_name
        ORDER BY s.id DESC
        LIMIT 1;
        IF source_id IS NULL THEN
            outcome := 'RestartStateNotFound';
            details := pg_catalog.JSONB_BUILD_OBJECT(
                'execution_id', p_job_execution_id, 'step_name', p_step_name
            );
            RETURN;
        END IF;
    END IF;
    step := pybatch.insert_step_execution(
        p_job_execution_id, p_step_name, p_step_name, source_id, FALSE, p_now
    );
    outcome := 'created';
END;
$$;

COMMENT ON FUNCTION pybatch.create_step_execution(BIGINT, TEXT, TIMESTAMPTZ) IS
'Creates a step (STARTING), in a restart with the durable state of its previous attempt.';

-- End a step of a running execution as its owner: COMPLETED, STOPPED or FAILED (by user code:
-- category USER_COMPONENT, failure id the step's), with the exit status of the same name and,
-- when given, the failure reason. The version moves by one per change the transition, the
-- reason and the exit status each made when they were separate statements. Outcome ended, or
-- ExecutionOwnershipLost (the execution is not this owner's, or not active),
-- StepExecutionNotFound (not in the execution), IllegalTransition (the transition table forbids
-- it from the step's status).
CREATE FUNCTION pybatch.end_step_execution(
    p_job_execution_id BIGINT,
    p_owner_token BYTEA,
    p_step_execution_id BIGINT,
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
    OUT step pybatch.step_execution -- noqa: CP05
)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM
    FROM pybatch.job_execution AS e
    WHERE
        e.id = p_job_execution_id
        AND e.owner_token = p_owner_token
        AND e.status IN ('STARTING', 'STARTED', 'STOPPING')
    FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        outcome := 'ExecutionOwnershipLost';
        details := pg_catalog.JSONB_BUILD_OBJECT('id', p_job_execution_id);
        RETURN;
    END IF;
    UPDATE pybatch.step_execution AS s
    SET
        status = p_status,
        exit_code = p_status,
        failure_category
        = CASE WHEN p_status = 'FAILED' THEN 'USER_COMPONENT' ELSE s.failure_category END,
        failure_id = CASE WHEN p_status = 'FAILED' THEN s.id ELSE s.failure_id END,
        -- Only a FAILED step gets a reason, and no step it can end from has one already.
        failure_error_class = p_error_class,
        failure_message = p_message,
        failure_sqlstate = p_sqlstate,
        failure_constraint = p_constraint_name,
        failure_table = p_table_name,
        failure_column = p_column_name,
        ended_at = GREATEST(s.updated_at, p_now),
        updated_at = GREATEST(s.updated_at, p_now),
        version = s.version + CASE WHEN p_error_class IS NULL THEN 2 ELSE 3 END
    WHERE
        s.id = p_step_execution_id
        AND s.job_execution_id = p_job_execution_id
        AND (s.status, p_status) IN (
            ('STARTED', 'COMPLETED'),
            ('STARTED', 'STOPPED'),
            ('STOPPING', 'STOPPED'),
            ('STARTING', 'FAILED'),
            ('STARTED', 'FAILED'),
            ('STOPPING', 'FAILED'),
            ('UNKNOWN', 'FAILED')
        )
    RETURNING s.* INTO step;
    IF FOUND THEN
        outcome := 'ended';
        RETURN;
    END IF;
    SELECT s.* INTO step
    FROM pybatch.step_execution AS s
    WHERE s.id = p_step_execution_id AND s.job_execution_id = p_job_execution_id;
    IF step.id IS NULL THEN
        outcome := 'StepExecutionNotFound';
        details := pg_catalog.JSONB_BUILD_OBJECT('id', p_step_execution_id);
    ELSE
        outcome := 'IllegalTransition';
        details := pg_catalog.JSONB_BUILD_OBJECT('from_status', step.status, 'to_status', p_status);
    END IF;
END;
$$;

COMMENT ON FUNCTION pybatch.end_step_execution(
    BIGINT, BYTEA, BIGINT, TEXT, TEXT, TEXT, TEXT, TEXT, TEXT, TEXT, TIMESTAMPTZ
) IS 'Ends a step of a running execution as its owner: status, exit status, failure reason.';

-- End a running execution as its owner: COMPLETED, STOPPED or FAILED (category USER_COMPONENT,
-- failure id the execution's), STOPPED whatever was asked once a stop was observed
-- (STOPPING), with the exit status of the same name, the failure reason when given, and its
-- unfinished steps ended with it (end_unfinished_steps, category CANCELLED). The version moves
-- as in end_step_execution. Outcome ended, or ExecutionOwnershipLost (not this owner's, or not
-- active), IllegalTransition.
CREATE FUNCTION pybatch.end_job_execution(
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
) IS 'Ends a running execution as its owner, with its exit status, reason and open steps.';
