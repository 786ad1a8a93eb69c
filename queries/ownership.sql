-- :name renew_execution_lease :one
-- :doc Extend the lease of an unresolved execution that this owner still holds and report a
-- pending stop request; no row means the ownership is lost. The version does not change.
UPDATE pybatch.job_execution
SET
    lease_expires_at
    = pg_catalog.CLOCK_TIMESTAMP() + CAST(:lease_ms AS BIGINT) * INTERVAL '1 millisecond'
WHERE
    id = :job_execution_id
    AND owner_token = :owner_token
    AND status IN ('STARTING', 'STARTED', 'STOPPING')
RETURNING stop_requested_at IS NOT NULL AS stop_requested;

-- :name lock_execution_ownership :one
-- :doc Lock one execution and read its ownership evidence; lease_expired compares the lease
-- with the database clock, so every process judges it by one clock (lock order - after the
-- instance). FOR NO KEY UPDATE, as lock_job_execution: worker steps can still be inserted.
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
    e.version,
    e.owner_token,
    e.lease_expires_at,
    CAST(
        GREATEST(
            EXTRACT(EPOCH FROM e.lease_expires_at - pg_catalog.CLOCK_TIMESTAMP()) * 1000, 0
        ) AS BIGINT
    ) AS lease_remaining_ms,
    e.stop_requested_at IS NOT NULL AS stop_requested,
    COALESCE(e.lease_expires_at <= pg_catalog.CLOCK_TIMESTAMP(), FALSE) AS lease_expired
FROM pybatch.job_execution AS e
WHERE e.id = :job_execution_id
FOR NO KEY UPDATE;

-- :name list_started_step_partitions :many
-- :doc The partitions of a plan being worked on, with their workers and their ownership
-- evidence - whether each has a lease and whether it ran out on the database clock (lost-worker
-- checks read it before any lock; end_step_partition confirms under the locks).
SELECT
    p.id,
    p.worker_step_execution_id,
    p.partition_key,
    p.version,
    p.worker_lease_expires_at IS NOT NULL AS leased,
    COALESCE(p.worker_lease_expires_at <= pg_catalog.CLOCK_TIMESTAMP(), FALSE) AS lease_expired
FROM pybatch.step_partition AS p
WHERE p.step_execution_id = :step_execution_id AND p.status = 'STARTED'
ORDER BY p.partition_ordinal;

-- :name renew_partition_worker_lease :affected
-- :doc Extend the lease of a STARTED partition that this owner still works on with this worker;
-- zero rows means the ownership is lost (the partition was recovered, or ended). The version
-- does not change.
UPDATE pybatch.step_partition
SET
    worker_lease_expires_at
    = pg_catalog.CLOCK_TIMESTAMP() + CAST(:lease_ms AS BIGINT) * INTERVAL '1 millisecond'
WHERE
    id = :step_partition_id
    AND worker_step_execution_id = :worker_step_execution_id
    AND worker_owner_token = :owner_token
    AND status = 'STARTED';

-- :name launch_job_execution :one
-- :doc Launch or restart the instance of a key as its owner in one statement (migration 0014
-- launch_job_execution): the instance created when absent and its definition usable, then
-- create_job_execution - under the instance lock, the latest attempt, the definition and the
-- upgrade edge checked, the attempt counted and inserted STARTED with the owner token, host and
-- lease. outcome - launched, unregistered, or the error that refuses it, with details (for
-- ExecutionAlreadyActive the attempt in the way, its lease judged on the database clock).
SELECT
    o.outcome,
    o.details,
    o.lease_expired,
    o.lease_remaining_ms,
    (o.instance).id AS instance_id,
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
    (o.execution).owner_token AS owner_token,
    (o.execution).lease_expires_at AS lease_expires_at,
    (o.execution).stop_requested_at IS NOT NULL AS stop_requested,
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
FROM pybatch.launch_job_execution(
    :job_name,
    :instance_key,
    :identifying_parameters,
    :definition_id,
    :definition_job_name,
    :manifest_format,
    :definition_revision,
    :manifest_digest,
    :owner_token,
    :owner_host,
    :lease_ms,
    :now
) AS o;
