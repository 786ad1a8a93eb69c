-- :name update_job_execution_recovered :affected
-- :doc Apply a recovery decision - FAILED or ABANDONED, bypassing the lifecycle table - as a
-- compare-and-swap on the version; the exit status is left unchanged (behaviour.md 4.9).
UPDATE pybatch.job_execution
SET
    status = :status,
    failure_category = :failure_category,
    failure_id = :failure_id,
    ended_at = :decided_at,
    updated_at = GREATEST(updated_at, :decided_at),
    version = version + 1
WHERE
    id = :job_execution_id
    AND version = :expected_version
    AND status IN ('STARTING', 'STARTED', 'STOPPING', 'UNKNOWN');

-- :name insert_recovery_decision :one
-- :doc Append the audit row of a recovery; recovery_decision_version_unique allows one decision
-- per observed execution version.
INSERT INTO pybatch.recovery_decision (
    job_execution_id,
    execution_version,
    prior_status,
    resulting_status,
    reason_code,
    operator_reference,
    evidence_digest,
    decided_at
)
VALUES (
    :job_execution_id,
    :expected_version,
    :prior_status,
    :status,
    :reason_code,
    :operator_reference,
    :evidence_digest,
    :decided_at
)
RETURNING
    id,
    job_execution_id,
    execution_version,
    prior_status,
    resulting_status,
    reason_code,
    operator_reference,
    evidence_digest,
    decided_at;

-- :name find_latest_recovery_decision :one
-- :doc The latest recovery decision of a job execution by (decided_at, id), or no row
-- (behaviour.md 4.9, rule 10).
SELECT
    d.id,
    d.job_execution_id,
    d.execution_version,
    d.prior_status,
    d.resulting_status,
    d.reason_code,
    d.operator_reference,
    d.evidence_digest,
    d.decided_at
FROM pybatch.recovery_decision AS d
WHERE d.job_execution_id = :job_execution_id
ORDER BY d.decided_at DESC, d.id DESC
LIMIT 1;
