-- :name explore_ceiling_job_names :scalar
-- :doc Identity ceiling of the job-name listing - the largest instance id (job_instance_pkey).
SELECT pg_catalog.MAX(instance.id) AS ceiling
FROM pybatch.job_instance AS instance;

-- :name explore_ceiling_instances :scalar
-- :doc Identity ceiling of one job name's instances (job_instance_name_identity).
SELECT pg_catalog.MAX(instance.id) AS ceiling
FROM pybatch.job_instance AS instance
WHERE instance.job_name = :job_name;

-- :name explore_ceiling_executions :scalar
-- :doc Identity ceiling of execution pages and unresolved executions (job_execution_pkey).
SELECT pg_catalog.MAX(execution.id) AS ceiling
FROM pybatch.job_execution AS execution;

-- :name explore_ceiling_step_executions :scalar
-- :doc Identity ceiling of step pages (step_execution_pkey).
SELECT pg_catalog.MAX(step.id) AS ceiling
FROM pybatch.step_execution AS step;

-- :name explore_ceiling_recovery_decisions :scalar
-- :doc Identity ceiling of recovery-decision pages (recovery_decision_pkey).
SELECT pg_catalog.MAX(decision.id) AS ceiling
FROM pybatch.recovery_decision AS decision;

-- :name explore_ceiling_flow_decisions :scalar
-- :doc Identity ceiling of flow-decision pages (flow_decision_pkey).
SELECT pg_catalog.MAX(decision.id) AS ceiling
FROM pybatch.flow_decision AS decision;

-- :name explore_ceiling_step_partitions :scalar
-- :doc Identity ceiling of partition pages (step_partition_pkey).
SELECT pg_catalog.MAX(plan_partition.id) AS ceiling
FROM pybatch.step_partition AS plan_partition;

-- :name explore_ceiling_operator_requests :scalar
-- :doc Identity ceiling of operator-request pages (operator_request_pkey).
SELECT pg_catalog.MAX(request.id) AS ceiling
FROM pybatch.operator_request AS request;

-- :name explore_job_instance_exists :scalar
-- :doc Whether the parent instance of an execution page exists (job_instance_pkey).
SELECT EXISTS(
    SELECT 1 AS found
    FROM pybatch.job_instance AS instance
    WHERE instance.id = :job_instance_id
) AS found;

-- :name explore_job_name_exists :scalar
-- :doc Whether any instance has the job name (job_instance_name_identity): an unknown job
-- from a job without instances on the page.
SELECT EXISTS(
    SELECT 1 AS found
    FROM pybatch.job_instance AS instance
    WHERE instance.job_name = :job_name
) AS found;

-- :name explore_job_execution_exists :scalar
-- :doc Whether the parent execution of a step, decision or request page exists.
SELECT EXISTS(
    SELECT 1 AS found
    FROM pybatch.job_execution AS execution
    WHERE execution.id = :job_execution_id
) AS found;

-- :name explore_step_execution_exists :scalar
-- :doc Whether the parent step of a partition page exists (step_execution_pkey).
SELECT EXISTS(
    SELECT 1 AS found
    FROM pybatch.step_execution AS step
    WHERE step.id = :step_execution_id
) AS found;

-- :name explore_job_names :many
-- :doc Distinct job names of instances with id <= ceiling, in byte order after after_name, with
-- the latest attempt of each name's newest such instance (none while that instance has no
-- execution). A loose index scan over job_instance_name_identity (job_name, id DESC) - one
-- probe per name finds the next name and its newest instance at once - then one
-- job_execution_attempt_unique probe for its latest attempt; never a scan of job_instance.
WITH RECURSIVE job_names (job_name, newest_instance_id, rank_in_page) AS (
    (
        SELECT
            first_instance.job_name,
            first_instance.id AS newest_instance_id,
            1 AS rank_in_page
        FROM pybatch.job_instance AS first_instance
        WHERE
            first_instance.job_name > :after_name
            AND first_instance.id <= :ceiling
        ORDER BY first_instance.job_name ASC, first_instance.id DESC
        LIMIT 1
    )
    UNION ALL
    SELECT
        successor.job_name,
        successor.id AS newest_instance_id,
        job_names.rank_in_page + 1 AS rank_in_page
    FROM job_names
    CROSS JOIN
        LATERAL (
            SELECT
                next_instance.job_name,
                next_instance.id
            FROM pybatch.job_instance AS next_instance
            WHERE
                next_instance.job_name > job_names.job_name
                AND next_instance.id <= :ceiling
            ORDER BY next_instance.job_name ASC, next_instance.id DESC
            LIMIT 1
        ) AS successor
    WHERE job_names.rank_in_page < :row_limit
)

