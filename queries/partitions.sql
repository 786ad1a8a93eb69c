-- :name lock_partition_step :one
-- :doc Lock a partition parent (manager) or worker step: its execution and status
-- (step_execution_pkey; lock order - parent, then partitions, then workers).
SELECT
    s.job_execution_id,
    s.status
FROM pybatch.step_execution AS s
WHERE s.id = :step_execution_id
FOR UPDATE;

-- :name find_step_partition_plan :scalar
-- :doc Whether a parent already has a plan (step_partition_parent_identity).
SELECT EXISTS(
    SELECT 1
    FROM pybatch.step_partition AS p
    WHERE p.step_execution_id = :step_execution_id
) AS plan_exists;

-- :name insert_step_partitions :many
-- :doc Insert a whole plan in one statement, one row per entry (STARTING, no worker, version 0);
-- the arrays are parallel and in entry order. step_partition_key_unique backs
-- DuplicatePartitionKey and step_partition_ordinal_unique backs PartitionPlanExists.
INSERT INTO pybatch.step_partition (
    step_execution_id,
    partition_key,
    partition_ordinal,
    status,
    context_format,
    context_schema,
    context_schema_version,
    context_payload,
    context_checksum
)
SELECT
    :step_execution_id AS step_execution_id,
    entry.partition_key,
    entry.partition_ordinal,
    'STARTING' AS status,
    1 AS context_format,
    entry.context_schema,
    entry.context_schema_version,
    CAST(entry.context_payload AS JSONB) AS context_payload,
    entry.context_checksum
FROM (
    -- The parallel arrays by subscript: a multi-argument UNNEST is grammar only when written
    -- unqualified, and then its UNNEST calls follow search_path.
    SELECT
        (CAST(:partition_keys AS TEXT[]))[i.n] AS partition_key,
        (CAST(:partition_ordinals AS INTEGER[]))[i.n] AS partition_ordinal,
        (CAST(:context_schemas AS TEXT[]))[i.n] AS context_schema,
        (CAST(:context_schema_versions AS INTEGER[]))[i.n] AS context_schema_version,
        (CAST(:context_payloads AS TEXT[]))[i.n] AS context_payload,
        (CAST(:context_checksums AS BYTEA[]))[i.n] AS context_checksum
    FROM pg_catalog.GENERATE_SUBSCRIPTS(CAST(:partition_keys AS TEXT[]), 1) AS i (n)
) AS entry
ORDER BY entry.partition_ordinal
RETURNING
    id,
    step_execution_id,
    worker_step_execution_id,
    partition_key,
    partition_ordinal,
    status,
    exit_code,
    read_count,
    processed_count,
    write_count,
    filter_count,
    commit_count,
    rollback_count,
    context_format,
    context_schema,
    context_schema_version,
    context_payload,
    context_checksum,
    version;

-- :name list_step_partitions :many
-- :doc A plan in key byte order (the key column is COLLATE "C"; step_partition_key_unique).
SELECT
    p.id,
    p.step_execution_id,
    p.worker_step_execution_id,
    p.partition_key,
    p.partition_ordinal,
    p.status,
    p.exit_code,
    p.read_count,
    p.processed_count,
    p.write_count,
    p.filter_count,
    p.commit_count,
    p.rollback_count,
    p.context_format,
    p.context_schema,
    p.context_schema_version,
    p.context_payload,
    p.context_checksum,
    p.version
FROM pybatch.step_partition AS p
WHERE p.step_execution_id = :step_execution_id
ORDER BY p.partition_key;

-- :name lock_step_partitions_by_ordinal :many
-- :doc Lock every partition of a plan in ordinal order (plan restart source).
SELECT
    p.id,
    p.step_execution_id,
    p.worker_step_execution_id,
    p.partition_key,
    p.partition_ordinal,
    p.status,
    p.exit_code,
    p.read_count,
    p.processed_count,
    p.write_count,
    p.filter_count,
    p.commit_count,
    p.rollback_count,
    p.context_format,
    p.context_schema,
    p.context_schema_version,
    p.context_payload,
    p.context_checksum,
    p.version
FROM pybatch.step_partition AS p
WHERE p.step_execution_id = :step_execution_id
ORDER BY p.partition_ordinal
FOR UPDATE;

