-- :name insert_job_definition_if_absent :one
-- :doc Register a definition unless its revision or digest exists (job_definition_revision_unique,
-- job_definition_digest_unique arbitrate); the caller then reads back which row won.
INSERT INTO pybatch.job_definition (
    job_name, definition_revision, manifest_format, manifest_digest, manifest, registered_at
)
VALUES (:job_name, :definition_revision, :manifest_format, :manifest_digest, :manifest, :now)
ON CONFLICT DO NOTHING
RETURNING id;

-- :name find_job_definition_by_revision :one
-- :doc The definition registered under (job, revision), to detect drift
-- (job_definition_revision_unique).
SELECT
    d.id,
    d.manifest_digest
FROM pybatch.job_definition AS d
WHERE d.job_name = :job_name AND d.definition_revision = :definition_revision;

-- :name find_job_definition_by_digest :one
-- :doc The definition row of a manifest under any revision (job_definition_digest_unique).
SELECT
    d.id,
    d.manifest_digest
FROM pybatch.job_definition AS d
WHERE d.job_name = :job_name AND d.manifest_digest = :manifest_digest;

-- :name insert_definition_upgrade_if_absent :one
-- :doc Register a direct upgrade edge unless (from, to) exists (definition_upgrade_pkey);
-- a reused key toward the same target fails on definition_upgrade_target_key_unique.
INSERT INTO pybatch.definition_upgrade (
    from_definition_id, to_definition_id, upgrade_key, step_mapping, registered_at
)
VALUES (:from_definition_id, :to_definition_id, :upgrade_key, :step_mapping, :now)
ON CONFLICT (from_definition_id, to_definition_id) DO NOTHING
RETURNING from_definition_id;

-- :name find_definition_upgrade :one
-- :doc The registered edge (from, to), for idempotent re-registration and restarts.
SELECT
    u.upgrade_key,
    u.step_mapping
FROM pybatch.definition_upgrade AS u
WHERE u.from_definition_id = :from_definition_id AND u.to_definition_id = :to_definition_id;