SELECT
    job_names.job_name,
    latest.id AS latest_execution_id,
    latest.status AS latest_status,
    latest.updated_at AS latest_updated_at
FROM job_names
LEFT JOIN LATERAL (
    SELECT
        execution.id,
        execution.status,
        execution.updated_at
    FROM pybatch.job_execution AS execution
    WHERE execution.job_instance_id = job_names.newest_instance_id
    ORDER BY execution.attempt DESC
    LIMIT 1
) AS latest ON TRUE
ORDER BY job_names.job_name;

-- :name explore_instances :many
-- :doc Instances of one job name, newest first, with id < before_id and id <= ceiling
-- (job_instance_name_identity); their identifying parameters (never the non-identifying ones,
-- which are not stored); a purged history's tombstone (final status, purge time, last attempt).
SELECT
    instance.id,
    instance.job_name,
    instance.instance_key,
    instance.created_at,
    instance.hold_actor,
    instance.hold_reason,
    instance.hold_placed_at,
    instance.last_attempt,
    instance.final_status,
    instance.purged_at,
    instance.identifying_parameters
FROM pybatch.job_instance AS instance
WHERE
    instance.job_name = :job_name
    AND instance.id <= :ceiling
    AND instance.id < :before_id
ORDER BY instance.id DESC
LIMIT :row_limit;

-- :name explore_instances_with_parameters :many
-- :doc explore_instances restricted to the instances whose identifying parameters contain one
-- of parameter_documents. The matching instances are found first, as a set (a bitmap from
-- job_instance_parameter_values, with job_instance_name_identity), then the page is sorted from
-- them: a page costs what the filter matches within the job, never a walk of the job's history
-- in id order betting on an early match (MATERIALIZED keeps the planner from that bet).
WITH filtered_instance AS MATERIALIZED (
    SELECT candidate.id
    FROM pybatch.job_instance AS candidate
    WHERE
        candidate.job_name = :job_name
        AND candidate.identifying_parameters @> ANY(CAST(:parameter_documents AS JSONB[]))
        AND candidate.id <= :ceiling
        AND candidate.id < :before_id
)

SELECT
    instance.id,
    instance.job_name,
    instance.instance_key,
    instance.created_at,
    instance.hold_actor,
    instance.hold_reason,
    instance.hold_placed_at,
    instance.last_attempt,
    instance.final_status,
    instance.purged_at,
    instance.identifying_parameters
FROM filtered_instance
INNER JOIN pybatch.job_instance AS instance ON filtered_instance.id = instance.id
ORDER BY instance.id DESC
LIMIT :row_limit;

-- :name explore_executions :many
-- :doc Attempts of one instance, (attempt, id) descending before (before_attempt, before_id), with
-- derived counts (job_execution_attempt_unique, step_execution_execution_identity).
SELECT
    execution.id,
    execution.job_instance_id,
    instance.job_name,
    execution.attempt,
    execution.status,
    execution.exit_code,
    execution.failure_category,
    execution.failure_id,
    execution.created_at,
    execution.started_at,
    execution.ended_at,
    execution.updated_at,
    execution.stop_requested_at,
    execution.stop_requested_by,
    execution.version,
    definition.definition_revision,
    definition.manifest_format,
    definition.manifest_digest,
    execution.context_format,
    execution.context_schema,
    execution.context_schema_version,
    CAST(pg_catalog.PG_COLUMN_SIZE(execution.context_payload) AS BIGINT) AS context_bytes,
    totals.read_count,
    totals.processed_count,
    totals.write_count,
    totals.filter_count,
    totals.commit_count,
    totals.rollback_count,
    execution.owner_host,
    instance.identifying_parameters,
    execution.owner_token IS NOT NULL AS owner_recorded
