-- :name find_latest_flow_step_execution :scalar
-- :doc The newest step of a node in an instance (by attempt): the source whose durable state a
-- flow step copies. The instance's attempts, newest first (job_execution_attempt_unique), each
-- probed for the node's step (step_execution_logical_id_unique: at most one per execution): a
-- LATERAL subquery with LIMIT is never joined with every step of the node's name in the table,
-- which a generic plan, blind to how many steps share a name, may choose.
SELECT s.id
FROM pybatch.job_execution AS e
CROSS JOIN
    LATERAL (
        SELECT node_step.id
        FROM pybatch.step_execution AS node_step
        WHERE node_step.job_execution_id = e.id AND node_step.step_logical_id = :node_id
        ORDER BY node_step.id DESC
        LIMIT 1
    ) AS s
WHERE e.job_instance_id = :job_instance_id
ORDER BY e.attempt DESC
LIMIT 1;

-- :name get_job_execution_flow_plan :one
-- :doc The definition an execution runs under (its manifest and digest), to check a flow
-- decision against (job_execution_pkey, job_definition_pkey).
SELECT
    d.manifest_digest,
    d.manifest
FROM pybatch.job_execution AS e
INNER JOIN pybatch.job_definition AS d ON e.definition_id = d.id
WHERE e.id = :job_execution_id;

-- :name flow_source_step_matches :scalar
-- :doc Whether a step belongs to the execution's instance (any attempt) with this logical id.
SELECT EXISTS(
    SELECT 1
    FROM pybatch.step_execution AS s
    INNER JOIN pybatch.job_execution AS source_job ON s.job_execution_id = source_job.id
    INNER JOIN pybatch.job_execution AS target_job ON target_job.id = :job_execution_id
    WHERE
        s.id = :source_step_execution_id
        AND source_job.job_instance_id = target_job.job_instance_id
        AND s.step_logical_id = :node_id
) AS source_matches;

-- :name flow_reused_decision_matches :scalar
-- :doc Whether a reused decision exists in the same instance with the same node, fingerprint,
-- input digest, outcome and target.
SELECT EXISTS(
    SELECT 1
    FROM pybatch.flow_decision AS earlier
    INNER JOIN pybatch.job_execution AS earlier_job ON earlier.job_execution_id = earlier_job.id
    INNER JOIN pybatch.job_execution AS target_job ON target_job.id = :job_execution_id
    WHERE
        earlier.id = :reused_decision_id
        AND earlier_job.job_instance_id = target_job.job_instance_id
        AND earlier.source_node_id = :node_id
        AND earlier.plan_fingerprint = :plan_fingerprint
        AND earlier.input_digest = :input_digest
        AND earlier.observed_outcome = :observed_outcome
        AND earlier.target_node_id IS NOT DISTINCT FROM :target_node_id
        AND earlier.terminal_kind IS NOT DISTINCT FROM :terminal_kind
) AS reused_matches;

-- :name insert_flow_decision :one
-- :doc Append a decision at position `sequence`, only when exactly sequence - 1 decisions are
-- recorded (sequences are contiguous): no row means a stale sequence. Two concurrent appends at one
-- position, or two for one source node, are settled by flow_decision_sequence_unique and
-- flow_decision_source_unique (ConcurrentModification).
INSERT INTO pybatch.flow_decision (
    job_execution_id,
    source_step_execution_id,
    reused_decision_id,
    sequence,
    source_node_id,
    observed_outcome,
    target_node_id,
    transition_kind,
    terminal_kind,
    plan_fingerprint,
    input_digest,
    decided_at
)
SELECT
    CAST(:job_execution_id AS BIGINT) AS job_execution_id,
    CAST(:source_step_execution_id AS BIGINT) AS source_step_execution_id,
    CAST(:reused_decision_id AS BIGINT) AS reused_decision_id,
    CAST(:sequence AS BIGINT) AS sequence,
    CAST(:node_id AS TEXT) AS source_node_id,
    CAST(:observed_outcome AS TEXT) AS observed_outcome,
    CAST(:target_node_id AS TEXT) AS target_node_id,
    CAST(:transition_kind AS TEXT) AS transition_kind,
    CAST(:terminal_kind AS TEXT) AS terminal_kind,
    CAST(:plan_fingerprint AS BYTEA) AS plan_fingerprint,
    CAST(:input_digest AS BYTEA) AS input_digest,
    CAST(:decided_at AS TIMESTAMPTZ) AS decided_at
