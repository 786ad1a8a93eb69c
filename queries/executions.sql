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

-- :name end_job_execution :one
-- :doc End a running execution as its owner in one statement (migration 0024 end_job_execution):
-- the transition (STOPPED once a stop was observed), its exit status and failure reason, and its
-- unfinished steps ended with it; COMPLETED is refused while a step is unfinished
-- (StepsUnfinished). outcome - ended, or the error that refuses it, with details.
SELECT
    o.outcome,
    o.details,
    (o.execution).id AS id,
    (o.execution).job_instance_id AS job_instance_id,
    (o.execution).definition_id AS definition_id,
    (o.execution).upgrade_from_definition_id AS upgrade_from_definition_id,
    (o.execution).restart_of_execution_id AS restart_of_execution_id,
    (o.execution).attempt AS attempt,
    (o.execution).status AS status,
    (o.execution).exit_code AS exit_code,
    (o.execution).failure_category AS failure_category,
    (o.execution).failure_id AS failure_id,
    (o.execution).created_at AS created_at,
    (o.execution).started_at AS started_at,
    (o.execution).ended_at AS ended_at,
    (o.execution).updated_at AS updated_at,
    (o.execution).version AS version
FROM pybatch.end_job_execution(
    :job_execution_id,
    :owner_token,
    :status,
    :error_class,
    :message,
    :sqlstate,
    :constraint_name,
    :table_name,
    :column_name,
    :now
) AS o;

-- :name create_job_execution :one
-- :doc Create the next attempt of an instance, STARTING and unclaimed, in one statement
-- (migration 0014 create_job_execution): under the instance lock, the latest attempt, the
-- definition and the upgrade edge checked, the attempt counted and inserted. outcome - created,
-- unregistered (register the definition, try again) or the error that refuses it, with details;
-- the instance row comes back whole, so a corrupt one is refused.
SELECT
    o.outcome,
    o.details,
    (o.instance).id AS instance_id,
    (o.instance).job_name AS job_name,
    (o.instance).instance_key AS instance_key,
    (o.instance).identifying_parameters AS identifying_parameters,
    (o.instance).created_at AS instance_created_at,
    (o.execution).id AS id,
    (o.execution).job_instance_id AS job_instance_id,
    (o.execution).definition_id AS definition_id,
    (o.execution).upgrade_from_definition_id AS upgrade_from_definition_id,
    (o.execution).restart_of_execution_id AS restart_of_execution_id,
    (o.execution).attempt AS attempt,
    (o.execution).status AS status,
    (o.execution).exit_code AS exit_code,
    (o.execution).failure_category AS failure_category,
    (o.execution).failure_id AS failure_id,
    (o.execution).created_at AS created_at,
    (o.execution).started_at AS started_at,
    (o.execution).ended_at AS ended_at,
    (o.execution).updated_at AS updated_at,
    (o.execution).version AS version,
    (o.previous).id AS previous_id,
    (o.previous).job_instance_id AS previous_job_instance_id,
    (o.previous).definition_id AS previous_definition_id,
    (o.previous).upgrade_from_definition_id AS previous_upgrade_from_definition_id,
    (o.previous).restart_of_execution_id AS previous_restart_of_execution_id,
    (o.previous).attempt AS previous_attempt,
    (o.previous).status AS previous_status,
    (o.previous).exit_code AS previous_exit_code,
    (o.previous).failure_category AS previous_failure_category,
    (o.previous).failure_id AS previous_failure_id,
    (o.previous).created_at AS previous_created_at,
    (o.previous).started_at AS previous_started_at,
    (o.previous).ended_at AS previous_ended_at,
    (o.previous).updated_at AS previous_updated_at,
    (o.previous).version AS previous_version
FROM pybatch.create_job_execution(
    :job_instance_id,
    :definition_id,
    :definition_job_name,
    :manifest_format,
    :definition_revision,
    :manifest_digest,
    NULL,
    NULL,
    NULL,
    :now
) AS o;
