-- Migration: the rules of step_partition run in one trigger call per row written, not as
-- 21 CHECKs prepared again at every write.
--
-- Why: a partition's claim, its end and each renewal of its worker's lease is one UPDATE of
-- its step_partition row. PostgreSQL evaluates every CHECK of a table on every UPDATE of a
-- row and rebuilds each CHECK expression from its stored text at every execution of the
-- statement, prepared or not: the 21 CHECKs of step_partition cost a claim and an end about
-- 60 to 90 us of server CPU each, more than the UPDATE itself (docs/architecture.md, "Rules
-- that run when their columns are written", has the figures). A constraint trigger's body is
-- compiled once per session, so one trigger that checks every rule in one call costs a
-- fraction of that. Migration 0016 did the same for step_execution.
--
-- No rule is lost or weakened: the trigger refuses exactly what the CHECKs refused (a rule
-- that is false; NULL passes, as in a CHECK), at the end of the statement that wrote the row,
-- with SQLSTATE 23514 and the name of the CHECK the broken rule was. When a row breaks several
-- rules it names the first in name order, the order in which PostgreSQL evaluated the CHECKs.
-- The trigger watches every column a rule reads; only step_execution_id, which no rule reads,
-- is left out.
--
-- Existing rows satisfy every rule: the CHECKs dropped here were validated, and are dropped in
-- the transaction that creates the trigger. Locks: dropping a CHECK takes ACCESS EXCLUSIVE on
-- step_partition until this migration commits (plans, claims, partition ends and lease
-- renewals wait; chunk commits go on); nothing is rewritten or scanned.
--
-- Lint: squawk's ban-drop-constraint is silenced for this file: every CHECK it drops is
-- replaced, in the same transaction, by the rule trigger, which names it when it refuses.
-- squawk-ignore-file ban-drop-constraint

CREATE FUNCTION pybatch.check_step_partition_rules()
RETURNS TRIGGER
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    broken TEXT;
BEGIN
    -- The first rule the row breaks, by the name of the CHECK it was, in name order. A rule
    -- that is NULL passes, as in a CHECK (NOT NULL is NULL, and CASE takes only a true WHEN).
    broken := CASE
        WHEN NOT (NEW.commit_count >= 0)
            THEN 'step_partition_commit_count_nonnegative'
        WHEN NOT (pg_catalog.OCTET_LENGTH(NEW.context_checksum) = 32)
            THEN 'step_partition_context_checksum_length'
        WHEN NOT (NEW.context_format > 0)
            THEN 'step_partition_context_format_positive'
        WHEN NOT (pg_catalog.JSONB_TYPEOF(NEW.context_payload) = 'object')
            THEN 'step_partition_context_payload_object'
        WHEN NOT (pg_catalog.OCTET_LENGTH(NEW.context_schema) BETWEEN 1 AND 128)
            THEN 'step_partition_context_schema_length'
        WHEN NOT (NEW.context_schema_version > 0)
            THEN 'step_partition_context_schema_version_positive'
        WHEN NOT (pg_catalog.OCTET_LENGTH(NEW.exit_code) BETWEEN 1 AND 64)
            THEN 'step_partition_exit_code_length'
        WHEN NOT (NEW.filter_count >= 0)
            THEN 'step_partition_filter_count_nonnegative'
        WHEN NOT (NEW.id > 0)
            THEN 'step_partition_id_positive'
        WHEN NOT (pg_catalog.OCTET_LENGTH(NEW.partition_key) BETWEEN 1 AND 128)
            THEN 'step_partition_partition_key_length'
        WHEN NOT (NEW.partition_ordinal BETWEEN 1 AND 1024)
            THEN 'step_partition_partition_ordinal_range'
        WHEN NOT (NEW.processed_count >= 0)
            THEN 'step_partition_processed_count_nonnegative'
        WHEN NOT (NEW.read_count >= 0)
            THEN 'step_partition_read_count_nonnegative'
        WHEN NOT (NEW.rollback_count >= 0)
            THEN 'step_partition_rollback_count_nonnegative'
        WHEN NOT (
            NEW.status IN (
                'STARTING', 'STARTED', 'STOPPING', 'STOPPED',
                'FAILED', 'COMPLETED', 'ABANDONED', 'UNKNOWN'
            )
        ) THEN 'step_partition_status_valid'
        WHEN NOT (NEW.version >= 0)
            THEN 'step_partition_version_nonnegative'
        -- A lease belongs to an owner.
        WHEN NOT (NEW.worker_lease_expires_at IS NULL OR NEW.worker_owner_token IS NOT NULL)
            THEN 'step_partition_worker_lease_has_owner'
        WHEN NOT (pg_catalog.OCTET_LENGTH(NEW.worker_owner_token) = 16)
            THEN 'step_partition_worker_owner_token_length'
        -- Only a STARTED partition has a worker that owns it.
        WHEN NOT (NEW.worker_owner_token IS NULL OR NEW.status = 'STARTED')
            THEN 'step_partition_worker_owner_when_started'
        -- A partition has a worker from its claim on: STARTING means none yet.
        WHEN NOT ((NEW.status = 'STARTING') = (NEW.worker_step_execution_id IS NULL))
            THEN 'step_partition_worker_shape'
        WHEN NOT (NEW.write_count >= 0)
            THEN 'step_partition_write_count_nonnegative'
    END;
    IF broken IS NOT NULL THEN
        RAISE EXCEPTION 'new row for relation "%" violates check constraint "%"', TG_TABLE_NAME, broken
        USING
            ERRCODE = 'check_violation',
            CONSTRAINT = broken,
            SCHEMA = 'pybatch',
            TABLE = TG_TABLE_NAME;
    END IF;
    RETURN NULL;
END;
$$;

COMMENT ON FUNCTION pybatch.check_step_partition_rules() IS
'Constraint trigger body: refuses a step_partition row that breaks one of the rules that were '
'its CHECKs, named as that CHECK was (SQLSTATE 23514).';

ALTER TABLE pybatch.step_partition
DROP CONSTRAINT step_partition_commit_count_nonnegative,
DROP CONSTRAINT step_partition_context_checksum_length,
DROP CONSTRAINT step_partition_context_format_positive,
DROP CONSTRAINT step_partition_context_payload_object,
DROP CONSTRAINT step_partition_context_schema_length,
DROP CONSTRAINT step_partition_context_schema_version_positive,
DROP CONSTRAINT step_partition_exit_code_length,
DROP CONSTRAINT step_partition_filter_count_nonnegative,
DROP CONSTRAINT step_partition_id_positive,
DROP CONSTRAINT step_partition_partition_key_length,
DROP CONSTRAINT step_partition_partition_ordinal_range,
DROP CONSTRAINT step_partition_processed_count_nonnegative,
DROP CONSTRAINT step_partition_read_count_nonnegative,
DROP CONSTRAINT step_partition_rollback_count_nonnegative,
DROP CONSTRAINT step_partition_status_valid,
DROP CONSTRAINT step_partition_version_nonnegative,
DROP CONSTRAINT step_partition_worker_lease_has_owner,
DROP CONSTRAINT step_partition_worker_owner_token_length,
DROP CONSTRAINT step_partition_worker_owner_when_started,
DROP CONSTRAINT step_partition_worker_shape,
DROP CONSTRAINT step_partition_write_count_nonnegative;

-- Every column a rule reads (all but step_execution_id).
CREATE CONSTRAINT TRIGGER step_partition_rules
AFTER INSERT OR UPDATE OF
id,
worker_step_execution_id,
partition_key,
partition_ordinal,
status,
exit_code,
read_count,
processed_count,
write_count,
filter_count,
commit_count,
rollback_count,
context_format,
context_schema,
context_schema_version,
context_payload,
context_checksum,
version,
worker_owner_token,
worker_lease_expires_at
ON pybatch.step_partition
FOR EACH ROW EXECUTE FUNCTION pybatch.check_step_partition_rules();

COMMENT ON TABLE pybatch.step_partition IS
'Durable local-partition plans: one row per partition of a parent (manager) step; id order is '
'ordinal order within a plan. Its rules are checked by the constraint trigger '
'step_partition_rules when a column they read is written.';
