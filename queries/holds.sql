-- :name read_instance_hold :one
-- :doc The hold columns of one instance (job_instance_pkey); no row means no instance.
SELECT
    i.id,
    i.hold_actor,
    i.hold_reason,
    i.hold_placed_at
FROM pybatch.job_instance AS i
WHERE i.id = :job_instance_id;

-- :name lock_instance_hold :one
-- :doc Lock one instance and read its hold (lock order - the instance first).
SELECT
    i.id,
    i.hold_actor,
    i.hold_reason,
    i.hold_placed_at
FROM pybatch.job_instance AS i
WHERE i.id = :job_instance_id
FOR UPDATE;

-- :name update_instance_hold :affected
-- :doc Place, replace or clear (all NULL) the one hold of an instance (job_instance_hold_shape).
UPDATE pybatch.job_instance
SET
    hold_actor = :actor_ref,
    hold_reason = :reason_code,
    hold_placed_at = :placed_at
WHERE id = :job_instance_id;
