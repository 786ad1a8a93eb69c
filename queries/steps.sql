-- :name get_step_execution :one
-- :doc One step execution with its durable state (step_execution_pkey).
SELECT
    s.id,
    s.job_execution_id,
    s.step_name,
    s.step_logical_id,
    s.status,
    s.exit_code,
    s.read_count,
    s.processed_count,
    s.write_count,
    s.filter_count,
    s.commit_count,
    s.rollback_count,
    s.checkpoint_format,
    s.checkpoint_schema,
    s.checkpoint_schema_version,
    s.checkpoint_payload,
    s.context_format,
    s.context_schema,
    s.context_schema_version,
    s.context_payload,
    s.failure_category,
    s.failure_id,
    s.created_at,
    s.started_at,
    s.ended_at,
    s.updated_at,
    s.version,
    s.read_retry_count,
    s.process_retry_count,
    s.write_retry_count,
    s.read_skip_count,
    s.process_skip_count,
    s.write_skip_count,
    s.no_rollback_count
FROM pybatch.step_execution AS s
WHERE s.id = :step_execution_id;

-- :name lock_step_execution :one
-- :doc Lock one step execution before a transition or enrichment (lock order - last).
SELECT
    s.id,
    s.job_execution_id,
    s.step_name,
    s.step_logical_id,
    s.status,
    s.exit_code,
    s.read_count,
    s.processed_count,
    s.write_count,
    s.filter_count,
    s.commit_count,
    s.rollback_count,
    s.checkpoint_format,
    s.checkpoint_schema,
    s.checkpoint_schema_version,
    s.checkpoint_payload,
    s.context_format,
    s.context_schema,
    s.context_schema_version,
    s.context_payload,
    s.failure_category,
    s.failure_id,
    s.created_at,
    s.started_at,
    s.ended_at,
    s.updated_at,
    s.version,
    s.read_retry_count,
    s.process_retry_count,
    s.write_retry_count,
    s.read_skip_count,
    s.process_skip_count,
    s.write_skip_count,
    s.no_rollback_count
FROM pybatch.step_execution AS s
WHERE s.id = :step_execution_id
FOR UPDATE;

-- :name list_step_executions :many
-- :doc The steps of a job execution in creation order (step_execution_execution_identity).
SELECT
    s.id,
    s.job_execution_id,
    s.step_name,
    s.step_logical_id,
    s.status,
    s.exit_code,
    s.read_count,
    s.processed_count,
    s.write_count,
    s.filter_count,
    s.commit_count,
    s.rollback_count,
    s.checkpoint_format,
    s.checkpoint_schema,
    s.checkpoint_schema_version,
    s.checkpoint_payload,
    s.context_format,
    s.context_schema,
    s.context_schema_version,
    s.context_payload,
    s.failure_category,
    s.failure_id,
    s.created_at,
    s.started_at,
    s.ended_at,
    s.updated_at,
    s.version,
    s.read_retry_count,
    s.process_retry_count,
    s.write_retry_count,
    s.read_skip_count,
    s.process_skip_count,
    s.write_skip_count,
    s.no_rollback_count
FROM pybatch.step_execution AS s
WHERE s.job_execution_id = :job_execution_id
ORDER BY s.id;

-- :name update_step_execution_transition :affected
-- :doc Apply a checked lifecycle transition, with the counters (terminal rollback), as a
-- compare-and-swap on the version; updated_at never moves backwards.
UPDATE pybatch.step_execution
SET
    status = :status,
    failure_category = :failure_category,
    failure_id = :failure_id,
    started_at = :started_at,
    ended_at = :ended_at,
    rollback_count = :rollback_count,
    updated_at = GREATEST(updated_at, :transitioned_at),
    version = version + 1
WHERE id = :step_execution_id AND version = :expected_version;

-- :name end_unfinished_step_executions :one
-- :doc End, in the transaction that ends their job execution, every step of it still unfinished,
-- and release every partition of its plans still claimed (migration 0025 end_unfinished_steps,
-- which first locks them, waiting for in-flight chunk commits and partition claims): STOPPED
-- when the execution stopped, else FAILED with the given category. No step stays STARTED under a
-- finished execution, so nothing of the old owner can commit a chunk afterwards.
SELECT
    pybatch.end_unfinished_steps(
        :job_execution_id, :status, :failure_category, :ended_at
    ) AS ended_steps;

-- :name end_step_execution :one
-- :doc End a step of a running execution as its owner in one statement (migration 0014
-- end_step_execution): the transition, its exit status and failure reason. outcome - ended, or
-- the error that refuses it (the execution is not this owner's any more ...), with details.
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
FROM pybatch.end_step_execution(
    :job_execution_id,
    :owner_token,
    :step_execution_id,
    :status,
    :error_class,
    :message,
    :sqlstate,
    :constraint_name,
    :table_name,
    :column_name,
    :now
) AS o;
