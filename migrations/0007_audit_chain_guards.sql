-- Migration 0007: the audit chain defends itself (schema version 7).
--
-- Until now the chain's integrity rested on the callers: any role allowed to update the head
-- could rewind it (every later append then collided with an existing link and failed), any
-- role allowed to insert links could add one past the head that nothing read, and any role
-- allowed to insert purge marks could excuse the deletion of a record no purge removed.
-- From this version the database enforces the chain's rules itself, whoever writes:
--
-- - a link may only be inserted as the next link after the head (seq = head seq + 1,
--   previous_digest = head digest), with a link digest that matches its fields and a content
--   digest that matches its record as it stands; inserting it advances the head in the same
--   statement, so a link never exists past the head;
-- - the head only ever moves to the link that follows it, and is never deleted;
-- - links and purge marks are insert-only (no UPDATE, DELETE or TRUNCATE);
-- - a purge mark must name an APPLY_PURGE retention action whose record counts cover it
--   (it deleted at least as many records of that kind as it marks), and the record it excuses
--   must be gone.
--
-- The functions are owned by the schema owner and run with its rights (SECURITY DEFINER,
-- with a fixed search_path), so the runtime role needs neither UPDATE on the head nor the
-- right to lock it: `append_audit_link` does the whole append. Violations are reported as
-- check violations (SQLSTATE 23514) naming the rule as their constraint.
--
-- Busy databases: creating functions and triggers takes a SHARE ROW EXCLUSIVE lock on the
-- three chain tables for the length of this transaction, and rewrites nothing; audit appends
-- wait for it (milliseconds), chunk commits never touch these tables. A process of the
-- previous version that appends an audit record after the upgrade has its append refused
-- (it advanced the head before inserting the link): upgrade the package with the schema.

CREATE FUNCTION pybatch.audit_chain_guard_link()
RETURNS TRIGGER
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    head_seq BIGINT;
    head_digest BYTEA;
    record_digest BYTEA;
BEGIN
    SELECT h.seq, h.link_digest INTO head_seq, head_digest
    FROM pybatch.audit_chain_head AS h
    WHERE h.singleton
    FOR UPDATE;
    IF NEW.seq IS DISTINCT FROM head_seq + 1
        OR NEW.previous_digest IS DISTINCT FROM head_digest THEN
        RAISE EXCEPTION USING
            ERRCODE = 'check_violation',
            CONSTRAINT = 'audit_chain_link_follows_head',
            MESSAGE = 'an audit link must directly follow the head of the chain',
            HINT = 'append links with pybatch.append_audit_link';
    END IF;
    IF NEW.link_digest IS DISTINCT FROM SHA256(
        NEW.previous_digest
        || INT8SEND(NEW.seq)
        || CONVERT_TO(NEW.record_kind, 'UTF8')
        || INT8SEND(NEW.record_id)
        || NEW.content_digest
    ) THEN
        RAISE EXCEPTION USING
            ERRCODE = 'check_violation',
            CONSTRAINT = 'audit_chain_link_digest_matches',
            MESSAGE = 'an audit link digest must match its fields';
    END IF;
    SELECT c.content_digest INTO record_digest
    FROM pybatch.audit_record_content AS c
    WHERE c.record_kind = NEW.record_kind AND c.record_id = NEW.record_id;
    IF record_digest IS NULL OR record_digest IS DISTINCT FROM NEW.content_digest THEN
        RAISE EXCEPTION USING
            ERRCODE = 'check_violation',
            CONSTRAINT = 'audit_chain_link_content_matches',
            MESSAGE = 'an audit link must digest an existing record as it stands';
    END IF;
    RETURN NEW;
END;
$$;

COMMENT ON FUNCTION pybatch.audit_chain_guard_link() IS
'Refuses a link that does not follow the head, or whose digests do not match.';

CREATE FUNCTION pybatch.audit_chain_advance_head()
RETURNS TRIGGER
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    UPDATE pybatch.audit_chain_head AS h
    SET seq = NEW.seq, link_digest = NEW.link_digest
    WHERE h.singleton;
    RETURN NULL;
END;
$$;

COMMENT ON FUNCTION pybatch.audit_chain_advance_head() IS
'Moves the head to the link just inserted, in the inserting statement.';

