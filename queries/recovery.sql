-- :name update_job_execution_recovered :affected
-- :doc Apply a recovery decision - FAILED or ABANDONED, bypassing the lifecycle table - as a
-- compare-and-swap on the version; the exit status is left unchanged (docs/contract.md, Recovery).
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
-- :doc The latest recovery decision of a job execution, or no row: the highest id (decisions on
-- one execution are serialised by its row lock, so the database's sequence orders them; a
-- client-stamped decided_at never does), recovery_decision_execution_identity.
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
ORDER BY d.id DESC
LIMIT 1;

-- :name read_recovery_snapshot :one
-- :doc The recovery snapshot of one execution (docs/contract.md, Recovery snapshot) - its state,
-- whether the given owner token is the recorded one (the token itself is never returned), the
-- server clock, its newest step and the markers' evidence.
SELECT
    e.status,
    e.attempt,
    e.version,
    e.updated_at,
    e.failure_category,
    s.id AS latest_step_id,
    s.status AS latest_step_status,
    s.checkpoint_schema AS latest_step_checkpoint_schema,
    s.checkpoint_schema_version AS latest_step_checkpoint_schema_version,
    e.owner_token IS NULL AS owner_absent,
    COALESCE(e.owner_token = :owner_token, FALSE) AS owner_matches,
    pg_catalog.CLOCK_TIMESTAMP() AS server_time,
    EXISTS(
        SELECT 1
        FROM pybatch.step_partition AS p
        INNER JOIN pybatch.step_execution AS ps ON p.step_execution_id = ps.id
        WHERE ps.job_execution_id = e.id AND p.status = 'COMPLETED'
    ) AS completed_partition,
    EXISTS(
        SELECT 1
        FROM pybatch.flow_decision AS f
        WHERE f.job_execution_id = e.id
    ) AS committed_flow_decision,
    COALESCE(d.manifest ->> 'delivery_mode' <> 'atomic_same_resource', TRUE)
        AS ambiguous_external_effect
FROM pybatch.job_execution AS e
INNER JOIN pybatch.job_definition AS d ON e.definition_id = d.id
LEFT JOIN LATERAL (
    SELECT
        st.id,
        st.status,
        st.checkpoint_schema,
        st.checkpoint_schema_version
    FROM pybatch.step_execution AS st
    WHERE st.job_execution_id = e.id
    ORDER BY st.id DESC
    LIMIT 1
) AS s ON TRUE
WHERE e.id = :job_execution_id;
