-- :name find_operator_request :one
-- :doc The audit row of one (action, operation id), via operator_request_identity_unique; the
-- same operation id under another action is another key (docs/contract.md, Operator requests).
SELECT
    r.id,
    r.job_instance_id,
    r.job_execution_id,
    r.action,
    r.authorization_class,
    r.operation_id,
    r.actor_ref,
    r.reason_code,
    r.request_digest,
    r.observed_version,
    r.prior_status,
    r.result_status,
    r.outcome_class,
    r.rejection_code,
    r.rejection_current_version,
    r.rejection_status,
    r.rejection_execution_id,
    r.requested_at
FROM pybatch.operator_request AS r
WHERE r.action = :action AND r.operation_id = :operation_id;

-- :name insert_operator_request :one
-- :doc Append one audit row with its rejection details. Race - two appends of one
-- (action, operation id) are settled by operator_request_identity_unique; the loser waits for
-- the winner's transaction and then fails (ConcurrentModification); every other constraint is
-- an IntegrityViolation.
INSERT INTO pybatch.operator_request (
    job_instance_id,
    job_execution_id,
    action,
    authorization_class,
    operation_id,
    actor_ref,
    reason_code,
    request_digest,
    observed_version,
    prior_status,
    result_status,
    outcome_class,
    rejection_code,
    rejection_current_version,
    rejection_status,
    rejection_execution_id,
    requested_at
)
VALUES (
    :job_instance_id,
    :job_execution_id,
    :action,
    :authorization_class,
    :operation_id,
    :actor_ref,
    :reason_code,
    :request_digest,
    :observed_version,
    :prior_status,
    :result_status,
    :outcome_class,
    :rejection_code,
    :rejection_current_version,
    :rejection_status,
    :rejection_execution_id,
    :requested_at
)
RETURNING id;