FROM pybatch.job_execution AS execution
INNER JOIN pybatch.job_instance AS instance ON execution.job_instance_id = instance.id
INNER JOIN pybatch.job_definition AS definition ON execution.definition_id = definition.id
CROSS JOIN
    LATERAL (
        -- Derived counts: partition workers of a parent in the same execution are
        -- counted once, through the parent. SUM over bigint is numeric: the codec refuses a
        -- total above 2**63-1 instead of wrapping.
        SELECT
            COALESCE(pg_catalog.SUM(step.read_count), 0) AS read_count,
            COALESCE(pg_catalog.SUM(step.processed_count), 0) AS processed_count,
            COALESCE(pg_catalog.SUM(step.write_count), 0) AS write_count,
            COALESCE(pg_catalog.SUM(step.filter_count), 0) AS filter_count,
            COALESCE(pg_catalog.SUM(step.commit_count), 0) AS commit_count,
            COALESCE(pg_catalog.SUM(step.rollback_count), 0) AS rollback_count
        FROM pybatch.step_execution AS step
        WHERE
            step.job_execution_id = execution.id
            AND NOT EXISTS (
                SELECT 1 AS worker
                FROM pybatch.step_partition AS plan_partition
                INNER JOIN pybatch.step_execution AS parent
                    ON plan_partition.step_execution_id = parent.id
                WHERE
                    plan_partition.worker_step_execution_id = step.id
                    AND parent.job_execution_id = step.job_execution_id
            )
    ) AS totals
WHERE
    execution.job_instance_id = :job_instance_id
    AND execution.id <= :ceiling
    AND (execution.attempt, execution.id) < (:before_attempt, :before_id)
ORDER BY execution.attempt DESC, execution.id DESC
LIMIT :row_limit;

-- :name explore_execution :one
-- :doc One job execution projection with derived counts and ownership evidence
-- (job_execution_pkey).
SELECT
    execution.id,
    execution.job_instance_id,
    instance.job_name,
    execution.attempt,
    execution.status,
    execution.exit_code,
    execution.failure_category,
    execution.failure_id,
    execution.created_at,
    execution.started_at,
    execution.ended_at,
    execution.updated_at,
    execution.stop_requested_at,
    execution.stop_requested_by,
    execution.version,
    definition.definition_revision,
    definition.manifest_format,
    definition.manifest_digest,
    execution.context_format,
    execution.context_schema,
    execution.context_schema_version,
    CAST(pg_catalog.PG_COLUMN_SIZE(execution.context_payload) AS BIGINT) AS context_bytes,
    totals.read_count,
    totals.processed_count,
    totals.write_count,
    totals.filter_count,
    totals.commit_count,
    totals.rollback_count,
    execution.owner_host,
    instance.identifying_parameters,
    execution.owner_token IS NOT NULL AS owner_recorded
FROM pybatch.job_execution AS execution
INNER JOIN pybatch.job_instance AS instance ON execution.job_instance_id = instance.id
INNER JOIN pybatch.job_definition AS definition ON execution.definition_id = definition.id
CROSS JOIN
    LATERAL (
        -- Derived counts: partition workers of a parent in the same execution are
        -- counted once, through the parent. SUM over bigint is numeric: the codec refuses a
        -- total above 2**63-1 instead of wrapping.
        SELECT
            COALESCE(pg_catalog.SUM(step.read_count), 0) AS read_count,
            COALESCE(pg_catalog.SUM(step.processed_count), 0) AS processed_count,
            COALESCE(pg_catalog.SUM(step.write_count), 0) AS write_count,
            COALESCE(pg_catalog.SUM(step.filter_count), 0) AS filter_count,
            COALESCE(pg_catalog.SUM(step.commit_count), 0) AS commit_count,
            COALESCE(pg_catalog.SUM(step.rollback_count), 0) AS rollback_count
        FROM pybatch.step_execution AS step
        WHERE
            step.job_execution_id = execution.id
            AND NOT EXISTS (
                SELECT 1 AS worker
                FROM pybatch.step_partition AS plan_partition
                INNER JOIN pybatch.step_execution AS parent
                    ON plan_partition.step_execution_id = parent.id
                WHERE
                    plan_partition.worker_step_execution_id = step.id
                    AND parent.job_execution_id = step.job_execution_id
            )
    ) AS totals
