-- :name find_retention_action :one
-- :doc The recorded retention request of (action, operation id) (retention_action_identity_unique).
SELECT
    r.id,
    r.job_instance_id,
    r.action,
    r.operation_id,
    r.actor_ref,
    r.reason_code,
    r.request_digest,
    r.plan_digest,
    r.batch_bound,
    r.deleted_flow_decisions,
    r.deleted_recovery_decisions,
    r.deleted_operator_requests,
    r.deleted_step_partitions,
    r.deleted_step_executions,
    r.deleted_job_executions,
    r.deleted_job_instances,
    r.outcome_class,
    r.applied_at
FROM pybatch.retention_action AS r
WHERE r.action = :action AND r.operation_id = :operation_id;

-- :name insert_retention_action :one
-- :doc Append a retention audit row; retention_action_identity_unique settles a race on one
-- (action, operation id): the loser fails with ConcurrentModification.
INSERT INTO pybatch.retention_action (
    job_instance_id,
    action,
    operation_id,
    actor_ref,
    reason_code,
    request_digest,
    plan_digest,
    batch_bound,
    deleted_flow_decisions,
    deleted_recovery_decisions,
    deleted_operator_requests,
    deleted_step_partitions,
    deleted_step_executions,
    deleted_job_executions,
    deleted_job_instances,
    outcome_class,
    applied_at
)
VALUES (
    :job_instance_id,
    :action,
    :operation_id,
    :actor_ref,
    :reason_code,
    :request_digest,
    :plan_digest,
    :batch_bound,
    :deleted_flow_decisions,
    :deleted_recovery_decisions,
    :deleted_operator_requests,
    :deleted_step_partitions,
    :deleted_step_executions,
    :deleted_job_executions,
    :deleted_job_instances,
    :outcome_class,
    :applied_at
)
RETURNING id;

-- :name survey_purge_instances :many
-- :doc Candidate instances for one status, oldest latest execution first: the latest attempt has
-- this status and was last written before the cutoff, the instance is of the job, not held and
-- has no unresolved attempt (job_execution_status_updated, job_execution_attempt_unique).
-- The (after_updated_at, after_instance_id) keyset pages a dry run through every candidate.
SELECT
    e.job_instance_id,
    e.updated_at,
    e.status,
    (
        SELECT COUNT(*) AS n
        FROM pybatch.job_execution AS a
        WHERE a.job_instance_id = e.job_instance_id
    ) AS execution_count
FROM pybatch.job_execution AS e
INNER JOIN pybatch.job_instance AS i ON e.job_instance_id = i.id
WHERE
    e.status = :status
    AND e.updated_at < :cutoff
    AND (e.updated_at, e.job_instance_id) > (:after_updated_at, :after_instance_id)
    AND i.job_name = :job_name
    AND i.hold_actor IS NULL
    AND NOT EXISTS (
        SELECT 1
        FROM pybatch.job_execution AS n
        WHERE n.job_instance_id = e.job_instance_id AND n.attempt > e.attempt
    )
    AND NOT EXISTS (
        SELECT 1
        FROM pybatch.job_execution AS u
        WHERE
            u.job_instance_id = e.job_instance_id
            AND u.status IN ('STARTING', 'STARTED', 'STOPPING', 'UNKNOWN')
    )
ORDER BY e.updated_at, e.job_instance_id
LIMIT :limit;

-- :name list_instance_executions :many
-- :doc Every execution of the given instances with its version (job_execution_attempt_unique).
SELECT
    e.job_instance_id,
    e.id,
    e.version
FROM pybatch.job_execution AS e
WHERE e.job_instance_id = ANY(CAST(:instance_ids AS BIGINT[]))
ORDER BY e.job_instance_id, e.attempt;

-- :name count_purge_rows :one
-- :doc The rows a purge of these instances and executions would delete, per table.
SELECT
    (
        SELECT COUNT(*) AS n
        FROM pybatch.flow_decision AS f
        WHERE f.job_execution_id = ANY(CAST(:execution_ids AS BIGINT[]))
    ) AS flow_decisions,
    (
        SELECT COUNT(*) AS n
        FROM pybatch.recovery_decision AS d
        WHERE d.job_execution_id = ANY(CAST(:execution_ids AS BIGINT[]))
    ) AS recovery_decisions,
    (
        SELECT COUNT(*) AS n
        FROM pybatch.operator_request AS o
        WHERE
            o.job_execution_id = ANY(CAST(:execution_ids AS BIGINT[]))
            OR (
                o.job_execution_id IS NULL
                AND o.job_instance_id = ANY(CAST(:instance_ids AS BIGINT[]))
            )
    ) AS operator_requests,
    (
        SELECT COUNT(*) AS n
        FROM pybatch.step_partition AS p
        INNER JOIN pybatch.step_execution AS s ON p.step_execution_id = s.id
        WHERE s.job_execution_id = ANY(CAST(:execution_ids AS BIGINT[]))
    ) AS step_partitions,
    (
        SELECT COUNT(*) AS n
        FROM pybatch.step_execution AS s
        WHERE s.job_execution_id = ANY(CAST(:execution_ids AS BIGINT[]))
    ) AS step_executions;