-- :name lock_partition_restart_pair :one
-- :doc Lock the source job execution, the source step and the target step of a plan restart
-- in that order, and compare their logical ids and statuses.
SELECT
    from_job.status AS source_job_status,
    to_step.status AS target_status,
    from_step.step_logical_id = to_step.step_logical_id AS same_logical_id
FROM pybatch.step_execution AS from_step
INNER JOIN pybatch.job_execution AS from_job ON from_step.job_execution_id = from_job.id
CROSS JOIN pybatch.step_execution AS to_step
WHERE from_step.id = :source_step_execution_id AND to_step.id = :step_execution_id
FOR UPDATE OF from_job, from_step, to_step;

-- :name copy_step_partitions :many
-- :doc Carry a locked source plan into a new parent (ordinal order, version 0): a COMPLETED
-- partition keeps its worker, status, exit and counts and is never rerun; any other becomes
-- STARTING, unassigned, exit UNKNOWN, zero counts.
INSERT INTO pybatch.step_partition (
    step_execution_id,
    worker_step_execution_id,
    partition_key,
    partition_ordinal,
    status,
    exit_code,
    read_count,
    processed_count,
    write_count,
    filter_count,
    commit_count,
    rollback_count,
    context_format,
    context_schema,
    context_schema_version,
    context_payload,
    context_checksum,
    version
)
SELECT
    :step_execution_id AS step_execution_id,
    CASE WHEN src.status = 'COMPLETED' THEN src.worker_step_execution_id END
        AS worker_step_execution_id,
    src.partition_key,
    src.partition_ordinal,
    CASE WHEN src.status = 'COMPLETED' THEN src.status ELSE 'STARTING' END AS status,
    CASE WHEN src.status = 'COMPLETED' THEN src.exit_code ELSE 'UNKNOWN' END AS exit_code,
    CASE WHEN src.status = 'COMPLETED' THEN src.read_count ELSE 0 END AS read_count,
    CASE WHEN src.status = 'COMPLETED' THEN src.processed_count ELSE 0 END AS processed_count,
    CASE WHEN src.status = 'COMPLETED' THEN src.write_count ELSE 0 END AS write_count,
    CASE WHEN src.status = 'COMPLETED' THEN src.filter_count ELSE 0 END AS filter_count,
    CASE WHEN src.status = 'COMPLETED' THEN src.commit_count ELSE 0 END AS commit_count,
    CASE WHEN src.status = 'COMPLETED' THEN src.rollback_count ELSE 0 END AS rollback_count,
    src.context_format,
    src.context_schema,
    src.context_schema_version,
    src.context_payload,
    src.context_checksum,
    0 AS version
FROM pybatch.step_partition AS src
WHERE src.step_execution_id = :source_step_execution_id
ORDER BY src.partition_ordinal
RETURNING
    id,
    step_execution_id,
    worker_step_execution_id,
    partition_key,
    partition_ordinal,
    status,
    exit_code,
    read_count,
    processed_count,
    write_count,
    filter_count,
    commit_count,
    rollback_count,
    context_format,
    context_schema,
    context_schema_version,
    context_payload,
    context_checksum,
    version;

-- :name update_step_execution_aggregate :affected
-- :doc End a parent with the aggregate of its partitions - status, failure, end time, exit and
-- counters - as a compare-and-swap on its version; updated_at never moves backwards.
UPDATE pybatch.step_execution
SET
    status = :status,
    exit_code = :exit_code,
    failure_category = :failure_category,
    failure_id = :failure_id,
    started_at = :started_at,
    ended_at = :ended_at,
    read_count = :read_count,
    processed_count = :processed_count,
    write_count = :write_count,
    filter_count = :filter_count,
    commit_count = :commit_count,
    rollback_count = :rollback_count,
    updated_at = GREATEST(updated_at, :transitioned_at),
    version = version + 1
WHERE id = :step_execution_id AND version = :expected_version;

