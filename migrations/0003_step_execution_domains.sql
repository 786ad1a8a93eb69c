-- Migration 0003: the single-column rules of step_execution become domains (schema version 3).
--
-- Why: every chunk commit is one UPDATE of a step_execution row, and PostgreSQL evaluates
-- every CHECK constraint of a table on every UPDATE of it, whichever columns change, preparing
-- each expression again at every execution. With the 38 CHECKs of migration 0001 that cost
-- more server time than the rest of the commit (docs/architecture.md, "Chunk commit and
-- the step_execution constraints", has the figures). A domain's CHECK runs only when a value is
-- assigned to a column of that domain, and the domain's expression is prepared once per
-- session, so the chunk commit now pays only for the columns it writes, plus the four
-- cross-column CHECKs and id_positive that stay on the table.
--
-- No rule is lost: each dropped CHECK of 0001 is replaced by the domain that enforces the
-- same predicate on the same column (an enum domain lists every value the old CHECK listed).
-- A violation now names the domain's constraint (<domain>_check style names below) instead
-- of step_execution_<column>_<rule>; pybatch maps only unique-constraint names to errors, so
-- no error changes class.
--
-- Existing data: ALTER COLUMN ... TYPE to a domain over the same base type keeps every value
-- and verifies it against the domain (one table rewrite for the single ALTER TABLE below,
-- under an ACCESS EXCLUSIVE lock on step_execution; see docs/dba.md). Rows written under 0001
-- already satisfied the same CHECKs, so nothing can fail here. Column defaults, identity,
-- foreign keys, unique constraints and indexes are unchanged.
--
-- The domains are named for the value they hold, not for the table, so later tables can
-- use them; only step_execution does for now.

-- ---------------------------------------------------------------------------------------------
-- domains
-- ---------------------------------------------------------------------------------------------

-- Lint: sqlfluff parses the keyword VALUE of a domain CHECK as a column reference (CP02, RF04)
-- and a domain used as a column type as a data type to upper-case (CP05); both are suppressed
-- for this file's DDL, which is written as PostgreSQL documents it.
-- noqa: disable=CP02,RF04,CP05

CREATE DOMAIN pybatch.batch_status AS TEXT COLLATE "C"
CONSTRAINT batch_status_valid CHECK (
    VALUE IN (
        'STARTING', 'STARTED', 'STOPPING', 'STOPPED',
        'FAILED', 'COMPLETED', 'ABANDONED', 'UNKNOWN'
    )
);
COMMENT ON DOMAIN pybatch.batch_status IS
'BatchStatus code: one of the eight statuses the contract defines.';

CREATE DOMAIN pybatch.failure_category AS TEXT COLLATE "C"
CONSTRAINT failure_category_valid CHECK (
    VALUE IN (
        'INVALID_DEFINITION', 'DUPLICATE_EXECUTION', 'ILLEGAL_TRANSITION',
        'TRANSIENT_INFRASTRUCTURE', 'PERMANENT_INFRASTRUCTURE', 'USER_COMPONENT',
        'CANCELLED', 'SERIALIZATION', 'INVARIANT', 'OPTIMISTIC_CONFLICT', 'TIMEOUT',
        'UNSUPPORTED_CAPABILITY', 'UNKNOWN_COMMIT', 'SHUTDOWN_INCOMPLETE', 'STALE_RECOVERED'
    )
);
COMMENT ON DOMAIN pybatch.failure_category IS
'FailureCategory code: one of the fifteen categories the contract defines.';

CREATE DOMAIN pybatch.name_128 AS TEXT COLLATE "C"
CONSTRAINT name_128_length CHECK (OCTET_LENGTH(VALUE) BETWEEN 1 AND 128);
COMMENT ON DOMAIN pybatch.name_128 IS
'A name of 1 to 128 bytes (step names, node ids, state schema ids).';

CREATE DOMAIN pybatch.code_64 AS TEXT COLLATE "C"
CONSTRAINT code_64_length CHECK (OCTET_LENGTH(VALUE) BETWEEN 1 AND 64);
COMMENT ON DOMAIN pybatch.code_64 IS
'A code of 1 to 64 bytes (exit codes).';

CREATE DOMAIN pybatch.nonnegative_count AS BIGINT
CONSTRAINT nonnegative_count_nonnegative CHECK (VALUE >= 0);
COMMENT ON DOMAIN pybatch.nonnegative_count IS
'A counter or optimistic version: never below zero.';

CREATE DOMAIN pybatch.positive_id AS BIGINT
CONSTRAINT positive_id_positive CHECK (VALUE > 0);
COMMENT ON DOMAIN pybatch.positive_id IS
'A caller-supplied identifier (FailureId): above zero.';

CREATE DOMAIN pybatch.state_format AS SMALLINT
CONSTRAINT state_format_positive CHECK (VALUE > 0);
COMMENT ON DOMAIN pybatch.state_format IS
'A state envelope format number: above zero.';

CREATE DOMAIN pybatch.state_schema_version AS INTEGER
CONSTRAINT state_schema_version_positive CHECK (VALUE > 0);
COMMENT ON DOMAIN pybatch.state_schema_version IS
'A state schema version: above zero.';

CREATE DOMAIN pybatch.jsonb_document AS JSONB
CONSTRAINT jsonb_document_object CHECK (JSONB_TYPEOF(VALUE) = 'object');
COMMENT ON DOMAIN pybatch.jsonb_document IS
'A JSON document whose top level is an object (state payloads).';

CREATE DOMAIN pybatch.fault_state_format AS SMALLINT
CONSTRAINT fault_state_format_valid CHECK (VALUE = 1);
COMMENT ON DOMAIN pybatch.fault_state_format IS
'The fault-state envelope format: exactly 1.';

CREATE DOMAIN pybatch.fault_state_schema_version AS INTEGER
CONSTRAINT fault_state_schema_version_valid CHECK (VALUE = 1);
COMMENT ON DOMAIN pybatch.fault_state_schema_version IS
'The fault-state envelope schema version: exactly 1.';

CREATE DOMAIN pybatch.sha256_digest AS BYTEA
CONSTRAINT sha256_digest_length CHECK (OCTET_LENGTH(VALUE) = 32);
COMMENT ON DOMAIN pybatch.sha256_digest IS
'A SHA-256 digest: exactly 32 bytes.';

-- ---------------------------------------------------------------------------------------------
-- step_execution: columns onto the domains, the replaced CHECKs dropped, in one rewrite
-- ---------------------------------------------------------------------------------------------

-- Kept as table CHECKs: step_execution_id_positive (an identity column cannot be of a domain
-- type), step_execution_failure_shape, step_execution_timestamp_order,
-- step_execution_end_state and step_execution_failed_has_failure (cross-column rules).
ALTER TABLE pybatch.step_execution
DROP CONSTRAINT step_execution_step_name_length,
DROP CONSTRAINT step_execution_step_logical_id_length,
DROP CONSTRAINT step_execution_status_valid,
DROP CONSTRAINT step_execution_exit_code_length,
DROP CONSTRAINT step_execution_read_count_nonnegative,
DROP CONSTRAINT step_execution_processed_count_nonnegative,
DROP CONSTRAINT step_execution_write_count_nonnegative,
DROP CONSTRAINT step_execution_filter_count_nonnegative,
DROP CONSTRAINT step_execution_commit_count_nonnegative,
DROP CONSTRAINT step_execution_rollback_count_nonnegative,
DROP CONSTRAINT step_execution_checkpoint_format_positive,
DROP CONSTRAINT step_execution_checkpoint_schema_length,
DROP CONSTRAINT step_execution_checkpoint_schema_version_positive,
DROP CONSTRAINT step_execution_checkpoint_payload_object,
DROP CONSTRAINT step_execution_context_format_positive,
DROP CONSTRAINT step_execution_context_schema_length,
DROP CONSTRAINT step_execution_context_schema_version_positive,
DROP CONSTRAINT step_execution_context_payload_object,
DROP CONSTRAINT step_execution_failure_category_valid,
DROP CONSTRAINT step_execution_failure_id_positive,
DROP CONSTRAINT step_execution_version_nonnegative,
DROP CONSTRAINT step_execution_read_retry_count_nonnegative,
DROP CONSTRAINT step_execution_process_retry_count_nonnegative,
DROP CONSTRAINT step_execution_write_retry_count_nonnegative,
DROP CONSTRAINT step_execution_read_skip_count_nonnegative,
DROP CONSTRAINT step_execution_process_skip_count_nonnegative,
DROP CONSTRAINT step_execution_write_skip_count_nonnegative,
DROP CONSTRAINT step_execution_no_rollback_count_nonnegative,
DROP CONSTRAINT step_execution_fault_state_format_valid,
DROP CONSTRAINT step_execution_fault_state_schema_length,
DROP CONSTRAINT step_execution_fault_state_schema_version_valid,
DROP CONSTRAINT step_execution_fault_state_payload_object,
DROP CONSTRAINT step_execution_fault_state_checksum_length,
ALTER COLUMN step_name TYPE pybatch.name_128,
ALTER COLUMN step_logical_id TYPE pybatch.name_128,
ALTER COLUMN status TYPE pybatch.batch_status,
ALTER COLUMN exit_code TYPE pybatch.code_64,
ALTER COLUMN read_count TYPE pybatch.nonnegative_count,
ALTER COLUMN processed_count TYPE pybatch.nonnegative_count,
ALTER COLUMN write_count TYPE pybatch.nonnegative_count,
ALTER COLUMN filter_count TYPE pybatch.nonnegative_count,
ALTER COLUMN commit_count TYPE pybatch.nonnegative_count,
ALTER COLUMN rollback_count TYPE pybatch.nonnegative_count,
ALTER COLUMN checkpoint_format TYPE pybatch.state_format,
ALTER COLUMN checkpoint_schema TYPE pybatch.name_128,
ALTER COLUMN checkpoint_schema_version TYPE pybatch.state_schema_version,
ALTER COLUMN checkpoint_payload TYPE pybatch.jsonb_document,
ALTER COLUMN context_format TYPE pybatch.state_format,
ALTER COLUMN context_schema TYPE pybatch.name_128,
ALTER COLUMN context_schema_version TYPE pybatch.state_schema_version,
ALTER COLUMN context_payload TYPE pybatch.jsonb_document,
ALTER COLUMN failure_category TYPE pybatch.failure_category,
ALTER COLUMN failure_id TYPE pybatch.positive_id,
ALTER COLUMN version TYPE pybatch.nonnegative_count,
ALTER COLUMN read_retry_count TYPE pybatch.nonnegative_count,
ALTER COLUMN process_retry_count TYPE pybatch.nonnegative_count,
ALTER COLUMN write_retry_count TYPE pybatch.nonnegative_count,
ALTER COLUMN read_skip_count TYPE pybatch.nonnegative_count,
ALTER COLUMN process_skip_count TYPE pybatch.nonnegative_count,
ALTER COLUMN write_skip_count TYPE pybatch.nonnegative_count,
ALTER COLUMN no_rollback_count TYPE pybatch.nonnegative_count,
ALTER COLUMN fault_state_format TYPE pybatch.fault_state_format,
ALTER COLUMN fault_state_schema TYPE pybatch.name_128,
ALTER COLUMN fault_state_schema_version TYPE pybatch.fault_state_schema_version,
ALTER COLUMN fault_state_payload TYPE pybatch.jsonb_document,
ALTER COLUMN fault_state_checksum TYPE pybatch.sha256_digest;

COMMENT ON TABLE pybatch.step_execution IS
'Step attempts of a job execution and their durable chunk state (counters, checkpoint, '
'context, retry and skip counts, fault state). The row is the lock of step transitions, '
'partition aggregation and assignment, and fault reservations. Single-column rules are the '
'column domains (checked only when a column is written); cross-column rules are CHECKs.';
-- noqa: enable=CP02,RF04,CP05