-- :name lock_purge_instances :many
-- :doc Lock the candidate instances in ascending id order (lock order - instances first).
SELECT
    i.id,
    i.hold_actor IS NOT NULL AS held
FROM pybatch.job_instance AS i
WHERE i.id = ANY(CAST(:instance_ids AS BIGINT[]))
ORDER BY i.id
FOR UPDATE;

-- :name lock_purge_executions :many
-- :doc Lock every execution of the candidate instances in ascending id order (after the instances).
SELECT
    e.job_instance_id,
    e.id,
    e.version,
    e.status,
    e.attempt
FROM pybatch.job_execution AS e
WHERE e.job_instance_id = ANY(CAST(:instance_ids AS BIGINT[]))
ORDER BY e.id
FOR UPDATE;

-- :name list_purge_audit_records :many
-- :doc The operator requests and recovery decisions a purge of these histories deletes.
SELECT
    'OPERATOR_REQUEST' AS record_kind,
    o.id AS record_id
FROM pybatch.operator_request AS o
WHERE
    o.job_execution_id = ANY(CAST(:execution_ids AS BIGINT[]))
    OR (
        o.job_execution_id IS NULL
        AND o.job_instance_id = ANY(CAST(:instance_ids AS BIGINT[]))
    )
UNION ALL
SELECT
    'RECOVERY_DECISION' AS record_kind,
    d.id AS record_id
FROM pybatch.recovery_decision AS d
WHERE d.job_execution_id = ANY(CAST(:execution_ids AS BIGINT[]));

-- :name mark_purged_audit_links :affected
-- :doc Record which links lost their record to this purge (audit_chain_purge), naming the
-- retention action that did it; verification then accepts those records' absence.
INSERT INTO pybatch.audit_chain_purge (seq, retention_action_id)
SELECT
    c.seq,
    :retention_action_id AS retention_action_id
FROM pybatch.audit_chain AS c
WHERE
    (
        c.record_kind = 'OPERATOR_REQUEST'
        AND c.record_id = ANY(CAST(:operator_request_ids AS BIGINT[]))
    )
    OR (
        c.record_kind = 'RECOVERY_DECISION'
        AND c.record_id = ANY(CAST(:recovery_decision_ids AS BIGINT[]))
    );

-- :name delete_purge_flow_decisions :affected
-- :doc Delete the flow decisions of the candidate executions.
DELETE FROM pybatch.flow_decision
WHERE job_execution_id = ANY(CAST(:execution_ids AS BIGINT[]));

-- :name delete_purge_recovery_decisions :affected
-- :doc Delete the recovery decisions of the candidate executions.
DELETE FROM pybatch.recovery_decision
WHERE job_execution_id = ANY(CAST(:execution_ids AS BIGINT[]));

-- :name delete_purge_operator_requests :affected
-- :doc Delete execution-scoped requests of the candidates and instance-scoped ones of their
-- instances (operator_request_execution, operator_request_instance).
DELETE FROM pybatch.operator_request
WHERE
    job_execution_id = ANY(CAST(:execution_ids AS BIGINT[]))
    OR (
        job_execution_id IS NULL
        AND job_instance_id = ANY(CAST(:instance_ids AS BIGINT[]))
    );

-- :name delete_purge_step_partitions :affected
-- :doc Delete the partitions of the candidates' steps.
DELETE FROM pybatch.step_partition AS p
USING pybatch.step_execution AS s
WHERE
    p.step_execution_id = s.id
    AND s.job_execution_id = ANY(CAST(:execution_ids AS BIGINT[]));

-- :name delete_purge_step_executions :affected
-- :doc Delete the steps of the candidate executions.
DELETE FROM pybatch.step_execution
WHERE job_execution_id = ANY(CAST(:execution_ids AS BIGINT[]));

-- :name delete_purge_job_executions :affected
-- :doc Delete the candidate executions (whole histories, so no retained restart references them).
DELETE FROM pybatch.job_execution
WHERE id = ANY(CAST(:execution_ids AS BIGINT[]));

-- :name tombstone_purged_instances :affected
-- :doc Keep purged instances as tombstones, in one statement: each one's final status (the
-- status of its latest execution) and the purge time; holds stay (job_instance_pkey).
UPDATE pybatch.job_instance AS i
SET
    final_status = t.final_status,
    purged_at = :purged_at
FROM
    UNNEST(
        CAST(:instance_ids AS BIGINT[]), CAST(:final_statuses AS TEXT[])
    ) AS t (id, final_status)
WHERE i.id = t.id;

-- :name detach_retention_actions :affected
-- :doc Clear the instance reference of retention records before their instance is deleted.
UPDATE pybatch.retention_action
SET job_instance_id = NULL
WHERE job_instance_id = ANY(CAST(:instance_ids AS BIGINT[]));

-- :name delete_purge_instances :affected
-- :doc Delete purged instances (forget_instances), with their holds.
DELETE FROM pybatch.job_instance
WHERE id = ANY(CAST(:instance_ids AS BIGINT[]));