WHERE execution.id = :job_execution_id;

-- :name explore_latest_attempt :one
-- :doc The newest attempt of one instance - its execution id, attempt number and status - the
-- attempt a restart starts from (job_execution_attempt_unique); no row means no attempt yet.
SELECT
    execution.id AS execution_id,
    execution.attempt,
    execution.status
FROM pybatch.job_execution AS execution
WHERE execution.job_instance_id = :job_instance_id
ORDER BY execution.attempt DESC
LIMIT 1;

-- :name explore_unresolved_executions :many
-- :doc Executions in STARTING, STARTED, STOPPING or UNKNOWN last updated strictly more than
-- minimum_age_us microseconds before the server's statement time (the database clock decides the
-- cutoff, whatever the client's clock says), id ascending after after_id
-- (job_execution_unresolved_identity), whose parameters (the copy of the instance's identifying
-- parameters) contain one of parameter_documents: a filter over the few unresolved rows, and
-- '{}' matches every execution.
SELECT
    execution.id,
    execution.job_instance_id,
    instance.job_name,
    execution.attempt,
    execution.status,
    execution.exit_code,
    execution.failure_category,
    execution.failure_id,
    execution.created_at,
    execution.started_at,
    execution.ended_at,
    execution.updated_at,
    execution.stop_requested_at,
    execution.stop_requested_by,
    execution.version,
    definition.definition_revision,
    definition.manifest_format,
    definition.manifest_digest,
    execution.context_format,
    execution.context_schema,
    execution.context_schema_version,
    CAST(pg_catalog.PG_COLUMN_SIZE(execution.context_payload) AS BIGINT) AS context_bytes,
    totals.read_count,
    totals.processed_count,
    totals.write_count,
    totals.filter_count,
    totals.commit_count,
    totals.rollback_count,
    execution.owner_host,
    instance.identifying_parameters,
    execution.owner_token IS NOT NULL AS owner_recorded
FROM pybatch.job_execution AS execution
INNER JOIN pybatch.job_instance AS instance ON execution.job_instance_id = instance.id
INNER JOIN pybatch.job_definition AS definition ON execution.definition_id = definition.id
CROSS JOIN
    LATERAL (
        -- Derived counts: partition workers of a parent in the same execution are
        -- counted once, through the parent. SUM over bigint is numeric: the codec refuses a
        -- total above 2**63-1 instead of wrapping.
        SELECT
            COALESCE(pg_catalog.SUM(step.read_count), 0) AS read_count,
            COALESCE(pg_catalog.SUM(step.processed_count), 0) AS processed_count,
            COALESCE(pg_catalog.SUM(step.write_count), 0) AS write_count,
            COALESCE(pg_catalog.SUM(step.filter_count), 0) AS filter_count,
            COALESCE(pg_catalog.SUM(step.commit_count), 0) AS commit_count,
            COALESCE(pg_catalog.SUM(step.rollback_count), 0) AS rollback_count
        FROM pybatch.step_execution AS step
        WHERE
            step.job_execution_id = execution.id
            AND NOT EXISTS (
                SELECT 1 AS worker
                FROM pybatch.step_partition AS plan_partition
                INNER JOIN pybatch.step_execution AS parent
                    ON plan_partition.step_execution_id = parent.id
                WHERE
                    plan_partition.worker_step_execution_id = step.id
                    AND parent.job_execution_id = step.job_execution_id
            )
    ) AS totals
WHERE
    execution.status IN ('STARTING', 'STARTED', 'STOPPING', 'UNKNOWN')
    AND execution.updated_at
    < pg_catalog.STATEMENT_TIMESTAMP() - CAST(:minimum_age_us AS BIGINT) * INTERVAL '1 microsecond'
    AND execution.parameters @> ANY(CAST(:parameter_documents AS JSONB[]))
    AND execution.id > :after_id
    AND execution.id <= :ceiling
