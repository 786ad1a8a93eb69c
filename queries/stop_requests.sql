-- :name update_job_execution_stop_request :affected
-- :doc Record a durable stop request without a transition or a version bump
-- (docs/contract.md, Stop requests); a repeat request overwrites both columns
-- (job_execution_stop_shape).
UPDATE pybatch.job_execution
SET
    stop_requested_at = :requested_at,
    stop_requested_by = :actor_ref,
    updated_at = GREATEST(updated_at, :requested_at)
WHERE id = :job_execution_id AND version = :expected_version;
