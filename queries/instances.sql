-- :name insert_job_instance_if_absent :one
-- :doc Create the instance of (job, key) unless it exists; job_instance_identity_unique arbitrates
-- concurrent launches and the loser reads the winner's row back (find_job_instance_by_key).
INSERT INTO pybatch.job_instance (job_name, instance_key, identifying_parameters, created_at)
VALUES (:job_name, :instance_key, :identifying_parameters, :now)
ON CONFLICT ON CONSTRAINT job_instance_identity_unique DO NOTHING
RETURNING id, job_name, instance_key, identifying_parameters, created_at;

-- :name find_job_instance_by_key :one
-- :doc The instance of (job, key digest), via job_instance_identity_unique.
SELECT
    i.id,
    i.job_name,
    i.instance_key,
    i.identifying_parameters,
    i.created_at
FROM pybatch.job_instance AS i
WHERE i.job_name = :job_name AND i.instance_key = :instance_key;

-- :name get_job_instance :one
-- :doc One instance by id (job_instance_pkey).
SELECT
    i.id,
    i.job_name,
    i.instance_key,
    i.identifying_parameters,
    i.created_at
FROM pybatch.job_instance AS i
WHERE i.id = :job_instance_id;