CREATE FUNCTION pybatch.audit_chain_guard_head()
RETURNS TRIGGER
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF TG_OP = 'UPDATE'
        AND NEW.singleton IS NOT DISTINCT FROM OLD.singleton
        AND NEW.seq IS NOT DISTINCT FROM OLD.seq + 1
        AND EXISTS (
            SELECT 1
            FROM pybatch.audit_chain AS c
            WHERE
                c.seq = NEW.seq
                AND c.previous_digest = OLD.link_digest
                AND c.link_digest = NEW.link_digest
                AND c.link_digest = SHA256(
                    c.previous_digest
                    || INT8SEND(c.seq)
                    || CONVERT_TO(c.record_kind, 'UTF8')
                    || INT8SEND(c.record_id)
                    || c.content_digest
                )
        ) THEN
        RETURN NEW;
    END IF;
    RAISE EXCEPTION USING
        ERRCODE = 'check_violation',
        CONSTRAINT = 'audit_chain_head_advances_by_one_link',
        MESSAGE = 'the audit chain head only moves to the link that follows it';
END;
$$;

COMMENT ON FUNCTION pybatch.audit_chain_guard_head() IS
'Refuses any change of the head but the move to the next, matching link.';

CREATE FUNCTION pybatch.audit_chain_refuse_change()
RETURNS TRIGGER
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RAISE EXCEPTION USING
        ERRCODE = 'check_violation',
        CONSTRAINT = TG_TABLE_NAME || '_insert_only',
        MESSAGE = 'pybatch.' || TG_TABLE_NAME || ' is insert-only';
END;
$$;

COMMENT ON FUNCTION pybatch.audit_chain_refuse_change() IS
'Refuses UPDATE, DELETE and TRUNCATE on the insert-only audit chain tables.';

CREATE FUNCTION pybatch.audit_chain_guard_purge()
RETURNS TRIGGER
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    link_kind TEXT;
    link_record BIGINT;
    purge_action TEXT;
BEGIN
    SELECT c.record_kind, c.record_id INTO link_kind, link_record
    FROM pybatch.audit_chain AS c
    WHERE c.seq = NEW.seq;
    -- The row lock serializes the marks of one retention action, so the count that
    -- audit_chain_check_purge_counts makes after each statement is exact.
    SELECT r.action INTO purge_action
    FROM pybatch.retention_action AS r
    WHERE r.id = NEW.retention_action_id
    FOR NO KEY UPDATE;
    IF link_kind IS NULL OR purge_action IS DISTINCT FROM 'APPLY_PURGE' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'check_violation',
            CONSTRAINT = 'audit_chain_purge_names_a_purge',
            MESSAGE = 'a purge mark must name an existing link and an APPLY_PURGE action';
    END IF;
    IF EXISTS (
        SELECT 1
        FROM pybatch.audit_record_content AS a
        WHERE a.record_kind = link_kind AND a.record_id = link_record
    ) THEN
        RAISE EXCEPTION USING
            ERRCODE = 'check_violation',
            CONSTRAINT = 'audit_chain_purge_record_gone',
            MESSAGE = 'a purge mark may only excuse a record that is gone';
    END IF;
    RETURN NEW;
END;
$$;

COMMENT ON FUNCTION pybatch.audit_chain_guard_purge() IS
'Refuses a purge mark that names no purge, or excuses a record that still exists.';

-- Once per statement, over the retention actions it marked: no action marks more links of a
-- kind than its purge deleted records of that kind (one pass, whatever the batch size).
CREATE FUNCTION pybatch.audit_chain_check_purge_counts()
RETURNS TRIGGER
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF EXISTS (
        SELECT 1
        FROM (SELECT DISTINCT m.retention_action_id FROM added_marks AS m) AS a
        INNER JOIN pybatch.retention_action AS r ON a.retention_action_id = r.id
        CROSS JOIN LATERAL (
            SELECT
                c.record_kind,
                COUNT(*) AS marked
            FROM pybatch.audit_chain_purge AS p
            INNER JOIN pybatch.audit_chain AS c ON p.seq = c.seq
            WHERE p.retention_action_id = a.retention_action_id
            GROUP BY c.record_kind
        ) AS k
        WHERE k.marked > CASE k.record_kind
            WHEN 'OPERATOR_REQUEST' THEN r.deleted_operator_requests
            WHEN 'RECOVERY_DECISION' THEN r.deleted_recovery_decisions
            ELSE 0
        END
    ) THEN
        RAISE EXCEPTION USING
            ERRCODE = 'check_violation',
            CONSTRAINT = 'audit_chain_purge_within_purge_counts',
            MESSAGE = 'a purge mark must be covered by the records its purge deleted';
    END IF;
    RETURN NULL;
