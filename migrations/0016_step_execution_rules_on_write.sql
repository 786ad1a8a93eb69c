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
-- of its columns, so each rule becomes one, named as the CHECK it replaces, and the one rule
-- a chunk's write can break, updated_at >= created_at, stays a CHECK of its own.
--
-- No rule is lost or weakened: each trigger refuses exactly what its CHECK refused (the rule is
-- false; NULL passes, as in a CHECK), at the end of the statement that wrote the row, with
-- SQLSTATE 23514 and the constraint's name, as before.
--
-- Existing rows satisfy every rule: the CHECKs dropped here were validated, and are dropped in
-- the transaction that creates their triggers. step_execution_updated_after_created is added
-- NOT VALID (what it checks was part of step_execution_timestamp_order) and validated by the
-- next migration in a transaction of its own. Locks: dropping a CHECK takes ACCESS EXCLUSIVE
-- on step_execution until this migration commits; nothing is rewritten or scanned.
--
-- Lint: squawk's ban-drop-constraint is silenced for this file: every CHECK it drops is
-- replaced, in the same transaction, by the trigger of the same name.
-- squawk-ignore-file ban-drop-constraint

CREATE FUNCTION pybatch.check_step_execution_rule()
RETURNS TRIGGER
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    holds BOOLEAN;
BEGIN
    -- The rule is chosen by the trigger's name, which is the rule's. NULL passes, as in a
    -- CHECK; a trigger of another name refuses every row (fails closed).
    holds := CASE TG_NAME
        WHEN 'step_execution_id_positive' THEN NEW.id > 0
        -- A STARTING, STARTED, STOPPING or UNKNOWN step has no end; the others have one.
        WHEN 'step_execution_end_state' THEN
            (
                NEW.status NOT IN ('STARTING', 'STARTED', 'STOPPING', 'UNKNOWN')
                OR NEW.ended_at IS NULL
            )
            AND (
                NEW.status NOT IN ('STOPPED', 'FAILED', 'COMPLETED', 'ABANDONED')
                OR NEW.ended_at IS NOT NULL
            )
        WHEN 'step_execution_timestamp_order' THEN
            (NEW.started_at IS NULL OR NEW.started_at >= NEW.created_at)
            AND (
                NEW.ended_at IS NULL
                OR NEW.ended_at >= COALESCE(NEW.started_at, NEW.created_at)
            )
        WHEN 'step_execution_failed_has_failure' THEN
            NEW.status <> 'FAILED' OR NEW.failure_category IS NOT NULL
        WHEN 'step_execution_failure_shape' THEN
            (NEW.failure_category IS NULL) = (NEW.failure_id IS NULL)
        WHEN 'step_execution_failure_error_class_length' THEN
            pg_catalog.OCTET_LENGTH(NEW.failure_error_class) BETWEEN 1 AND 200
        WHEN 'step_execution_failure_message_length' THEN
            pg_catalog.OCTET_LENGTH(NEW.failure_message) <= 1000
        WHEN 'step_execution_failure_sqlstate_format' THEN
            NEW.failure_sqlstate ~ '^[0-9A-Z]{5}$'
        -- Server identifiers are at most 63 bytes (NAMEDATALEN - 1).
        WHEN 'step_execution_failure_names_length' THEN
            pg_catalog.OCTET_LENGTH(NEW.failure_constraint) BETWEEN 1 AND 63
            AND pg_catalog.OCTET_LENGTH(NEW.failure_table) BETWEEN 1 AND 63
            AND pg_catalog.OCTET_LENGTH(NEW.failure_column) BETWEEN 1 AND 63
        -- A reason has a class and a message; the server's names only come with them.
        WHEN 'step_execution_failure_reason_whole' THEN
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
        ELSE FALSE
    END;
    IF NOT holds THEN
        RAISE EXCEPTION 'new row for relation "%" violates check constraint "%"', TG_TABLE_NAME, TG_NAME
        USING
            ERRCODE = 'check_violation',
            CONSTRAINT = TG_NAME,
            SCHEMA = 'pybatch',
            TABLE = TG_TABLE_NAME;
    END IF;
    RETURN NULL;
