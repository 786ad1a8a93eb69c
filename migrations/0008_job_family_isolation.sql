-- Migration 0008: isolation between job families, ready for a DBA to switch on.
--
-- Without isolation every runtime role may update every run: a job's script holding the
-- runtime role can forge another job's lease, owner token, stop request or status. A job
-- family is a set of job names, given by name prefixes, that a database role may act on:
-- pybatch.job_family_grant maps a role to its prefixes, and the row-level security policies
-- below admit a row of the job tables only when its job name (its own, or that of the
-- instance it belongs to) starts with a prefix granted to CURRENT_USER. The prefix '' grants
-- every job (operators, retention).
--
-- This file only creates the mapping table and the policies. Policies are inert until row
-- level security is enabled on their table, and this file enables it nowhere, so after it
-- every role behaves exactly as before. A DBA switches isolation on with the script of
-- docs/dba.md ("Isolating job families"): ALTER TABLE ... ENABLE ROW LEVEL SECURITY, which
-- only the tables' owner can undo. A setting read by the policies would have been easier to
-- flip, but any session may set a custom setting, so the isolated role itself could turn
-- isolation off.
--
-- Each policy names only its table's parent: a step's policy looks its execution up in
-- job_execution, which is itself under its own policy, and so on up to job_instance, whose
-- policy reads the mapping. One index probe per level, on primary keys.
--
-- Lint and locks: the new table is created empty. CREATE POLICY takes a short ACCESS
-- EXCLUSIVE lock on its table (no scan, no rewrite), like the migration's other DDL, under
-- the migrator's lock timeout.

CREATE TABLE pybatch.job_family_grant (
    role_name TEXT COLLATE "C" NOT NULL,
    job_name_prefix TEXT COLLATE "C" NOT NULL,
    CONSTRAINT job_family_grant_pkey PRIMARY KEY (role_name, job_name_prefix),
    -- A role name is at most 63 bytes in PostgreSQL (NAMEDATALEN - 1).
    CONSTRAINT job_family_grant_role_name_length
    CHECK (OCTET_LENGTH(role_name) BETWEEN 1 AND 63),
    -- A job name is at most 128 bytes (job_instance_job_name_length), so is a prefix.
    CONSTRAINT job_family_grant_job_name_prefix_length
    CHECK (OCTET_LENGTH(job_name_prefix) <= 128)
);

COMMENT ON TABLE pybatch.job_family_grant IS
'Job families: the job name prefixes each database role may act on once row level security '
'is enabled on the job tables. Written by the DBA only.';
COMMENT ON COLUMN pybatch.job_family_grant.role_name IS
'The role, compared with CURRENT_USER: membership in another role does not count.';
COMMENT ON COLUMN pybatch.job_family_grant.job_name_prefix IS
'Job names starting with these bytes belong to the family; the empty prefix is every job.';

-- job_definition and job_instance carry the job name.

CREATE POLICY job_definition_job_family ON pybatch.job_definition
USING (
    EXISTS (
        SELECT
        FROM pybatch.job_family_grant AS f
        WHERE
            f.role_name = CURRENT_USER
            AND STARTS_WITH(job_definition.job_name, f.job_name_prefix)
    )
);

CREATE POLICY job_instance_job_family ON pybatch.job_instance
USING (
    EXISTS (
        SELECT
        FROM pybatch.job_family_grant AS f
        WHERE
            f.role_name = CURRENT_USER
            AND STARTS_WITH(job_instance.job_name, f.job_name_prefix)
    )
);

-- An upgrade edge belongs to the job of its target definition.
CREATE POLICY definition_upgrade_job_family ON pybatch.definition_upgrade
USING (
    EXISTS (
        SELECT
        FROM pybatch.job_definition AS d
        WHERE d.id = definition_upgrade.to_definition_id
    )
);

CREATE POLICY job_execution_job_family ON pybatch.job_execution
USING (
    EXISTS (
        SELECT
        FROM pybatch.job_instance AS i
        WHERE i.id = job_execution.job_instance_id
    )
);

CREATE POLICY step_execution_job_family ON pybatch.step_execution
USING (
    EXISTS (
        SELECT
        FROM pybatch.job_execution AS e
        WHERE e.id = step_execution.job_execution_id
    )
);

-- A partition belongs to its parent step (its worker step runs in the same execution).
CREATE POLICY step_partition_job_family ON pybatch.step_partition
USING (
    EXISTS (
        SELECT
        FROM pybatch.step_execution AS s
        WHERE s.id = step_partition.step_execution_id
    )
);

CREATE POLICY flow_decision_job_family ON pybatch.flow_decision
USING (
    EXISTS (
        SELECT
        FROM pybatch.job_execution AS e
        WHERE e.id = flow_decision.job_execution_id
    )
);

CREATE POLICY recovery_decision_job_family ON pybatch.recovery_decision
USING (
    EXISTS (
        SELECT
        FROM pybatch.job_execution AS e
        WHERE e.id = recovery_decision.job_execution_id
    )
);

-- An operator request names an instance, an execution, both or (a refused request) neither;
-- each one it names must be in the family.
CREATE POLICY operator_request_job_family ON pybatch.operator_request
USING (
    (
        operator_request.job_instance_id IS NULL
        OR EXISTS (
            SELECT
            FROM pybatch.job_instance AS i
            WHERE i.id = operator_request.job_instance_id
        )
    )
    AND (
        operator_request.job_execution_id IS NULL
        OR EXISTS (
            SELECT
            FROM pybatch.job_execution AS e
            WHERE e.id = operator_request.job_execution_id
        )
    )
);
