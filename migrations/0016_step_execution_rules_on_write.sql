-- Migration: the rules of step_execution run when their columns are written, not at every
-- chunk commit.
--
-- Why: a chunk commit is one UPDATE of the step's row (its counters, checkpoint, updated_at and
-- version). PostgreSQL evaluates every CHECK constraint of a table on every UPDATE of a row,
-- whichever columns it writes, and rebuilds each CHECK expression from its stored text at
-- every execution: the ten CHECKs of step_execution cost more server time than the rest of the
-- UPDATE (docs/architecture.md, "Chunk commit and the step_execution constraints", has the
-- figures), yet a chunk writes none of the columns they guard but updated_at. A constraint
-- trigger declared `AFTER INSERT OR UPDATE OF <columns>` runs only when a statement writes one
-- of its columns: one such trigger, step_execution_rules, watches every column the ten rules
-- read and checks them all in one call (one call per row written: a trigger per rule would
-- cost ten calls per new step and most of them again per transition). The one rule a chunk's
-- write can break, updated_at >= created_at, stays a CHECK of its own.
--
-- No rule is lost or weakened: the trigger refuses exactly what the CHECKs refused (a rule is
-- false; NULL passes, as in a CHECK), at the end of the statement that wrote the row, with
-- SQLSTATE 23514 and the name of the CHECK the broken rule was, as before (the first broken
-- rule in the order below, when a row breaks several).
--
-- Existing rows satisfy every rule: the CHECKs dropped here were validated, and are dropped in
-- the transaction that creates their triggers. step_execution_updated_after_created is added
-- NOT VALID (what it checks was part of step_execution_timestamp_order) and validated by the
-- next migration in a transaction of its own. Locks: dropping a CHECK takes ACCESS EXCLUSIVE
-- on step_execution until this migration commits; nothing is rewritten or scanned.
--
-- Lint: squawk's ban-drop-constraint is silenced for this file: every CHECK it drops is
-- replaced, in the same transaction, by the rule trigger, which names it when it refuses.
-- squawk-ignore-file ban-drop-constraint

CREATE FUNCTION pybatch.check_step_execution_rules()
RETURNS TRIGGER
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    broken TEXT;
BEGIN
    -- The first rule the row breaks, by the name of the CHECK it was. A rule that is NULL
    -- passes, as in a CHECK (NOT NULL is NULL, and CASE takes only a true WHEN).
    broken := CASE
        WHEN NOT (NEW.id > 0) THEN 'step_execution_id_positive'
        -- A STARTING, STARTED, STOPPING or UNKNOWN step has no end; the others have one.
        WHEN NOT (
            (
                NEW.status NOT IN ('STARTING', 'STARTED', 'STOPPING', 'UNKNOWN')
                OR NEW.ended_at IS NULL
            )
            AND (
                NEW.status NOT IN ('STOPPED', 'FAILED', 'COMPLETED', 'ABANDONED')
                OR NEW.ended_at IS NOT NULL
            )
        ) THEN 'step_execution_end_state'
        WHEN NOT (
            (NEW.started_at IS NULL OR NEW.started_at >= NEW.created_at)
            AND (
                NEW.ended_at IS NULL
                OR NEW.ended_at >= COALESCE(NEW.started_at, NEW.created_at)
            )
        ) THEN 'step_execution_timestamp_order'
        WHEN NOT (NEW.status <> 'FAILED' OR NEW.failure_category IS NOT NULL)
            THEN 'step_execution_failed_has_failure'
        WHEN NOT ((NEW.failure_category IS NULL) = (NEW.failure_id IS NULL))
            THEN 'step_execution_failure_shape'
        WHEN NOT (pg_catalog.OCTET_LENGTH(NEW.failure_error_class) BETWEEN 1 AND 200)
            THEN 'step_execution_failure_error_class_length'
        WHEN NOT (pg_catalog.OCTET_LENGTH(NEW.failure_message) <= 1000)
            THEN 'step_execution_failure_message_length'
        WHEN NOT (NEW.failure_sqlstate ~ '^[0-9A-Z]{5}$')
            THEN 'step_execution_failure_sqlstate_format'
        -- Server identifiers are at most 63 bytes (NAMEDATALEN - 1).
        WHEN NOT (
            pg_catalog.OCTET_LENGTH(NEW.failure_constraint) BETWEEN 1 AND 63
            AND pg_catalog.OCTET_LENGTH(NEW.failure_table) BETWEEN 1 AND 63
            AND pg_catalog.OCTET_LENGTH(NEW.failure_column) BETWEEN 1 AND 63
        ) THEN 'step_execution_failure_names_length'
        -- A reason has a class and a message; the server's names only come with them.
        WHEN NOT (
            (NEW.failure_error_class IS NULL) = (NEW.failure_message IS NULL)
            AND (
                NEW.failure_error_class IS NOT NULL
                OR COALESCE(
                    NEW.failure_sqlstate,
                    NEW.failure_constraint,
                    NEW.failure_table,
                    NEW.failure_column
                ) IS NULL
            )
        ) THEN 'step_execution_failure_reason_whole'
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

COMMENT ON FUNCTION pybatch.check_step_execution_rules() IS
'Constraint trigger body: refuses a step_execution row that breaks one of the rules that were '
'its CHECKs, named as that CHECK was (SQLSTATE 23514).';

ALTER TABLE pybatch.step_execution
DROP CONSTRAINT step_execution_id_positive,
DROP CONSTRAINT step_execution_end_state,
DROP CONSTRAINT step_execution_timestamp_order,
DROP CONSTRAINT step_execution_failed_has_failure,
DROP CONSTRAINT step_execution_failure_shape,
DROP CONSTRAINT step_execution_failure_error_class_length,
DROP CONSTRAINT step_execution_failure_message_length,
DROP CONSTRAINT step_execution_failure_sqlstate_format,
DROP CONSTRAINT step_execution_failure_names_length,
DROP CONSTRAINT step_execution_failure_reason_whole,
ADD CONSTRAINT step_execution_updated_after_created CHECK (updated_at >= created_at) NOT VALID;

-- Every column a rule reads; not the ones a chunk commit writes (counters, checkpoint,
-- context, fault state, updated_at, version).
CREATE CONSTRAINT TRIGGER step_execution_rules
AFTER INSERT OR UPDATE OF
id,
status,
created_at,
started_at,
ended_at,
failure_category,
failure_id,
failure_error_class,
failure_message,
failure_sqlstate,
failure_constraint,
failure_table,
failure_column
ON pybatch.step_execution
FOR EACH ROW EXECUTE FUNCTION pybatch.check_step_execution_rules();

COMMENT ON TABLE pybatch.step_execution IS
'Step attempts of a job execution and their durable chunk state (counters, checkpoint, '
'context, retry and skip counts, fault state). The row is the lock of step transitions, '
'partition aggregation and assignment, and fault reservations. Single-column rules are the '
'column domains (checked only when a column is written); cross-column rules are checked by '
'the constraint trigger step_execution_rules when a column they read is written, but '
'step_execution_updated_after_created, a CHECK.';
