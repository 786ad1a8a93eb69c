-- Migration 0004: execution leases and the audit hash chain (schema version 4).
--
-- Lint: the new tables are created empty in this transaction, so their indexes lock nothing
-- anyone waits on (PG01 does not apply; CONCURRENTLY cannot run in a transaction block).
--
-- 1. Execution leases.
--
-- A running execution's ownership was evidenced by a session-level advisory lock held on an
-- idle connection: a killed idle session (idle_session_timeout, pg_terminate_backend) lost it
-- while the run went on, and any role able to connect could take the key of a dead run and
-- block its recovery. Ownership is now row state: the owner token (already recorded by
-- claim_execution_owner) and a lease expiry that the runner renews on the database clock.
--
-- Existing rows keep lease_expires_at NULL. An unresolved execution without a lease was
-- started before this migration by a runner that still holds the advisory lock; pybatch
-- keeps probing that lock for such executions only, so upgrading under live runs never
-- recovers a run that is still alive, and those runs resume normally after a restart.

ALTER TABLE pybatch.job_execution
ADD COLUMN lease_expires_at TIMESTAMPTZ;

-- A lease always belongs to a recorded owner token. Existing rows have no lease, so the
-- validating scan finds nothing to refuse.
ALTER TABLE pybatch.job_execution
ADD CONSTRAINT job_execution_lease_has_owner
CHECK (lease_expires_at IS NULL OR owner_token IS NOT NULL);

COMMENT ON COLUMN pybatch.job_execution.lease_expires_at IS
'Database-clock instant until which the owner''s lease holds; renewed by the live runner. '
'NULL: no lease (never claimed, or started before leases existed).';

-- 2. The audit hash chain.
--
-- Operator requests, recovery decisions and retention actions are linked into one chain:
-- link n records the SHA-256 of its record's canonical content and the digest of link n-1,
-- so an edited, deleted or reordered record or link is detected by `pybatch audit verify`.
-- The links live beside the records, not in them, because a purge deletes whole instance
-- histories (operator requests and recovery decisions included) and the chain must outlive
-- them: a purged record's link stays, marked by audit_chain_purge. Appenders serialize on the
-- singleton head row, so the chain never forks and has no gaps. Existing audit rows are
-- linked here, in id order per table, operator requests first.

CREATE TABLE pybatch.audit_chain_head (
    singleton BOOLEAN NOT NULL DEFAULT TRUE,
    seq BIGINT NOT NULL,
    link_digest BYTEA NOT NULL,
    CONSTRAINT audit_chain_head_pkey PRIMARY KEY (singleton),
    CONSTRAINT audit_chain_head_singleton CHECK (singleton),
    CONSTRAINT audit_chain_head_seq_nonnegative CHECK (seq >= 0),
    CONSTRAINT audit_chain_head_link_digest_length CHECK (OCTET_LENGTH(link_digest) = 32)
);

CREATE TABLE pybatch.audit_chain (
    seq BIGINT NOT NULL,
    record_kind TEXT COLLATE "C" NOT NULL,
    record_id BIGINT NOT NULL,
    content_digest BYTEA NOT NULL,
    previous_digest BYTEA NOT NULL,
    link_digest BYTEA NOT NULL,
    CONSTRAINT audit_chain_pkey PRIMARY KEY (seq),
    CONSTRAINT audit_chain_seq_positive CHECK (seq > 0),
    CONSTRAINT audit_chain_record_kind_valid
    CHECK (record_kind IN ('OPERATOR_REQUEST', 'RECOVERY_DECISION', 'RETENTION_ACTION')),
    CONSTRAINT audit_chain_record_id_positive CHECK (record_id > 0),
    CONSTRAINT audit_chain_content_digest_length CHECK (OCTET_LENGTH(content_digest) = 32),
    CONSTRAINT audit_chain_previous_digest_length CHECK (OCTET_LENGTH(previous_digest) = 32),
    CONSTRAINT audit_chain_link_digest_length CHECK (OCTET_LENGTH(link_digest) = 32),
    -- One link per record.
    CONSTRAINT audit_chain_record_unique UNIQUE (record_kind, record_id)
);

CREATE TABLE pybatch.audit_chain_purge (
    seq BIGINT NOT NULL,
    retention_action_id BIGINT NOT NULL,
    CONSTRAINT audit_chain_purge_pkey PRIMARY KEY (seq),
    CONSTRAINT audit_chain_purge_seq_fk FOREIGN KEY (seq)
    REFERENCES pybatch.audit_chain (seq) ON DELETE RESTRICT,
    CONSTRAINT audit_chain_purge_retention_action_fk FOREIGN KEY (retention_action_id)
    REFERENCES pybatch.retention_action (id) ON DELETE RESTRICT
);

-- Covers audit_chain_purge_retention_action_fk.
CREATE INDEX audit_chain_purge_retention_action -- noqa: PG01
ON pybatch.audit_chain_purge (retention_action_id);

COMMENT ON TABLE pybatch.audit_chain_head IS
'The newest link of the audit chain; appenders lock this row, so links never fork or skip.';
COMMENT ON TABLE pybatch.audit_chain IS
'Append-only hash chain over operator requests, recovery decisions and retention actions.';
COMMENT ON COLUMN pybatch.audit_chain.content_digest IS
'SHA-256 of the record''s canonical content (pybatch/values/audit.py).';
COMMENT ON COLUMN pybatch.audit_chain.previous_digest IS
'link_digest of link seq - 1; 32 zero bytes for link 1.';
COMMENT ON COLUMN pybatch.audit_chain.link_digest IS
'SHA-256 of previous_digest, seq, record_kind, record_id and content_digest.';
COMMENT ON TABLE pybatch.audit_chain_purge IS
'Links whose record a purge deleted, with the retention action that deleted it.';

