-- Migration 0012: find instances by their identifying parameters; record which process owns
-- an execution.
--
-- 1. The explorer's parameter filter (`pybatch instances JOB --param NAME=VALUE`, and
-- `executions` and `unresolved` with `--param`) finds the instances whose identifying
-- parameters contain the given values through a GIN index over
-- job_instance.identifying_parameters, operator class jsonb_path_ops: one hashed entry per
-- path and value, so a long string value costs a few bytes in the index, and the index answers
-- containment (`@>`), the only operator the filter uses.
--
-- Lint: CONCURRENTLY cannot run in the migrator's transaction, so the index is built IF NOT
-- EXISTS while writes to job_instance wait (a launch that creates or restarts an instance, a
-- hold, a purge); reads and chunk commits go on. On a large, busy database build it
-- beforehand by hand with CONCURRENTLY under the same name (docs/dba.md); this statement
-- then finds it and does nothing.
--
-- 2. job_execution.owner_host: `host:pid` of the process that claimed the execution, written
-- by the claim together with the owner token and kept when the run ends, like the token, so
-- operators see where a run runs or ran (`pybatch running`, `pybatch show`). It is
-- information only: no decision reads it. ADD COLUMN of a nullable column without a default
-- changes the catalog only (no rewrite, no scan) under a short ACCESS EXCLUSIVE lock, last in
-- this file so that it is held for the shortest time; the CHECKs are added NOT VALID and
-- validated by migration 0013 under SHARE UPDATE EXCLUSIVE.

-- squawk-ignore require-concurrent-index-creation
CREATE INDEX IF NOT EXISTS job_instance_parameter_values -- noqa: PG01
ON pybatch.job_instance USING gin (identifying_parameters jsonb_path_ops);

COMMENT ON INDEX pybatch.job_instance_parameter_values IS
'Containment (@>) over identifying parameters: the explorer''s parameter filter.';

ALTER TABLE pybatch.job_execution
ADD COLUMN owner_host TEXT COLLATE "C";

ALTER TABLE pybatch.job_execution
-- A host name of letters, digits, dots, underscores and hyphens, then the process id.
ADD CONSTRAINT job_execution_owner_host_format
CHECK (owner_host ~ '^[A-Za-z0-9._-]{1,200}:[0-9]{1,10}$') NOT VALID,
-- Only a claimed execution has an owner host.
ADD CONSTRAINT job_execution_owner_host_has_owner
CHECK (owner_host IS NULL OR owner_token IS NOT NULL) NOT VALID;

-- A database isolated by job family (docs/dba.md) grants UPDATE column by column: every role
-- granted UPDATE on owner_token that way may now write owner_host too, which the claim of every
-- launch writes with it. Without isolation the table-wide grant already covers the column.
DO $$
DECLARE
    grantee_name NAME;
BEGIN
    FOR grantee_name IN
        SELECT DISTINCT grantee.rolname
        FROM pg_catalog.pg_attribute AS token_column
        CROSS JOIN LATERAL pg_catalog.ACLEXPLODE(token_column.attacl) AS privilege
        INNER JOIN pg_catalog.pg_roles AS grantee ON privilege.grantee = grantee.oid
        WHERE
            token_column.attrelid = CAST('pybatch.job_execution' AS REGCLASS)
            AND token_column.attname = 'owner_token'
            AND privilege.privilege_type = 'UPDATE'
    LOOP
        EXECUTE pg_catalog.FORMAT(
            'GRANT UPDATE (owner_host) ON pybatch.job_execution TO %I', grantee_name
        );
    END LOOP;
END
$$;

COMMENT ON COLUMN pybatch.job_execution.owner_host IS
'host:pid of the process that claimed the execution (informational, never a decision input); '
'NULL if claimed before migration 0012 or never claimed.';