ORDER BY execution.id
LIMIT :row_limit;

-- :name explore_executions_with_parameters :many
-- :doc Executions of every instance whose identifying parameters contain one of
-- parameter_documents, id descending before before_id with id <= ceiling. Every matching
-- attempt is found first, as a set (a bitmap of the instances from
-- job_instance_parameter_values, then job_execution_attempt_unique), and the page is sorted from
-- those: a page costs what the filter matches, never a walk of the history in id order betting
-- on an early match (MATERIALIZED keeps the planner from that bet, which cost seconds a page).
-- Derived counts are summed for the page's rows only.
WITH filtered_attempt AS MATERIALIZED (
    SELECT attempt.id
    FROM pybatch.job_instance AS candidate
    INNER JOIN pybatch.job_execution AS attempt ON candidate.id = attempt.job_instance_id
    WHERE
        candidate.identifying_parameters @> ANY(CAST(:parameter_documents AS JSONB[]))
        AND attempt.id <= :ceiling
        AND attempt.id < :before_id
),

page AS (
    SELECT filtered_attempt.id
    FROM filtered_attempt
    ORDER BY filtered_attempt.id DESC
    LIMIT :row_limit
)

SELECT
    execution.id,
    execution.job_instance_id,
    instance.job_name,
    execution.attempt,
    execution.status,
    execution.exit_code,
    execution.failure_category,
    execution.failure_id,
    execution.created_at,
    execution.started_at,
    execution.ended_at,
    execution.updated_at,
    execution.stop_requested_at,
    execution.stop_requested_by,
    execution.version,
    definition.definition_revision,
    definition.manifest_format,
    definition.manifest_digest,
    execution.context_format,
    execution.context_schema,
    execution.context_schema_version,
    CAST(pg_catalog.PG_COLUMN_SIZE(execution.context_payload) AS BIGINT) AS context_bytes,
    totals.read_count,
    totals.processed_count,
    totals.write_count,
    totals.filter_count,
    totals.commit_count,
    totals.rollback_count,
    execution.owner_host,
    instance.identifying_parameters,
    execution.owner_token IS NOT NULL AS owner_recorded
FROM page
INNER JOIN pybatch.job_execution AS execution ON page.id = execution.id
INNER JOIN pybatch.job_instance AS instance ON execution.job_instance_id = instance.id
INNER JOIN pybatch.job_definition AS definition ON execution.definition_id = definition.id
CROSS JOIN
    LATERAL (
        -- Derived counts: partition workers of a parent in the same execution are
        -- counted once, through the parent. SUM over bigint is numeric: the codec refuses a
        -- total above 2**63-1 instead of wrapping.
        SELECT
            COALESCE(pg_catalog.SUM(step.read_count), 0) AS read_count,
            COALESCE(pg_catalog.SUM(step.processed_count), 0) AS processed_count,
            COALESCE(pg_catalog.SUM(step.write_count), 0) AS write_count,
            COALESCE(pg_catalog.SUM(step.filter_count), 0) AS filter_count,
            COALESCE(pg_catalog.SUM(step.commit_count), 0) AS commit_count,
            COALESCE(pg_catalog.SUM(step.rollback_count), 0) AS rollback_count
        FROM pybatch.step_execution AS step
        WHERE
            step.job_execution_id = execution.id
            AND NOT EXISTS (
                SELECT 1 AS worker
                FROM pybatch.step_partition AS plan_partition
                INNER JOIN pybatch.step_execution AS parent
                    ON plan_partition.step_execution_id = parent.id
                WHERE
                    plan_partition.worker_step_execution_id = step.id
                    AND parent.job_execution_id = step.job_execution_id
            )
    ) AS totals
ORDER BY execution.id DESC;