WHERE (
    SELECT pg_catalog.COUNT(*)
    FROM pybatch.flow_decision AS recorded
    WHERE recorded.job_execution_id = CAST(:job_execution_id AS BIGINT)
) = CAST(:sequence AS BIGINT) - 1
RETURNING id;

-- :name list_flow_decisions :many
-- :doc The decisions of an execution in sequence order (flow_decision_sequence_unique).
SELECT
    d.id,
    d.job_execution_id,
    d.source_step_execution_id,
    d.reused_decision_id,
    d.sequence,
    d.source_node_id,
    d.observed_outcome,
    d.target_node_id,
    d.transition_kind,
    d.terminal_kind,
    d.plan_fingerprint,
    d.input_digest,
    d.decided_at
FROM pybatch.flow_decision AS d
WHERE d.job_execution_id = :job_execution_id
ORDER BY d.sequence;

-- :name find_reusable_flow_decision :one
-- :doc The latest decision of a node in an instance (attempt, then sequence, descending) with
-- the same fingerprint, input digest and kind: what a restart reuses instead of deciding again.
SELECT
    d.id,
    d.job_execution_id,
    d.source_step_execution_id,
    d.reused_decision_id,
    d.sequence,
    d.source_node_id,
    d.observed_outcome,
    d.target_node_id,
    d.transition_kind,
    d.terminal_kind,
    d.plan_fingerprint,
    d.input_digest,
    d.decided_at
FROM pybatch.flow_decision AS d
INNER JOIN pybatch.job_execution AS e ON d.job_execution_id = e.id
WHERE
    e.job_instance_id = :job_instance_id
    AND d.source_node_id = :node_id
    AND d.plan_fingerprint = :plan_fingerprint
    AND d.input_digest = :input_digest
    AND d.transition_kind = :transition_kind
ORDER BY e.attempt DESC, d.sequence DESC
LIMIT 1;

-- :name start_flow_step :one
-- :doc Start a node's step in one statement (migration 0014 start_step_execution): under the
-- instance lock, checked for duplicates and the start limit and inserted with the durable state
-- of the node's newest step - STARTED as the execution's owner (skipped when that step is
-- COMPLETED), or STARTING without an owner. outcome - started, created or skipped, or the
-- error that refuses it, its fields in details.
SELECT
    o.outcome,
    o.details,
    (o.step).id AS id,
    (o.step).job_execution_id AS job_execution_id,
    (o.step).step_name AS step_name,
    (o.step).step_logical_id AS step_logical_id,
    (o.step).status AS status,
    (o.step).exit_code AS exit_code,
    (o.step).read_count AS read_count,
    (o.step).processed_count AS processed_count,
    (o.step).write_count AS write_count,
    (o.step).filter_count AS filter_count,
    (o.step).commit_count AS commit_count,
    (o.step).rollback_count AS rollback_count,
    (o.step).checkpoint_format AS checkpoint_format,
    (o.step).checkpoint_schema AS checkpoint_schema,
    (o.step).checkpoint_schema_version AS checkpoint_schema_version,
    (o.step).checkpoint_payload AS checkpoint_payload,
    (o.step).context_format AS context_format,
    (o.step).context_schema AS context_schema,
    (o.step).context_schema_version AS context_schema_version,
    (o.step).context_payload AS context_payload,
    (o.step).failure_category AS failure_category,
    (o.step).failure_id AS failure_id,
    (o.step).created_at AS created_at,
    (o.step).started_at AS started_at,
    (o.step).ended_at AS ended_at,
    (o.step).updated_at AS updated_at,
    (o.step).version AS version,
    (o.step).read_retry_count AS read_retry_count,
    (o.step).process_retry_count AS process_retry_count,
    (o.step).write_retry_count AS write_retry_count,
    (o.step).read_skip_count AS read_skip_count,
    (o.step).process_skip_count AS process_skip_count,
    (o.step).write_skip_count AS write_skip_count,
    (o.step).no_rollback_count AS no_rollback_count
FROM pybatch.start_step_execution(
    :job_execution_id,
    :owner_token,
    :step_name,
    :node_id,
    :start_limit,
    :now
) AS o;