-- :name claim_step_partition :one
-- :doc Claim the next partition of a STARTED parent in one guarded statement. With
-- step_partition_id given it follows end_step_partition in the same transaction (a worker's
-- loop: one round trip per partition) and claims only if that end completed the partition in
-- this transaction - at expected_version + 1, with this worker, its row version written by the
-- current transaction (xmin) - so a refused end claims nothing. The claim: lock the first
-- claimable partition in ordinal order (FOR UPDATE SKIP LOCKED, so N workers never take the
-- same one), create its STARTED worker step copying the partition's latest earlier worker (its
-- checkpoint, counters and fault state; fresh state when there is none), and assign it as a
-- compare-and-swap on the version, recording the claimer's owner token and starting its lease
-- on the database clock. Claimable - STARTING, or FAILED after its worker was
-- recovered as lost (STALE_RECOVERED) while fewer than max_partition_version / 2 workers
-- tried it in this attempt (each try adds 2 to the version). Always one row; id NULL - nothing
-- claimable now, the parent is not STARTED, or the end was refused. The partition's columns the
-- claim set (parent, worker, status, exit, zero counters) are not returned: the caller knows them.
WITH parent AS (
    SELECT
        s.id,
        s.job_execution_id
    FROM pybatch.step_execution AS s
    WHERE
        s.id = :step_execution_id
        AND s.status = 'STARTED'
        AND (
            CAST(:step_partition_id AS BIGINT) IS NULL
            OR EXISTS (
                SELECT 1
                FROM pybatch.step_partition AS ended
                WHERE
                    ended.id = :step_partition_id
                    AND ended.version = CAST(:expected_version AS BIGINT) + 1
                    AND ended.worker_step_execution_id = :worker_step_execution_id
                    AND ended.xmin = CAST(pg_catalog.PG_CURRENT_XACT_ID() AS XID)
            )
        )
    FOR SHARE
),

-- The parent is locked first (a one-time EXISTS); the plan's STARTING partitions - those without
-- a worker (step_partition_worker_shape) - are then read in ordinal order from
-- step_partition_unassigned, so the first unlocked one ends the scan.
unclaimed AS (
    SELECT
        p.id,
        p.partition_key,
        p.partition_ordinal,
        p.version,
        (SELECT parent.job_execution_id FROM parent) AS job_execution_id
    FROM pybatch.step_partition AS p
    WHERE
        p.step_execution_id = :step_execution_id
        AND p.worker_step_execution_id IS NULL
        AND EXISTS (SELECT 1 FROM parent)
    ORDER BY p.partition_ordinal
    LIMIT 1
    FOR UPDATE OF p SKIP LOCKED
),

lost AS (
    SELECT
        p.id,
        p.partition_key,
        p.partition_ordinal,
        p.version,
        parent.job_execution_id
    FROM pybatch.step_partition AS p
    INNER JOIN parent ON p.step_execution_id = parent.id
    INNER JOIN pybatch.step_execution AS dead ON p.worker_step_execution_id = dead.id
    WHERE
        p.status = 'FAILED'
        AND dead.failure_category = 'STALE_RECOVERED'
        AND p.version < :max_partition_version
        AND NOT EXISTS (SELECT 1 FROM unclaimed)
    ORDER BY p.partition_ordinal
    LIMIT 1
    FOR UPDATE OF p SKIP LOCKED
),

picked AS (
    SELECT
        unclaimed.id,
        unclaimed.partition_key,
        unclaimed.partition_ordinal,
        unclaimed.version,
        unclaimed.job_execution_id
    FROM unclaimed
    UNION ALL
    SELECT
        lost.id,
        lost.partition_key,
        lost.partition_ordinal,
        lost.version,
        lost.job_execution_id
    FROM lost
),

resume_source AS (
    SELECT earlier.worker_step_execution_id AS id
    FROM picked
    INNER JOIN pybatch.job_execution AS this_job ON picked.job_execution_id = this_job.id
    INNER JOIN pybatch.job_execution AS attempt_job
        ON this_job.job_instance_id = attempt_job.job_instance_id
    -- Each attempt probed for the node's step (at most one per execution), never a join with
    -- every step of the node's name in the table (see find_latest_flow_step_execution).
    CROSS JOIN
        LATERAL (
            SELECT node_step.id
            FROM pybatch.step_execution AS node_step
            WHERE
                node_step.job_execution_id = attempt_job.id
                AND node_step.step_logical_id = :node_id
            ORDER BY node_step.id DESC
            LIMIT 1
        ) AS earlier_parent
    INNER JOIN pybatch.step_partition AS earlier
        ON
            earlier_parent.id = earlier.step_execution_id
            AND picked.partition_key = earlier.partition_key
    WHERE earlier.worker_step_execution_id IS NOT NULL
    ORDER BY attempt_job.attempt DESC, earlier.worker_step_execution_id DESC
    LIMIT 1
),