-- :name explore_step_executions :many
-- :doc Steps of one execution, id ascending after after_id (step_execution_execution_identity);
-- checkpoint and context descriptors with stored sizes, never payloads.
SELECT
    step.id,
    step.job_execution_id,
    step.step_name,
    step.step_logical_id,
    step.status,
    step.exit_code,
    step.read_count,
    step.processed_count,
    step.write_count,
    step.filter_count,
    step.commit_count,
    step.rollback_count,
    step.failure_category,
    step.failure_id,
    step.version,
    step.created_at,
    step.started_at,
    step.ended_at,
    step.updated_at,
    step.checkpoint_format,
    step.checkpoint_schema,
    step.checkpoint_schema_version,
    CAST(pg_catalog.PG_COLUMN_SIZE(step.checkpoint_payload) AS BIGINT) AS checkpoint_bytes,
    step.context_format,
    step.context_schema,
    step.context_schema_version,
    CAST(pg_catalog.PG_COLUMN_SIZE(step.context_payload) AS BIGINT) AS context_bytes
FROM pybatch.step_execution AS step
WHERE
    step.job_execution_id = :job_execution_id
    AND step.id > :after_id
    AND step.id <= :ceiling
ORDER BY step.id
LIMIT :row_limit;

-- :name explore_recovery_decisions :many
-- :doc Recovery decisions of one execution, id ascending after after_id
-- (recovery_decision_execution_identity).
SELECT
    decision.id,
    decision.job_execution_id,
    decision.execution_version,
    decision.prior_status,
    decision.resulting_status,
    decision.reason_code,
    decision.operator_reference,
    decision.evidence_digest,
    decision.decided_at
FROM pybatch.recovery_decision AS decision
WHERE
    decision.job_execution_id = :job_execution_id
    AND decision.id > :after_id
    AND decision.id <= :ceiling
ORDER BY decision.id
LIMIT :row_limit;

-- :name explore_flow_decisions :many
-- :doc Flow decisions of one execution, (sequence, id) ascending after (after_sequence, after_id)
-- (flow_decision_sequence_unique); the flow codec's columns.
SELECT
    decision.id,
    decision.job_execution_id,
    decision.source_step_execution_id,
    decision.reused_decision_id,
    decision.sequence,
    decision.source_node_id,
    decision.observed_outcome,
    decision.target_node_id,
    decision.transition_kind,
    decision.terminal_kind,
    decision.plan_fingerprint,
    decision.input_digest,
    decision.decided_at
FROM pybatch.flow_decision AS decision
WHERE
    decision.job_execution_id = :job_execution_id
    AND decision.id <= :ceiling
    AND (decision.sequence, decision.id) > (:after_sequence, :after_id)
ORDER BY decision.sequence, decision.id
LIMIT :row_limit;

-- :name explore_step_partitions :many
-- :doc Partitions of one manager step, id (= ordinal) ascending after after_id
-- (step_partition_parent_identity); context descriptor only.
SELECT
    plan_partition.id,
    plan_partition.step_execution_id,
    plan_partition.worker_step_execution_id,
    plan_partition.partition_key,
    plan_partition.partition_ordinal,
    plan_partition.status,
    plan_partition.exit_code,
    plan_partition.read_count,
    plan_partition.processed_count,
    plan_partition.write_count,
    plan_partition.filter_count,
    plan_partition.commit_count,
    plan_partition.rollback_count,
    plan_partition.version,
    plan_partition.context_format,
    plan_partition.context_schema,
    plan_partition.context_schema_version,
    CAST(pg_catalog.PG_COLUMN_SIZE(plan_partition.context_payload) AS BIGINT) AS context_bytes
FROM pybatch.step_partition AS plan_partition
WHERE
    plan_partition.step_execution_id = :step_execution_id
    AND plan_partition.id > :after_id
    AND plan_partition.id <= :ceiling
ORDER BY plan_partition.id
LIMIT :row_limit;

-- :name explore_operator_requests :many
-- :doc Operator requests aimed at one execution, id ascending after after_id
-- (operator_request_execution).
SELECT
    request.id,
    request.job_instance_id,
    request.job_execution_id,
    request.action,
    request.authorization_class,
    request.operation_id,
    request.actor_ref,
    request.reason_code,
    request.request_digest,
    request.observed_version,
    request.prior_status,
    request.result_status,
    request.outcome_class,
    request.rejection_code,
    request.rejection_current_version,
    request.rejection_status,
    request.rejection_execution_id,
    request.requested_at