END;
$$;

COMMENT ON FUNCTION pybatch.check_step_execution_rule() IS
'Constraint trigger body: refuses a step_execution row that breaks the rule its trigger is '
'named for, as a CHECK of that name would (SQLSTATE 23514).';

-- Each dropped CHECK is replaced by the constraint trigger of the same name below, in this
-- transaction: no client ever sees the table without its rule.
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
-- Every write of updated_at (every chunk commit) is checked against this one.
ADD CONSTRAINT step_execution_updated_after_created CHECK (updated_at >= created_at) NOT VALID;

-- Each trigger lists the columns its rule reads: it runs when an INSERT, or an UPDATE that
-- writes one of them, ends.
CREATE CONSTRAINT TRIGGER step_execution_id_positive
AFTER INSERT OR UPDATE OF id ON pybatch.step_execution
FOR EACH ROW EXECUTE FUNCTION pybatch.check_step_execution_rule();

CREATE CONSTRAINT TRIGGER step_execution_end_state
AFTER INSERT OR UPDATE OF status, ended_at ON pybatch.step_execution
FOR EACH ROW EXECUTE FUNCTION pybatch.check_step_execution_rule();

CREATE CONSTRAINT TRIGGER step_execution_timestamp_order
AFTER INSERT OR UPDATE OF created_at, started_at, ended_at ON pybatch.step_execution
FOR EACH ROW EXECUTE FUNCTION pybatch.check_step_execution_rule();

CREATE CONSTRAINT TRIGGER step_execution_failed_has_failure
AFTER INSERT OR UPDATE OF status, failure_category ON pybatch.step_execution
FOR EACH ROW EXECUTE FUNCTION pybatch.check_step_execution_rule();

CREATE CONSTRAINT TRIGGER step_execution_failure_shape
AFTER INSERT OR UPDATE OF failure_category, failure_id ON pybatch.step_execution
FOR EACH ROW EXECUTE FUNCTION pybatch.check_step_execution_rule();

CREATE CONSTRAINT TRIGGER step_execution_failure_error_class_length
AFTER INSERT OR UPDATE OF failure_error_class ON pybatch.step_execution
FOR EACH ROW EXECUTE FUNCTION pybatch.check_step_execution_rule();

CREATE CONSTRAINT TRIGGER step_execution_failure_message_length
AFTER INSERT OR UPDATE OF failure_message ON pybatch.step_execution
FOR EACH ROW EXECUTE FUNCTION pybatch.check_step_execution_rule();

CREATE CONSTRAINT TRIGGER step_execution_failure_sqlstate_format
AFTER INSERT OR UPDATE OF failure_sqlstate ON pybatch.step_execution
FOR EACH ROW EXECUTE FUNCTION pybatch.check_step_execution_rule();

CREATE CONSTRAINT TRIGGER step_execution_failure_names_length
AFTER INSERT OR UPDATE OF failure_constraint, failure_table, failure_column
ON pybatch.step_execution
FOR EACH ROW EXECUTE FUNCTION pybatch.check_step_execution_rule();

CREATE CONSTRAINT TRIGGER step_execution_failure_reason_whole
AFTER INSERT OR UPDATE OF
failure_error_class,
failure_message,
failure_sqlstate,
failure_constraint,
failure_table,
failure_column
ON pybatch.step_execution
FOR EACH ROW EXECUTE FUNCTION pybatch.check_step_execution_rule();

COMMENT ON TABLE pybatch.step_execution IS
'Step attempts of a job execution and their durable chunk state (counters, checkpoint, '
'context, retry and skip counts, fault state). The row is the lock of step transitions, '
'partition aggregation and assignment, and fault reservations. Single-column rules are the '
'column domains (checked only when a column is written); cross-column rules are constraint '
'triggers on the columns they read (checked only when one is written), but '
'step_execution_updated_after_created, a CHECK.';
