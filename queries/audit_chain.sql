-- :name append_audit_link :one
-- :doc Link one audit record after the head (pybatch.append_audit_link, migration 0007): the
-- head's row lock serializes appenders, the chain's triggers check the link and advance the
-- head in the same statement. No row: the record does not exist.
SELECT
    l.seq,
    l.link_digest
FROM pybatch.append_audit_link(:record_kind, CAST(:record_id AS BIGINT)) AS l;

-- :name read_audit_chain_head :one
-- :doc The newest link of the chain (audit_chain_head_pkey).
SELECT
    h.seq,
    h.link_digest
FROM pybatch.audit_chain_head AS h
WHERE h.singleton;

-- :name list_audit_links :many
-- :doc A page of links after a sequence number (past the head too), each with the digest its link
-- should have, its record's current content digest (NULL when the record is gone) and the purge
-- mark that excuses its absence: the retention action named, its action and its own link.
SELECT
    c.seq,
    c.record_kind,
    c.record_id,
    c.content_digest,
    c.previous_digest,
    c.link_digest,
    r.content_digest AS record_content_digest,
    p.retention_action_id AS purged_by,
    pr.action AS purge_action,
    pl.seq AS purge_seq,
    pg_catalog.SHA256(
        c.previous_digest
        || pg_catalog.INT8SEND(c.seq)
        || pg_catalog.CONVERT_TO(c.record_kind, 'UTF8')
        || pg_catalog.INT8SEND(c.record_id)
        || c.content_digest
    ) AS expected_link_digest
FROM pybatch.audit_chain AS c
LEFT JOIN LATERAL (
    SELECT a.content_digest
    FROM pybatch.audit_record_content AS a
    WHERE a.record_kind = c.record_kind AND a.record_id = c.record_id
) AS r ON TRUE
LEFT JOIN pybatch.audit_chain_purge AS p ON c.seq = p.seq
LEFT JOIN pybatch.retention_action AS pr ON p.retention_action_id = pr.id
LEFT JOIN pybatch.audit_chain AS pl
    ON pl.record_kind = 'RETENTION_ACTION' AND p.retention_action_id = pl.record_id
WHERE c.seq > :after_seq
ORDER BY c.seq
LIMIT :limit;

-- :name find_unlinked_audit_record :one
-- :doc An audit record that has no link (written behind pybatch's back), or no row.
SELECT
    r.record_kind,
    r.record_id
FROM pybatch.audit_record_content AS r
WHERE
    NOT EXISTS (
        SELECT 1
        FROM pybatch.audit_chain AS c
        WHERE c.record_kind = r.record_kind AND c.record_id = r.record_id
    )
ORDER BY r.record_kind, r.record_id
LIMIT 1;

-- :name find_overdrawn_audit_purge :one
-- :doc A retention action that marks more links of a kind purged than it deleted records of that
-- kind (audit_chain_purge_retention_action), or no row.
SELECT
    p.retention_action_id,
    c.record_kind,
    pg_catalog.COUNT(*) AS marked,
    pg_catalog.MAX(
        CASE c.record_kind
            WHEN 'OPERATOR_REQUEST' THEN r.deleted_operator_requests
            WHEN 'RECOVERY_DECISION' THEN r.deleted_recovery_decisions
            ELSE 0
        END
    ) AS deleted
FROM pybatch.audit_chain_purge AS p
INNER JOIN pybatch.audit_chain AS c ON p.seq = c.seq
INNER JOIN pybatch.retention_action AS r ON p.retention_action_id = r.id
GROUP BY p.retention_action_id, c.record_kind
HAVING
    pg_catalog.COUNT(*) > pg_catalog.MAX(
        CASE c.record_kind
            WHEN 'OPERATOR_REQUEST' THEN r.deleted_operator_requests
            WHEN 'RECOVERY_DECISION' THEN r.deleted_recovery_decisions
            ELSE 0
        END
    )
ORDER BY p.retention_action_id, c.record_kind
LIMIT 1;