worker AS (
    INSERT INTO pybatch.step_execution (
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
        picked.job_execution_id,
        :worker_name_prefix
        || '#'
        || picked.partition_ordinal
        || '.'
        || (picked.version + 1) AS step_name,
        :worker_name_prefix
        || '#'
        || picked.partition_ordinal
        || '.'
        || (picked.version + 1) AS step_logical_id,
        'STARTED' AS status,
        'UNKNOWN' AS exit_code,
        COALESCE(src.read_count, 0) AS read_count,
        COALESCE(src.processed_count, 0) AS processed_count,
        COALESCE(src.write_count, 0) AS write_count,
        COALESCE(src.filter_count, 0) AS filter_count,
        COALESCE(src.commit_count, 0) AS commit_count,
        COALESCE(src.rollback_count, 0) AS rollback_count,
        COALESCE(src.checkpoint_format, 1) AS checkpoint_format,
        COALESCE(src.checkpoint_schema, 'oxide_batch.empty.v1') AS checkpoint_schema,
        COALESCE(src.checkpoint_schema_version, 1) AS checkpoint_schema_version,
        COALESCE(src.checkpoint_payload, CAST('{}' AS JSONB)) AS checkpoint_payload,
        COALESCE(src.context_format, 1) AS context_format,
        COALESCE(src.context_schema, 'oxide_batch.empty.v1') AS context_schema,
        COALESCE(src.context_schema_version, 1) AS context_schema_version,
        COALESCE(src.context_payload, CAST('{}' AS JSONB)) AS context_payload,
        COALESCE(src.read_retry_count, 0) AS read_retry_count,
        COALESCE(src.process_retry_count, 0) AS process_retry_count,
        COALESCE(src.write_retry_count, 0) AS write_retry_count,
        COALESCE(src.read_skip_count, 0) AS read_skip_count,
        COALESCE(src.process_skip_count, 0) AS process_skip_count,
        COALESCE(src.write_skip_count, 0) AS write_skip_count,
        COALESCE(src.no_rollback_count, 0) AS no_rollback_count,
        1 AS fault_state_format,
        COALESCE(src.fault_state_schema, 'oxide-batch.fault-state') AS fault_state_schema,
        COALESCE(src.fault_state_schema_version, 1) AS fault_state_schema_version,
        COALESCE(src.fault_state_payload, :fault_state_payload) AS fault_state_payload,
        COALESCE(src.fault_state_checksum, :fault_state_checksum) AS fault_state_checksum,
        :now AS created_at,
        :now AS started_at,
        :now AS updated_at,
        0 AS version
    FROM picked
    LEFT JOIN resume_source ON TRUE
    LEFT JOIN pybatch.step_execution AS src ON resume_source.id = src.id
    RETURNING
        id,
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
        failure_category,
        failure_id,
        created_at,
        started_at,
        ended_at,
        updated_at,
        version,
        read_retry_count,
        process_retry_count,
        write_retry_count,
        read_skip_count,
        process_skip_count,
        write_skip_count,
        no_rollback_count
),

assigned AS (
    UPDATE pybatch.step_partition AS p
    SET
        worker_step_execution_id = worker.id,
        status = 'STARTED',
        exit_code = 'UNKNOWN',
        read_count = 0,
        processed_count = 0,
        write_count = 0,
        filter_count = 0,
        commit_count = 0,
        rollback_count = 0,
        worker_owner_token = :owner_token,
        worker_lease_expires_at
        = pg_catalog.CLOCK_TIMESTAMP() + CAST(:lease_ms AS BIGINT) * INTERVAL '1 millisecond',
        version = p.version + 1
    FROM picked, worker
    WHERE p.id = picked.id AND p.version = picked.version
    RETURNING
        p.id,
        p.step_execution_id,
        p.worker_step_execution_id,
        p.partition_key,
        p.partition_ordinal,
        p.context_format,
        p.context_schema,
        p.context_schema_version,
        p.context_payload,
        p.context_checksum,
        p.version
)

SELECT
    worker.id,
    worker.job_execution_id,
    worker.step_name,
    worker.step_logical_id,
    worker.status,
    worker.exit_code,
    worker.read_count,
    worker.processed_count,
    worker.write_count,
    worker.filter_count,
    worker.commit_count,
    worker.rollback_count,
    worker.checkpoint_format,
    worker.checkpoint_schema,
    worker.checkpoint_schema_version,
    worker.checkpoint_payload,
    worker.context_format,
    worker.context_schema,
    worker.context_schema_version,
    worker.context_payload,
    worker.failure_category,
    worker.failure_id,
    worker.created_at,
    worker.started_at,
    worker.ended_at,
    worker.updated_at,
    worker.version,
    worker.read_retry_count,
    worker.process_retry_count,
    worker.write_retry_count,
    worker.read_skip_count,
    worker.process_skip_count,
    worker.write_skip_count,
    worker.no_rollback_count,
    a.id AS p_id,
    a.partition_key AS p_partition_key,
    a.partition_ordinal AS p_partition_ordinal,
    a.context_format AS p_context_format,
    a.context_schema AS p_context_schema,
    a.context_schema_version AS p_context_schema_version,
    a.context_payload AS p_context_payload,
    a.context_checksum AS p_context_checksum,
    a.version AS p_version
FROM (SELECT CAST(:step_execution_id AS BIGINT) AS id) AS asked
LEFT JOIN assigned AS a ON asked.id = a.step_execution_id
LEFT JOIN worker ON a.worker_step_execution_id = worker.id;

-- :name claim_fresh_step_partition :one
-- :doc Claim the next unassigned partition of a first attempt's STARTED parent, with fresh
-- state: what claim_step_partition does while such a partition is left, without the reads it
-- needs only for the others (a partition to resume from an earlier attempt's worker, a lost
-- worker's partition to retry), whose plans cost every claim at executor start. Nothing can be
-- resumed in a first attempt: the partitions of an instance's other attempts are the only
-- source (a step's logical id is unique in its execution). Guards, locks, the end it may follow
-- and the row it returns are claim_step_partition's. id NULL - no unassigned partition is left,
-- the parent is not STARTED or not of a first attempt, or the end was refused: the caller then
-- claims with claim_step_partition.
WITH parent AS (
    SELECT
        s.id,
        s.job_execution_id
    FROM pybatch.step_execution AS s
    INNER JOIN pybatch.job_execution AS e ON s.job_execution_id = e.id
    WHERE
        s.id = :step_execution_id
        AND s.status = 'STARTED'
        AND e.attempt = 1
        AND (
            CAST(:step_partition_id AS BIGINT) IS NULL
            OR EXISTS (
                SELECT 1
                FROM pybatch.step_partition AS ended
                WHERE
                    ended.id = :step_partition_id
                    AND ended.version = CAST(:expected_version AS BIGINT) + 1
                    AND ended.worker_step_execution_id = :worker_step_execution_id
                    AND ended.xmin = CAST(pg_catalog.PG_CURRENT_XACT_ID() AS XID)
            )
        )
    FOR SHARE OF s
),

picked AS (
    SELECT
        p.id,
        p.partition_ordinal,
        p.version,
        (SELECT parent.job_execution_id FROM parent) AS job_execution_id
    FROM pybatch.step_partition AS p
    WHERE
        p.step_execution_id = :step_execution_id
        AND p.worker_step_execution_id IS NULL
        AND EXISTS (SELECT 1 FROM parent)
    ORDER BY p.partition_ordinal
    LIMIT 1
    FOR UPDATE OF p SKIP LOCKED
),

worker AS (
    INSERT INTO pybatch.step_execution (
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
        fault_state_format,
        fault_state_schema,
        fault_state_schema_version,
        fault_state_payload,
        fault_state_checksum,
        created_at,
        started_at,
        updated_at
    )
    SELECT
        picked.job_execution_id,
        :worker_name_prefix
        || '#'
        || picked.partition_ordinal
        || '.'
        || (picked.version + 1) AS step_name,
        :worker_name_prefix
        || '#'
        || picked.partition_ordinal
        || '.'
        || (picked.version + 1) AS step_logical_id,
        'STARTED' AS status,
        'UNKNOWN' AS exit_code,
        1 AS checkpoint_format,
        'oxide_batch.empty.v1' AS checkpoint_schema,
        1 AS checkpoint_schema_version,
        CAST('{}' AS JSONB) AS checkpoint_payload,
        1 AS context_format,
        'oxide_batch.empty.v1' AS context_schema,
        1 AS context_schema_version,
        CAST('{}' AS JSONB) AS context_payload,
        1 AS fault_state_format,
        'oxide-batch.fault-state' AS fault_state_schema,
        1 AS fault_state_schema_version,
        :fault_state_payload AS fault_state_payload,
        :fault_state_checksum AS fault_state_checksum,
        :now AS created_at,
        :now AS started_at,
        :now AS updated_at
    FROM picked
    RETURNING
        id,
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
        failure_category,
        failure_id,
        created_at,
        started_at,
        ended_at,
        updated_at,
        version,
        read_retry_count,
        process_retry_count,
        write_retry_count,
        read_skip_count,
        process_skip_count,
        write_skip_count,
        no_rollback_count
),

assigned AS (
    UPDATE pybatch.step_partition AS p
    SET
        worker_step_execution_id = worker.id,
        status = 'STARTED',
        exit_code = 'UNKNOWN',
        read_count = 0,
        processed_count = 0,
        write_count = 0,
        filter_count = 0,
        commit_count = 0,
        rollback_count = 0,
        worker_owner_token = :owner_token,
        worker_lease_expires_at
        = pg_catalog.CLOCK_TIMESTAMP() + CAST(:lease_ms AS BIGINT) * INTERVAL '1 millisecond',
        version = p.version + 1
    FROM picked, worker
    WHERE p.id = picked.id AND p.version = picked.version
    RETURNING
        p.id,
        p.step_execution_id,
        p.worker_step_execution_id,
        p.partition_key,
        p.partition_ordinal,
        p.context_format,
        p.context_schema,
        p.context_schema_version,
        p.context_payload,
        p.context_checksum,
        p.version
)

SELECT
    worker.id,
    worker.job_execution_id,
    worker.step_name,
    worker.step_logical_id,
    worker.status,
    worker.exit_code,
    worker.read_count,
    worker.processed_count,
    worker.write_count,
    worker.filter_count,
    worker.commit_count,
    worker.rollback_count,
    worker.checkpoint_format,
    worker.checkpoint_schema,
    worker.checkpoint_schema_version,
    worker.checkpoint_payload,
    worker.context_format,
    worker.context_schema,
    worker.context_schema_version,
    worker.context_payload,
    worker.failure_category,
    worker.failure_id,
    worker.created_at,
    worker.started_at,
    worker.ended_at,
    worker.updated_at,
    worker.version,
    worker.read_retry_count,
    worker.process_retry_count,
    worker.write_retry_count,
    worker.read_skip_count,
    worker.process_skip_count,
    worker.write_skip_count,
    worker.no_rollback_count,
    a.id AS p_id,
    a.partition_key AS p_partition_key,
    a.partition_ordinal AS p_partition_ordinal,
    a.context_format AS p_context_format,
    a.context_schema AS p_context_schema,
    a.context_schema_version AS p_context_schema_version,
    a.context_payload AS p_context_payload,
    a.context_checksum AS p_context_checksum,
    a.version AS p_version
FROM (SELECT CAST(:step_execution_id AS BIGINT) AS id) AS asked
LEFT JOIN assigned AS a ON asked.id = a.step_execution_id
LEFT JOIN worker ON a.worker_step_execution_id = worker.id;

-- :name count_open_step_partitions :scalar
-- :doc How many partitions of a plan still need a worker or are being worked on - STARTING,
-- STARTED, or FAILED after a lost worker and claimable again (see claim_step_partition).
SELECT pg_catalog.COUNT(*) AS open_partitions
FROM pybatch.step_partition AS p
LEFT JOIN pybatch.step_execution AS w ON p.worker_step_execution_id = w.id
WHERE
    p.step_execution_id = :step_execution_id
    AND (
        p.status IN ('STARTING', 'STARTED')
        OR (
            p.status = 'FAILED'
            AND w.failure_category = 'STALE_RECOVERED'
            AND p.version < :max_partition_version
        )
    );

-- :name end_step_partition :one
-- :doc End a partition's worker and publish its result onto the partition in one guarded
-- statement. Lock the parent (FOR SHARE: claims and ends share the parent, only the aggregation's
-- FOR UPDATE excludes them), then the partition (FOR UPDATE); if the parent is STARTED or
-- STOPPING and the partition still STARTED at expected_version with this worker - and, with
-- only_if_lost, if its lease ran out on the database clock or it has none - lock its worker
-- step (of the parent's execution).
-- An active worker is ended with status (a move of the transition table; never before its last
-- write), failure and exit (none - the exit stays, and the version moves by one instead of two);
-- a worker already in a result status stays as it is. The partition takes the worker's durable
-- status, exit and counters, its owner and lease end, and its version moves by one (status NULL
-- ends no worker: it must have ended already). Always one row: the partition's id, NULL when a
-- guard refused and nothing changed (its new columns are not returned: a worker's end reads none,
-- and their output cost both sides CPU), then the locked state the guards judged (found_*,
-- parent_*; the worker as the statement's snapshot saw it), from which the caller names the
-- refusal.
WITH parent AS (
    SELECT
        s.id,
        s.status,
        s.job_execution_id
    FROM pybatch.step_partition AS p
    INNER JOIN pybatch.step_execution AS s ON p.step_execution_id = s.id
    WHERE p.id = :step_partition_id
    FOR SHARE OF s
),

found AS (
    SELECT
        p.id,
        p.version,
        p.status,
        p.worker_step_execution_id,
        p.worker_lease_expires_at,
        parent.id AS parent_id,
        parent.status AS parent_status,
        parent.job_execution_id
    FROM pybatch.step_partition AS p
    INNER JOIN parent ON p.step_execution_id = parent.id
    WHERE p.id = :step_partition_id
    FOR UPDATE OF p
),

claimed AS (
    SELECT
        w.id,
        w.status,
        w.exit_code,
        w.read_count,
        w.processed_count,
        w.write_count,
        w.filter_count,
        w.commit_count,
        w.rollback_count
    FROM found
    INNER JOIN pybatch.step_execution AS w
        ON
            found.worker_step_execution_id = w.id
            AND found.job_execution_id = w.job_execution_id
    WHERE
        found.parent_status IN ('STARTED', 'STOPPING')
        AND found.version = :expected_version
        AND found.status = 'STARTED'
        AND found.worker_step_execution_id = :worker_step_execution_id
        AND (
            NOT :only_if_lost
            OR COALESCE(found.worker_lease_expires_at > pg_catalog.CLOCK_TIMESTAMP(), FALSE)
            IS FALSE
        )
    FOR UPDATE OF w
),

ended AS (
    UPDATE pybatch.step_execution AS w
    SET
        status = CAST(:status AS TEXT),
        exit_code = COALESCE(CAST(:exit_code AS TEXT), w.exit_code),
        failure_category = COALESCE(CAST(:failure_category AS TEXT), w.failure_category),
        failure_id = COALESCE(:failure_id, w.failure_id),
        ended_at = CASE
            WHEN CAST(:status AS TEXT) <> 'UNKNOWN' THEN GREATEST(:now, w.updated_at, w.started_at)
        END,
        updated_at = GREATEST(:now, w.updated_at, w.started_at),
        version = w.version + CASE WHEN CAST(:exit_code AS TEXT) IS NULL THEN 1 ELSE 2 END
    FROM claimed AS worker
    WHERE
        w.id = worker.id
        AND CAST(:status AS TEXT) IS NOT NULL
        AND worker.status IN ('STARTING', 'STARTED', 'STOPPING')
        AND (
            worker.status = 'STARTED'
            OR CAST(:status AS TEXT) IN ('FAILED', 'UNKNOWN')
            OR (worker.status = 'STOPPING' AND CAST(:status AS TEXT) = 'STOPPED')
        )
    RETURNING
        w.status,
        w.exit_code
),

completed AS (
    UPDATE pybatch.step_partition AS p
    SET
        status = COALESCE(ended.status, worker.status),
        exit_code = COALESCE(ended.exit_code, worker.exit_code),
        read_count = worker.read_count,
        processed_count = worker.processed_count,
        write_count = worker.write_count,
        filter_count = worker.filter_count,
        commit_count = worker.commit_count,
        rollback_count = worker.rollback_count,
        worker_owner_token = NULL,
        worker_lease_expires_at = NULL,
        version = p.version + 1
    FROM claimed AS worker
    LEFT JOIN ended ON TRUE
    WHERE
        p.id = :step_partition_id
        AND p.version = :expected_version
        AND COALESCE(ended.status, worker.status) IN ('COMPLETED', 'FAILED', 'STOPPED', 'UNKNOWN')
    RETURNING p.id
)

SELECT
    c.id,
    found.version AS found_version,
    found.status AS found_status,
    found.worker_step_execution_id AS found_worker_step_execution_id,
    found.parent_id AS parent_step_execution_id,
    found.parent_status,
    w.status AS worker_status,
    w.job_execution_id = found.job_execution_id AS same_execution
FROM (SELECT CAST(:step_partition_id AS BIGINT) AS id) AS asked
LEFT JOIN found ON asked.id = found.id
LEFT JOIN pybatch.step_execution AS w ON w.id = :worker_step_execution_id
LEFT JOIN completed AS c ON TRUE;

-- :name summarize_step_partitions :one
-- :doc Lock a plan's partitions, then their workers, in partition key order (aggregation; the
-- parent is locked before) and summarize them in one row - how many partitions, the status of
-- the first partition in key order that has no worker or no result status yet, whether every
-- partition mirrors its worker's status, exit and counters, the most severe status (UNKNOWN,
-- then FAILED, STOPPED, COMPLETED) with the exit and the worker's failure of the first partition
-- in key order that has it, and the counters summed as numeric (the caller refuses a sum beyond
-- the bigint range).
WITH children AS (
    SELECT
        p.partition_key,
        p.status,
        p.exit_code,
        p.read_count,
        p.processed_count,
        p.write_count,
        p.filter_count,
        p.commit_count,
        p.rollback_count,
        p.worker_step_execution_id,
        CASE p.status
            WHEN 'COMPLETED' THEN 0
            WHEN 'STOPPED' THEN 1
            WHEN 'FAILED' THEN 2
            WHEN 'UNKNOWN' THEN 3
        END AS severity
    FROM pybatch.step_partition AS p
    WHERE p.step_execution_id = :step_execution_id
    ORDER BY p.partition_key
    FOR UPDATE
),

workers AS (
    SELECT
        w.id,
        w.status,
        w.exit_code,
        w.read_count,
        w.processed_count,
        w.write_count,
        w.filter_count,
        w.commit_count,
        w.rollback_count,
        w.failure_category,
        w.failure_id
    FROM children AS c
    INNER JOIN pybatch.step_execution AS w ON c.worker_step_execution_id = w.id
    ORDER BY c.partition_key
    FOR UPDATE OF w
),

judged AS (
    SELECT
        c.partition_key,
        c.status,
        c.exit_code,
        c.severity,
        w.failure_category,
        w.failure_id,
        c.read_count,
        c.processed_count,
        c.write_count,
        c.filter_count,
        c.commit_count,
        c.rollback_count,
        c.worker_step_execution_id IS NULL OR c.severity IS NULL AS incomplete,
        w.id IS NOT NULL
        AND (c.status, c.exit_code) = (w.status, w.exit_code)
        AND (c.read_count, c.processed_count, c.write_count)
        = (w.read_count, w.processed_count, w.write_count)
        AND (c.filter_count, c.commit_count, c.rollback_count)
        = (w.filter_count, w.commit_count, w.rollback_count) AS mirrors
    FROM children AS c
    LEFT JOIN workers AS w ON c.worker_step_execution_id = w.id
)

SELECT
    pg_catalog.COUNT(*) AS partitions,
    (pg_catalog.ARRAY_AGG(j.status ORDER BY j.partition_key) FILTER (WHERE j.incomplete))[1]
        AS incomplete_status,
    COALESCE(pg_catalog.BOOL_AND(j.mirrors), FALSE) AS mirrored,
    (pg_catalog.ARRAY_AGG(j.status ORDER BY j.severity DESC, j.partition_key ASC))[1] AS status,
    (pg_catalog.ARRAY_AGG(j.exit_code ORDER BY j.severity DESC, j.partition_key ASC))[1]
        AS exit_code,
    (pg_catalog.ARRAY_AGG(j.failure_category ORDER BY j.severity DESC, j.partition_key ASC))[1]
        AS failure_category,
    (pg_catalog.ARRAY_AGG(j.failure_id ORDER BY j.severity DESC, j.partition_key ASC))[1]
        AS failure_id,
    pg_catalog.SUM(j.read_count) AS read_count,
    pg_catalog.SUM(j.processed_count) AS processed_count,
    pg_catalog.SUM(j.write_count) AS write_count,
    pg_catalog.SUM(j.filter_count) AS filter_count,
    pg_catalog.SUM(j.commit_count) AS commit_count,
    pg_catalog.SUM(j.rollback_count) AS rollback_count
FROM judged AS j;