INSERT INTO pybatch.audit_chain_head (singleton, seq, link_digest)
VALUES (TRUE, 0, DECODE(REPEAT('00', 32), 'hex'));

-- The canonical content digest of every audit record: a JSON array of the record kind and its
-- columns (bytea as hex, instants as UTC ISO 8601 with microseconds), as text, SHA-256.
-- retention_action.job_instance_id is left out: the purge that deletes an instance clears it.
CREATE VIEW pybatch.audit_record_content AS
SELECT
    'OPERATOR_REQUEST' AS record_kind,
    o.id AS record_id,
    SHA256(
        CONVERT_TO(
            CAST(
                JSONB_BUILD_ARRAY(
                    'OPERATOR_REQUEST',
                    o.id,
                    o.job_instance_id,
                    o.job_execution_id,
                    o.action,
                    o.authorization_class,
                    o.operation_id,
                    o.actor_ref,
                    o.reason_code,
                    ENCODE(o.request_digest, 'hex'),
                    o.observed_version,
                    o.prior_status,
                    o.result_status,
                    o.outcome_class,
                    o.rejection_code,
                    o.rejection_current_version,
                    o.rejection_status,
                    o.rejection_execution_id,
                    TO_CHAR(o.requested_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')
                ) AS TEXT
            ),
            'UTF8'
        )
    ) AS content_digest
FROM pybatch.operator_request AS o
UNION ALL
SELECT
    'RECOVERY_DECISION' AS record_kind,
    d.id AS record_id,
    SHA256(
        CONVERT_TO(
            CAST(
                JSONB_BUILD_ARRAY(
                    'RECOVERY_DECISION',
                    d.id,
                    d.job_execution_id,
                    d.execution_version,
                    d.prior_status,
                    d.resulting_status,
                    d.reason_code,
                    d.operator_reference,
                    ENCODE(d.evidence_digest, 'hex'),
                    TO_CHAR(d.decided_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')
                ) AS TEXT
            ),
            'UTF8'
        )
    ) AS content_digest
FROM pybatch.recovery_decision AS d
UNION ALL
SELECT
    'RETENTION_ACTION' AS record_kind,
    r.id AS record_id,
    SHA256(
        CONVERT_TO(
            CAST(
                JSONB_BUILD_ARRAY(
                    'RETENTION_ACTION',
                    r.id,
                    r.action,
                    r.operation_id,
                    r.actor_ref,
                    r.reason_code,
                    ENCODE(r.request_digest, 'hex'),
                    ENCODE(r.plan_digest, 'hex'),
                    r.batch_bound,
                    r.deleted_flow_decisions,
                    r.deleted_recovery_decisions,
                    r.deleted_operator_requests,
                    r.deleted_step_partitions,
                    r.deleted_step_executions,
                    r.deleted_job_executions,
                    r.deleted_job_instances,
                    r.outcome_class,
                    TO_CHAR(r.applied_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')
                ) AS TEXT
            ),
            'UTF8'
        )
    ) AS content_digest
FROM pybatch.retention_action AS r;

COMMENT ON VIEW pybatch.audit_record_content IS
'The content digest of every operator request, recovery decision and retention action.';

-- Link the audit records that already exist: operator requests, then recovery decisions, then
-- retention actions, each in id order. The link formula is the one queries/audit_chain.sql uses.
CREATE TEMPORARY TABLE audit_backfill ON COMMIT DROP AS
SELECT
    c.record_kind,
    c.record_id,
    c.content_digest,
    ROW_NUMBER() OVER (
        ORDER BY
            CASE c.record_kind
                WHEN 'OPERATOR_REQUEST' THEN 1
                WHEN 'RECOVERY_DECISION' THEN 2
                ELSE 3
            END,
            c.record_id
    ) AS seq
FROM pybatch.audit_record_content AS c;

CREATE UNIQUE INDEX audit_backfill_seq ON audit_backfill (seq); -- noqa: PG01

INSERT INTO pybatch.audit_chain (
    seq, record_kind, record_id, content_digest, previous_digest, link_digest
)
WITH RECURSIVE linked AS (
    SELECT
        CAST(0 AS BIGINT) AS seq,
        CAST(NULL AS TEXT) AS record_kind,
        CAST(NULL AS BIGINT) AS record_id,
        CAST(NULL AS BYTEA) AS content_digest,
        CAST(NULL AS BYTEA) AS previous_digest,
        DECODE(REPEAT('00', 32), 'hex') AS link_digest
    UNION ALL
    SELECT
        b.seq,
        b.record_kind,
        b.record_id,
        b.content_digest,
        l.link_digest AS previous_digest,
        SHA256(
            l.link_digest
            || INT8SEND(b.seq)
            || CONVERT_TO(b.record_kind, 'UTF8')
            || INT8SEND(b.record_id)
            || b.content_digest
        ) AS link_digest
    FROM linked AS l
    INNER JOIN audit_backfill AS b ON l.seq + 1 = b.seq
)

SELECT
    linked.seq,
    linked.record_kind,
    linked.record_id,
    linked.content_digest,
    linked.previous_digest,
    linked.link_digest
FROM linked
WHERE linked.seq > 0;

UPDATE pybatch.audit_chain_head AS h
SET
    seq = last_link.seq,
    link_digest = last_link.link_digest
FROM (
    SELECT
        c.seq,
        c.link_digest
    FROM pybatch.audit_chain AS c
    ORDER BY c.seq DESC
    LIMIT 1
) AS last_link
WHERE h.singleton;
