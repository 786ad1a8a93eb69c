-- :name append_audit_link :one
-- :doc Link one audit record into the chain: advance the head (its row lock serializes appenders,
-- so the chain never forks or skips), digest the record's canonical content
-- (audit_record_content) and chain it to the previous link. No row: the record does not exist.
WITH head AS (
    UPDATE pybatch.audit_chain_head AS h
    SET seq = h.seq + 1
    WHERE h.singleton
    RETURNING h.seq, h.link_digest
),

record_content AS (
    SELECT c.content_digest
    FROM pybatch.audit_record_content AS c
    WHERE c.record_kind = :record_kind AND c.record_id = :record_id
)

INSERT INTO pybatch.audit_chain (
    seq, record_kind, record_id, content_digest, previous_digest, link_digest
)
SELECT
    head.seq,
    :record_kind AS record_kind,
    :record_id AS record_id,
    record_content.content_digest,
    head.link_digest AS previous_digest,
    SHA256(
        head.link_digest
        || INT8SEND(head.seq)
        || CONVERT_TO(:record_kind, 'UTF8')
        || INT8SEND(CAST(:record_id AS BIGINT))
        || record_content.content_digest
    ) AS link_digest
FROM head CROSS JOIN record_content
RETURNING seq, link_digest;

-- :name set_audit_chain_head :affected
-- :doc Record the newest link's digest on the head advanced by append_audit_link.
UPDATE pybatch.audit_chain_head AS h
SET link_digest = :link_digest
WHERE h.singleton AND h.seq = :seq;

-- :name read_audit_chain_head :one
-- :doc The newest link of the chain (audit_chain_head_pkey).
SELECT
    h.seq,
    h.link_digest
FROM pybatch.audit_chain_head AS h
WHERE h.singleton;

-- :name list_audit_links :many
-- :doc A page of links after a sequence number, each with the digest its link should have, its
-- record's current content digest (NULL when the record is gone) and the purge that removed it.
SELECT
    c.seq,
    c.record_kind,
    c.record_id,
    c.content_digest,
    c.previous_digest,
    c.link_digest,
    r.content_digest AS record_content_digest,
    p.retention_action_id AS purged_by,
    SHA256(
        c.previous_digest
        || INT8SEND(c.seq)
        || CONVERT_TO(c.record_kind, 'UTF8')
        || INT8SEND(c.record_id)
        || c.content_digest
    ) AS expected_link_digest
FROM pybatch.audit_chain AS c
LEFT JOIN LATERAL (
    SELECT a.content_digest
    FROM pybatch.audit_record_content AS a
    WHERE a.record_kind = c.record_kind AND a.record_id = c.record_id
) AS r ON TRUE
LEFT JOIN pybatch.audit_chain_purge AS p ON c.seq = p.seq
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
