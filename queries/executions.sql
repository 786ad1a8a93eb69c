-- :name insert_job_execution :one
-- :doc Insert a launch or restart attempt in STARTING under the instance lock; backstops are
-- job_execution_attempt_unique and the partial unique index job_execution_one_unresolved.
INSERT INTO pybatch.job_execution (
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
    updated_at,
    version
)
VALUES (
    :job_instance_id,
    :definition_id,
    :upgrade_from_definition_id,
    :restart_of_execution_id,
    :attempt,
    'STARTING',
    'UNKNOWN',
    :parameters,
    1,
    'oxide_batch.empty.v1',
    1,
    CAST('{}' AS JSONB),
    :now,
    :now,
    0
)
RETURNING
    id,
    job_instance_id,
    definition_id,
    upgrade_from_definition_id,
    restart_of_execution_id,
    attempt,
    status,
    exit_code,
    failure_category,
    failure_id,
    created_at,
    started_at,
    ended_at,
    updated_at,
    version;

-- :name find_latest_job_execution :one
-- :doc The latest attempt of an instance (job_execution_attempt_unique, scanned backwards).
SELECT
    e.id,
    e.job_instance_id,
    e.definition_id,
    e.upgrade_from_definition_id,
    e.restart_of_execution_id,
    e.attempt,
    e.status,
    e.exit_code,
    e.failure_category,
    e.failure_id,
    e.created_at,
    e.started_at,
    e.ended_at,
    e.updated_at,
    e.version
FROM pybatch.job_execution AS e
WHERE e.job_instance_id = :job_instance_id
ORDER BY e.attempt DESC
LIMIT 1;

-- :name get_job_execution :one
-- :doc One job execution by id (job_execution_pkey).
SELECT
    e.id,
    e.job_instance_id,
    e.definition_id,
    e.upgrade_from_definition_id,
    e.restart_of_execution_id,
    e.attempt,
    e.status,
    e.exit_code,
    e.failure_category,
    e.failure_id,
    e.created_at,
    e.started_at,
    e.ended_at,
    e.updated_at,
    e.version
FROM pybatch.job_execution AS e
WHERE e.id = :job_execution_id;

-- :name lock_job_execution :one
-- :doc Lock one job execution before a transition or enrichment (lock order - after the instance).
-- FOR NO KEY UPDATE: a transition never changes the key, so a partition claim inserting a worker
-- step (whose foreign key check takes FOR KEY SHARE on this row) is not blocked by it.
SELECT
    e.id,
    e.job_instance_id,
    e.definition_id,
    e.upgrade_from_definition_id,
    e.restart_of_execution_id,
    e.attempt,
    e.status,
    e.exit_code,
    e.failure_category,
    e.failure_id,
    e.created_at,
    e.started_at,
    e.ended_at,
    e.updated_at,
    e.version
FROM pybatch.job_execution AS e
WHERE e.id = :job_execution_id
FOR NO KEY UPDATE;

-- :name list_job_executions :many
-- :doc Every attempt of an instance in attempt order (job_execution_attempt_unique).
SELECT
    e.id,
    e.job_instance_id,
    e.definition_id,
    e.upgrade_from_definition_id,
    e.restart_of_execution_id,
    e.attempt,
    e.status,
    e.exit_code,
    e.failure_category,
    e.failure_id,
    e.created_at,
    e.started_at,
    e.ended_at,
    e.updated_at,
    e.version
FROM pybatch.job_execution AS e
WHERE e.job_instance_id = :job_instance_id
ORDER BY e.attempt;

-- :name update_job_execution_transition :affected
-- :doc Apply a checked lifecycle transition as a compare-and-swap on the version;
-- updated_at never moves backwards. Zero rows means a stale version or a missing row.
UPDATE pybatch.job_execution
SET
    status = :status,
    failure_category = :failure_category,
    failure_id = :failure_id,
    started_at = :started_at,
    ended_at = :ended_at,
    updated_at = GREATEST(updated_at, :transitioned_at),
    version = version + 1
WHERE id = :job_execution_id AND version = :expected_version;

-- :name update_job_execution_exit_code :affected
-- :doc Replace only the exit code as a compare-and-swap on the version, in any status
-- (docs/contract.md, Exit-status enrichment).
UPDATE pybatch.job_execution
SET
    exit_code = :exit_code,
    updated_at = GREATEST(updated_at, :now),
    version = version + 1
WHERE id = :job_execution_id AND version = :expected_version;

-- :name update_job_execution_failure_reason :affected
-- :doc Record why a FAILED row failed (class, redacted message, the server's names) as a
-- compare-and-swap on the version; zero rows means a stale version or a row not FAILED.
UPDATE pybatch.job_execution
SET
    failure_error_class = :error_class,
    failure_message = :message,
    failure_sqlstate = :sqlstate,
    failure_constraint = :constraint_name,
    failure_table = :table_name,
    failure_column = :column_name,
    updated_at = GREATEST(updated_at, :now),
    version = version + 1
WHERE id = :job_execution_id AND version = :expected_version AND status = 'FAILED';
