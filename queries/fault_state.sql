-- :name lock_step_fault_state :one
-- :doc Lock a step for a retry reservation (its own short transaction) and read the state the
-- reservation is validated against - status, version, checkpoint and fault-state envelope.
SELECT
    s.status,
    s.version,
    s.checkpoint_format,
    s.checkpoint_schema,
    s.checkpoint_schema_version,
    s.checkpoint_payload,
    s.fault_state_format,
    s.fault_state_schema,
    s.fault_state_schema_version,
    s.fault_state_payload,
    s.fault_state_checksum
FROM pybatch.step_execution AS s
WHERE s.id = :step_execution_id AND s.job_execution_id = :job_execution_id
FOR UPDATE;

-- :name update_step_fault_reservation_read :affected
-- :doc Spend one read retry - read_retry_count and rollback_count advance and the new envelope is
-- stored, as a compare-and-swap on version and STARTED (a stale reserver changes nothing).
UPDATE pybatch.step_execution
SET
    read_retry_count = read_retry_count + 1,
    rollback_count = rollback_count + 1,
    fault_state_payload = :fault_state_payload,
    fault_state_checksum = :fault_state_checksum,
    updated_at = GREATEST(updated_at, :now),
    version = version + 1
WHERE id = :step_execution_id AND version = :expected_version AND status = 'STARTED';

-- :name update_step_fault_reservation_process :affected
-- :doc Spend one process retry; same guard as update_step_fault_reservation_read.
UPDATE pybatch.step_execution
SET
    process_retry_count = process_retry_count + 1,
    rollback_count = rollback_count + 1,
    fault_state_payload = :fault_state_payload,
    fault_state_checksum = :fault_state_checksum,
    updated_at = GREATEST(updated_at, :now),
    version = version + 1
WHERE id = :step_execution_id AND version = :expected_version AND status = 'STARTED';

-- :name update_step_fault_reservation_write :affected
-- :doc Spend one write retry; same guard as update_step_fault_reservation_read.
UPDATE pybatch.step_execution
SET
    write_retry_count = write_retry_count + 1,
    rollback_count = rollback_count + 1,
    fault_state_payload = :fault_state_payload,
    fault_state_checksum = :fault_state_checksum,
    updated_at = GREATEST(updated_at, :now),
    version = version + 1
WHERE id = :step_execution_id AND version = :expected_version AND status = 'STARTED';