END;
$$;

COMMENT ON FUNCTION pybatch.audit_chain_check_purge_counts() IS
'Refuses purge marks beyond the records their purge deleted.';

CREATE FUNCTION pybatch.append_audit_link(link_record_kind TEXT, link_record_id BIGINT)
RETURNS TABLE (seq BIGINT, link_digest BYTEA)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    head_seq BIGINT;
    head_digest BYTEA;
    record_digest BYTEA;
BEGIN
    SELECT c.content_digest INTO record_digest
    FROM pybatch.audit_record_content AS c
    WHERE c.record_kind = link_record_kind AND c.record_id = link_record_id;
    IF record_digest IS NULL THEN
        RETURN;
    END IF;
    -- The head's row lock serializes appenders, so the chain never forks or skips.
    SELECT h.seq, h.link_digest INTO head_seq, head_digest
    FROM pybatch.audit_chain_head AS h
    WHERE h.singleton
    FOR UPDATE;
    RETURN QUERY
    INSERT INTO pybatch.audit_chain AS a (
        seq, record_kind, record_id, content_digest, previous_digest, link_digest
    )
    VALUES (
        head_seq + 1,
        link_record_kind,
        link_record_id,
        record_digest,
        head_digest,
        SHA256(
            head_digest
            || INT8SEND(head_seq + 1)
            || CONVERT_TO(link_record_kind, 'UTF8')
            || INT8SEND(link_record_id)
            || record_digest
        )
    )
    RETURNING a.seq, a.link_digest;
END;
$$;

COMMENT ON FUNCTION pybatch.append_audit_link(TEXT, BIGINT) IS
'Links one existing audit record after the head; no row when the record does not exist.';

CREATE TRIGGER audit_chain_guard_link
BEFORE INSERT ON pybatch.audit_chain
FOR EACH ROW EXECUTE FUNCTION pybatch.audit_chain_guard_link();

CREATE TRIGGER audit_chain_advance_head
AFTER INSERT ON pybatch.audit_chain
FOR EACH ROW EXECUTE FUNCTION pybatch.audit_chain_advance_head();

CREATE TRIGGER audit_chain_insert_only
BEFORE UPDATE OR DELETE ON pybatch.audit_chain
FOR EACH ROW EXECUTE FUNCTION pybatch.audit_chain_refuse_change();

CREATE TRIGGER audit_chain_no_truncate
BEFORE TRUNCATE ON pybatch.audit_chain
FOR EACH STATEMENT EXECUTE FUNCTION pybatch.audit_chain_refuse_change();

CREATE TRIGGER audit_chain_head_guard
BEFORE UPDATE OR DELETE ON pybatch.audit_chain_head
FOR EACH ROW EXECUTE FUNCTION pybatch.audit_chain_guard_head();

CREATE TRIGGER audit_chain_head_no_truncate
BEFORE TRUNCATE ON pybatch.audit_chain_head
FOR EACH STATEMENT EXECUTE FUNCTION pybatch.audit_chain_refuse_change();

CREATE TRIGGER audit_chain_purge_guard
BEFORE INSERT ON pybatch.audit_chain_purge
FOR EACH ROW EXECUTE FUNCTION pybatch.audit_chain_guard_purge();

CREATE TRIGGER audit_chain_purge_counts
AFTER INSERT ON pybatch.audit_chain_purge
REFERENCING NEW TABLE AS added_marks
FOR EACH STATEMENT EXECUTE FUNCTION pybatch.audit_chain_check_purge_counts();

CREATE TRIGGER audit_chain_purge_insert_only
BEFORE UPDATE OR DELETE ON pybatch.audit_chain_purge
FOR EACH ROW EXECUTE FUNCTION pybatch.audit_chain_refuse_change();

CREATE TRIGGER audit_chain_purge_no_truncate
BEFORE TRUNCATE ON pybatch.audit_chain_purge
FOR EACH STATEMENT EXECUTE FUNCTION pybatch.audit_chain_refuse_change();