FROM pybatch.operator_request AS request
WHERE
    request.job_execution_id = :job_execution_id
    AND request.id > :after_id
    AND request.id <= :ceiling
ORDER BY request.id
LIMIT :row_limit;

-- :name explore_failure_reasons :many
-- :doc Why one execution and its steps failed: one row per FAILED row with a reason, the
-- execution's first (step_execution_id NULL), then its steps by id (job_execution_pkey,
-- step_execution_execution_identity).
SELECT
    reason.step_execution_id,
    reason.error_class,
    reason.message,
    reason.sqlstate,
    reason.constraint_name,
    reason.table_name,
    reason.column_name
FROM (
    SELECT
        CAST(NULL AS BIGINT) AS step_execution_id,
        execution.failure_error_class AS error_class,
        execution.failure_message AS message,
        execution.failure_sqlstate AS sqlstate,
        execution.failure_constraint AS constraint_name,
        execution.failure_table AS table_name,
        execution.failure_column AS column_name
    FROM pybatch.job_execution AS execution
    WHERE
        execution.id = :job_execution_id
        AND execution.failure_error_class IS NOT NULL
    UNION ALL
    SELECT
        step.id AS step_execution_id,
        step.failure_error_class AS error_class,
        step.failure_message AS message,
        step.failure_sqlstate AS sqlstate,
        step.failure_constraint AS constraint_name,
        step.failure_table AS table_name,
        step.failure_column AS column_name
    FROM pybatch.step_execution AS step
    WHERE
        step.job_execution_id = :job_execution_id
        AND step.failure_error_class IS NOT NULL
) AS reason
ORDER BY reason.step_execution_id NULLS FIRST
LIMIT :row_limit;

-- :name explore_running_executions :many
-- :doc Executions running now - STARTED or STOPPING with a lease that has not run out on the
-- database clock - id ascending after after_id, at most row_limit, each with its newest
-- step's progress and the server's time of reading (job_execution_unresolved_identity,
-- step_execution_execution_identity).
SELECT
    execution.id,
    instance.job_name,
    execution.attempt,
    execution.status,
    execution.started_at,
    execution.lease_expires_at,
    execution.stop_requested_at,
    execution.owner_host,
    step.step_name,
    step.started_at AS step_started_at,
    step.read_count,
    step.write_count,
    step.commit_count,
    pg_catalog.STATEMENT_TIMESTAMP() AS observed_at
FROM pybatch.job_execution AS execution
INNER JOIN pybatch.job_instance AS instance ON execution.job_instance_id = instance.id
LEFT JOIN
    LATERAL (
        SELECT
            newest.step_name,
            newest.started_at,
            newest.read_count,
            newest.write_count,
            newest.commit_count
        FROM pybatch.step_execution AS newest
        WHERE newest.job_execution_id = execution.id
        ORDER BY newest.id DESC
        LIMIT 1
    ) AS step
    ON TRUE
WHERE
    execution.status IN ('STARTED', 'STOPPING')
    AND execution.lease_expires_at > pg_catalog.STATEMENT_TIMESTAMP()
    AND execution.id > :after_id
ORDER BY execution.id
LIMIT :row_limit;

-- :name explore_recent_executions :many
-- :doc The newest executions of one job name, id descending, at most row_limit: the attempts of
-- its row_limit newest instances (job_instance_name_identity, then job_execution_attempt_unique
-- per instance), so at most row_limit * row_limit rows are read whatever the history's size.
SELECT
    execution.execution_id,
    execution.attempt,
    execution.status
FROM (
    SELECT instance.id
    FROM pybatch.job_instance AS instance
    WHERE instance.job_name = :job_name
    ORDER BY instance.id DESC
    LIMIT :row_limit
) AS recent_instance
CROSS JOIN
    LATERAL (
        SELECT
            attempt.id AS execution_id,
            attempt.attempt,
            attempt.status
        FROM pybatch.job_execution AS attempt
        WHERE attempt.job_instance_id = recent_instance.id
        ORDER BY attempt.attempt DESC
        LIMIT :row_limit
    ) AS execution
ORDER BY execution.execution_id DESC
LIMIT :row_limit;
