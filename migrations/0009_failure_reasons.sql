-- Migration 0009: why an execution or a step failed, in words a user can act on.
--
-- A failed job execution or step already records a failure category and id. These columns
-- add the failure's reason: the exception's class, a redacted message bounded to 1,000 bytes
-- (pybatch never writes a connection string, a password or a job parameter value into it),
-- and the SQLSTATE, constraint, table and column where the server named them. They are
-- written once, in the unit of work that ends the row FAILED, and read by `pybatch show`.
--
-- Locks: ADD COLUMN of a nullable column without a default changes the catalog only (no
-- rewrite, no scan) under a short ACCESS EXCLUSIVE lock, within the migrator's lock timeout.
-- The CHECK constraints are added NOT VALID (no scan while the lock is held) and validated
-- by migration 0010 in a transaction of its own, under SHARE UPDATE EXCLUSIVE, which lets
-- running jobs read and write.

ALTER TABLE pybatch.job_execution
ADD COLUMN failure_error_class TEXT COLLATE "C",
ADD COLUMN failure_message TEXT,
ADD COLUMN failure_sqlstate TEXT COLLATE "C",
ADD COLUMN failure_constraint TEXT COLLATE "C",
ADD COLUMN failure_table TEXT COLLATE "C",
ADD COLUMN failure_column TEXT COLLATE "C";

ALTER TABLE pybatch.job_execution
ADD CONSTRAINT job_execution_failure_error_class_length
CHECK (pg_catalog.OCTET_LENGTH(failure_error_class) BETWEEN 1 AND 200) NOT VALID,
ADD CONSTRAINT job_execution_failure_message_length
CHECK (pg_catalog.OCTET_LENGTH(failure_message) <= 1000) NOT VALID,
ADD CONSTRAINT job_execution_failure_sqlstate_format
CHECK (failure_sqlstate ~ '^[0-9A-Z]{5}$') NOT VALID,
-- Server identifiers are at most 63 bytes (NAMEDATALEN - 1).
ADD CONSTRAINT job_execution_failure_names_length
CHECK (
    pg_catalog.OCTET_LENGTH(failure_constraint) BETWEEN 1 AND 63
    AND pg_catalog.OCTET_LENGTH(failure_table) BETWEEN 1 AND 63
    AND pg_catalog.OCTET_LENGTH(failure_column) BETWEEN 1 AND 63
) NOT VALID,
-- A reason has a class and a message; the server's names only come with them.
ADD CONSTRAINT job_execution_failure_reason_whole
CHECK (
    (failure_error_class IS NULL) = (failure_message IS NULL)
    AND (
        failure_error_class IS NOT NULL
        OR COALESCE(
            failure_sqlstate, failure_constraint, failure_table, failure_column
        ) IS NULL
    )
) NOT VALID;

COMMENT ON COLUMN pybatch.job_execution.failure_error_class IS
'Class of the exception that failed it (module-qualified unless a builtin); NULL if none.';
COMMENT ON COLUMN pybatch.job_execution.failure_message IS
'The exception message, redacted (no DSN, password or parameter value), at most 1000 bytes.';
COMMENT ON COLUMN pybatch.job_execution.failure_sqlstate IS
'SQLSTATE of the failure, when the server sent one.';
COMMENT ON COLUMN pybatch.job_execution.failure_constraint IS
'The constraint the server named in its diagnostics, if any.';
COMMENT ON COLUMN pybatch.job_execution.failure_table IS
'The table the server named in its diagnostics, if any.';
COMMENT ON COLUMN pybatch.job_execution.failure_column IS
'The column the server named in its diagnostics, if any.';

ALTER TABLE pybatch.step_execution
ADD COLUMN failure_error_class TEXT COLLATE "C",
ADD COLUMN failure_message TEXT,
ADD COLUMN failure_sqlstate TEXT COLLATE "C",
ADD COLUMN failure_constraint TEXT COLLATE "C",
ADD COLUMN failure_table TEXT COLLATE "C",
ADD COLUMN failure_column TEXT COLLATE "C";

ALTER TABLE pybatch.step_execution
ADD CONSTRAINT step_execution_failure_error_class_length
CHECK (pg_catalog.OCTET_LENGTH(failure_error_class) BETWEEN 1 AND 200) NOT VALID,
ADD CONSTRAINT step_execution_failure_message_length
CHECK (pg_catalog.OCTET_LENGTH(failure_message) <= 1000) NOT VALID,
ADD CONSTRAINT step_execution_failure_sqlstate_format
CHECK (failure_sqlstate ~ '^[0-9A-Z]{5}$') NOT VALID,
-- Server identifiers are at most 63 bytes (NAMEDATALEN - 1).
ADD CONSTRAINT step_execution_failure_names_length
CHECK (
    pg_catalog.OCTET_LENGTH(failure_constraint) BETWEEN 1 AND 63
    AND pg_catalog.OCTET_LENGTH(failure_table) BETWEEN 1 AND 63
    AND pg_catalog.OCTET_LENGTH(failure_column) BETWEEN 1 AND 63
) NOT VALID,
-- A reason has a class and a message; the server's names only come with them.
ADD CONSTRAINT step_execution_failure_reason_whole
CHECK (
    (failure_error_class IS NULL) = (failure_message IS NULL)
    AND (
        failure_error_class IS NOT NULL
        OR COALESCE(
            failure_sqlstate, failure_constraint, failure_table, failure_column
        ) IS NULL
    )
) NOT VALID;

COMMENT ON COLUMN pybatch.step_execution.failure_error_class IS
'Class of the exception that failed it (module-qualified unless a builtin); NULL if none.';
COMMENT ON COLUMN pybatch.step_execution.failure_message IS
'The exception message, redacted (no DSN, password or parameter value), at most 1000 bytes.';
COMMENT ON COLUMN pybatch.step_execution.failure_sqlstate IS
'SQLSTATE of the failure, when the server sent one.';
COMMENT ON COLUMN pybatch.step_execution.failure_constraint IS
'The constraint the server named in its diagnostics, if any.';
COMMENT ON COLUMN pybatch.step_execution.failure_table IS
'The table the server named in its diagnostics, if any.';
COMMENT ON COLUMN pybatch.step_execution.failure_column IS
'The column the server named in its diagnostics, if any.';
