-- :name claim_execution_owner :affected
-- :doc Record the owner token of a STARTING execution and start its lease on the database clock
-- (docs/contract.md, Ownership and leases); the same token again is idempotent. Zero rows -
-- classify the refusal.
UPDATE pybatch.job_execution
SET
    owner_token = :owner_token,
    lease_expires_at = CLOCK_TIMESTAMP() + CAST(:lease_ms AS BIGINT) * INTERVAL '1 millisecond',
    updated_at = GREATEST(updated_at, :claimed_at)
WHERE
    id = :job_execution_id
    AND version = :expected_version
    AND status = 'STARTING'
    AND (owner_token IS NULL OR owner_token = :owner_token);

-- :name renew_execution_lease :one
-- :doc Extend the lease of an unresolved execution that this owner still holds and report a
-- pending stop request; no row means the ownership is lost. The version does not change.
UPDATE pybatch.job_execution
SET lease_expires_at = CLOCK_TIMESTAMP() + CAST(:lease_ms AS BIGINT) * INTERVAL '1 millisecond'
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
        GREATEST(EXTRACT(EPOCH FROM e.lease_expires_at - CLOCK_TIMESTAMP()) * 1000, 0) AS BIGINT
    ) AS lease_remaining_ms,
    e.stop_requested_at IS NOT NULL AS stop_requested,
    COALESCE(e.lease_expires_at <= CLOCK_TIMESTAMP(), FALSE) AS lease_expired
FROM pybatch.job_execution AS e
WHERE e.id = :job_execution_id
FOR NO KEY UPDATE;
