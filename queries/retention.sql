-- :name find_retention_action :one
-- :doc The recorded retention request of (action, operation id) (retention_action_identity_unique).
SELECT
    r.id,
    r.job_instance_id,
    r.action,
    r.operation_id,
    r.actor_ref,
    r.reason_code,
    r.request_digest,
    r.plan_digest,
    r.batch_bound,
    r.deleted_flow_decisions,
    r.deleted_recovery_decisions,
    r.deleted_operator_requests,
    r.deleted_step_partitions,
    r.deleted_step_executions,
    r.deleted_job_executions,
    r.deleted_job_instances,
    r.outcome_class,
    r.applied_at
FROM pybatch.retention_action AS r
WHERE r.action = :action AND r.operation_id = :operation_id;

-- :name find_purge_batches :one
-- :doc The batches one purge recorded under its operation id base (operation ids
-- `<base>:<16 hex>`, the prefix is `<base>:`): how many, and the rows they deleted (numeric sums).
SELECT
    pg_catalog.COUNT(*) AS batches,
    COALESCE(pg_catalog.SUM(r.deleted_flow_decisions), 0) AS deleted_flow_decisions,
    COALESCE(pg_catalog.SUM(r.deleted_recovery_decisions), 0) AS deleted_recovery_decisions,
    COALESCE(pg_catalog.SUM(r.deleted_operator_requests), 0) AS deleted_operator_requests,
    COALESCE(pg_catalog.SUM(r.deleted_step_partitions), 0) AS deleted_step_partitions,
    COALESCE(pg_catalog.SUM(r.deleted_step_executions), 0) AS deleted_step_executions,
    COALESCE(pg_catalog.SUM(r.deleted_job_executions), 0) AS deleted_job_executions,
    COALESCE(pg_catalog.SUM(r.deleted_job_instances), 0) AS deleted_job_instances
FROM pybatch.retention_action AS r
WHERE
    r.action = 'APPLY_PURGE'
    AND pg_catalog.STARTS_WITH(r.operation_id, CAST(:operation_prefix AS TEXT))
    AND pg_catalog.LENGTH(r.operation_id) = pg_catalog.LENGTH(CAST(:operation_prefix AS TEXT)) + 16;

-- :name insert_retention_action :one
-- :doc Append a retention audit row; retention_action_identity_unique settles a race on one
-- (action, operation id): the loser fails with ConcurrentModification.
INSERT INTO pybatch.retention_action (
    job_instance_id,
    action,
    operation_id,
    actor_ref,
    reason_code,
    request_digest,
    plan_digest,
    batch_bound,
    deleted_flow_decisions,
    deleted_recovery_decisions,
    deleted_operator_requests,
    deleted_step_partitions,
    deleted_step_executions,
    deleted_job_executions,
    deleted_job_instances,
    outcome_class,
    applied_at
)
VALUES (
    :job_instance_id,
    :action,
    :operation_id,
    :actor_ref,
    :reason_code,
    :request_digest,
    :plan_digest,
    :batch_bound,
    :deleted_flow_decisions,
    :deleted_recovery_decisions,
    :deleted_operator_requests,
    :deleted_step_partitions,
    :deleted_step_executions,
    :deleted_job_executions,
    :deleted_job_instances,
    :outcome_class,
    :applied_at
)
RETURNING id;

-- :name survey_purge_batch :many
-- :doc The next batch of whole instance histories, in one statement: for each requested status, the
-- candidate instances oldest latest execution first (the latest attempt has that status and was
-- last written more than minimum_age_us microseconds before the server's statement time, so the
-- database clock decides the cutoff whatever the client's clock says; the instance is of the job,
-- not held, with no unresolved attempt), at most the batch bound per status after the
-- (after_updated_at, after_instance_id) keyset; then the longest prefix, across statuses, whose
-- executions fit in the bound (the first instance always, alone if larger); then every execution of
-- those instances, oldest instance first, each with its instance's latest status and updated_at
-- and, repeated on every row, the rows a purge of them would delete per table
-- (job_execution_status_updated, job_execution_attempt_unique, and each child table's foreign key
-- index for the counts).
WITH requested AS (
    SELECT q.status
    FROM pg_catalog.UNNEST(CAST(:statuses AS TEXT[])) AS q (status)
),

latest AS MATERIALIZED (
    SELECT
        c.job_instance_id,
        c.updated_at,
        c.status,
        c.job_execution_id,
        c.version,
        c.execution_count
    FROM requested AS r
    CROSS JOIN
        LATERAL (
            SELECT
                e.job_instance_id,
                e.updated_at,
                e.status,
                e.id AS job_execution_id,
                e.version,
                (
                    SELECT pg_catalog.COUNT(*) AS n
                    FROM pybatch.job_execution AS a
                    WHERE a.job_instance_id = e.job_instance_id
                ) AS execution_count
            FROM pybatch.job_execution AS e
            INNER JOIN pybatch.job_instance AS i ON e.job_instance_id = i.id
            WHERE
                e.status = r.status
                AND e.updated_at
                < pg_catalog.STATEMENT_TIMESTAMP()
                - CAST(:minimum_age_us AS BIGINT) * INTERVAL '1 microsecond'
                AND (e.updated_at, e.job_instance_id) > (:after_updated_at, :after_instance_id)
                AND i.job_name = :job_name
                AND i.hold_actor IS NULL
                AND NOT EXISTS (
                    SELECT 1
                    FROM pybatch.job_execution AS n
                    WHERE n.job_instance_id = e.job_instance_id AND n.attempt > e.attempt
                )
                AND NOT EXISTS (
                    SELECT 1
                    FROM pybatch.job_execution AS u
                    WHERE
                        u.job_instance_id = e.job_instance_id
                        AND u.status IN ('STARTING', 'STARTED', 'STOPPING', 'UNKNOWN')
                )
            ORDER BY e.updated_at, e.job_instance_id
            LIMIT :limit
        ) AS c
),

ranked AS (
    SELECT
        l.job_instance_id,
        l.updated_at,
        l.status,
        l.job_execution_id,
        l.version,
        l.execution_count,
        pg_catalog.SUM(l.execution_count) OVER taken AS taken_executions,
        pg_catalog.ROW_NUMBER() OVER taken AS taken_rank
    FROM latest AS l
    WINDOW taken AS (ORDER BY l.updated_at, l.job_instance_id ROWS UNBOUNDED PRECEDING)
),

taken AS MATERIALIZED (
    SELECT
        k.job_instance_id,
        k.updated_at,
        k.status,
        k.job_execution_id,
        k.version,
        k.execution_count
    FROM ranked AS k
    WHERE k.taken_rank = 1 OR k.taken_executions <= :limit
),

chosen AS MATERIALIZED (
    -- An instance with one execution: the latest one, already read.
    SELECT
        o.job_instance_id,
        o.updated_at,
        o.status,
        o.job_execution_id,
        o.version
    FROM taken AS o
    WHERE o.execution_count = 1
    UNION ALL
    SELECT
        m.job_instance_id,
        m.updated_at,
        m.status,
        x.id AS job_execution_id,
        x.version
    FROM taken AS m
    INNER JOIN pybatch.job_execution AS x ON m.job_instance_id = x.job_instance_id
    WHERE m.execution_count > 1
)

SELECT
    h.job_instance_id,
    h.job_execution_id,
    h.version,
    h.updated_at,
    h.status,
    (
        SELECT pg_catalog.COUNT(*) AS n
        FROM pybatch.flow_decision AS f
        WHERE f.job_execution_id = ANY(ARRAY(SELECT c1.job_execution_id FROM chosen AS c1))
    ) AS flow_decisions,
    (
        SELECT pg_catalog.COUNT(*) AS n
        FROM pybatch.recovery_decision AS d
        WHERE d.job_execution_id = ANY(ARRAY(SELECT c2.job_execution_id FROM chosen AS c2))
    ) AS recovery_decisions,
    (
        SELECT pg_catalog.COUNT(*) AS n
        FROM pybatch.operator_request AS o
        WHERE
            o.job_execution_id = ANY(ARRAY(SELECT c3.job_execution_id FROM chosen AS c3))
            OR (
                o.job_execution_id IS NULL
                AND o.job_instance_id = ANY(ARRAY(SELECT c4.job_instance_id FROM chosen AS c4))
            )
    ) AS operator_requests,
    (
        SELECT pg_catalog.COUNT(*) AS n
        FROM pybatch.step_partition AS p
        INNER JOIN pybatch.step_execution AS ps ON p.step_execution_id = ps.id
        WHERE ps.job_execution_id = ANY(ARRAY(SELECT c5.job_execution_id FROM chosen AS c5))
    ) AS step_partitions,
    (
        SELECT pg_catalog.COUNT(*) AS n
        FROM pybatch.step_execution AS s
        WHERE s.job_execution_id = ANY(ARRAY(SELECT c6.job_execution_id FROM chosen AS c6))
    ) AS step_executions
FROM chosen AS h
ORDER BY h.updated_at, h.job_instance_id, h.job_execution_id;

-- :name lock_purge_instances :one
-- :doc Lock the candidate instances in ascending id order (lock order - instances first) and
-- report how many were found and how many of those are held (job_instance_pkey).
WITH locked_instances AS MATERIALIZED (
    SELECT
        i.id,
        i.hold_actor
    FROM pybatch.job_instance AS i
    WHERE i.id = ANY(CAST(:instance_ids AS BIGINT[]))
    ORDER BY i.id
    FOR UPDATE
)

SELECT
    pg_catalog.COUNT(*) AS found,
    pg_catalog.COUNT(l.hold_actor) AS held
FROM locked_instances AS l;

-- :name lock_purge_executions :one
-- :doc Lock every execution of the candidate instances in ascending id order (after the
-- instances), and report what re-validation needs: the SHA-256 of their (instance, execution,
-- version) triples in that order, each as three big-endian int8 (the candidate encoding of the
-- plan digest), how many are unresolved, and how many instances have a latest attempt whose
-- status is not one of the requested ones (job_execution_attempt_unique).
WITH locked_executions AS MATERIALIZED (
    SELECT
        e.job_instance_id,
        e.id,
        e.version,
        e.status,
        e.attempt
    FROM pybatch.job_execution AS e
    WHERE e.job_instance_id = ANY(CAST(:instance_ids AS BIGINT[]))
    ORDER BY e.id
    FOR UPDATE
),

latest AS (
    SELECT DISTINCT ON (l.job_instance_id) l.status
    FROM locked_executions AS l
    ORDER BY l.job_instance_id ASC, l.attempt DESC
)

SELECT
    (
        SELECT
            pg_catalog.SHA256(
                COALESCE(
                    pg_catalog.STRING_AGG(
                        pg_catalog.INT8SEND(c.job_instance_id)
                        || pg_catalog.INT8SEND(c.id)
                        || pg_catalog.INT8SEND(c.version),
                        CAST('' AS BYTEA)
                        ORDER BY c.job_instance_id, c.id, c.version
                    ),
                    CAST('' AS BYTEA)
                )
            ) AS digest
        FROM locked_executions AS c
    ) AS candidates_digest,
    (
        SELECT pg_catalog.COUNT(*) AS n
        FROM locked_executions AS u
        WHERE u.status IN ('STARTING', 'STARTED', 'STOPPING', 'UNKNOWN')
    ) AS unresolved,
    (
        SELECT pg_catalog.COUNT(*) AS n
        FROM latest AS t
        WHERE t.status <> ALL(CAST(:statuses AS TEXT[]))
    ) AS not_requested;

-- :name mark_purged_audit_links :affected
-- :doc Record which links lost their record to this purge (audit_chain_purge), naming the
-- retention action that did it; verification then accepts those records' absence.
INSERT INTO pybatch.audit_chain_purge (seq, retention_action_id)
SELECT
    c.seq,
    :retention_action_id AS retention_action_id
FROM pybatch.audit_chain AS c
WHERE
    (
        c.record_kind = 'OPERATOR_REQUEST'
        AND c.record_id = ANY(CAST(:operator_request_ids AS BIGINT[]))
    )
    OR (
        c.record_kind = 'RECOVERY_DECISION'
        AND c.record_id = ANY(CAST(:recovery_decision_ids AS BIGINT[]))
    );

-- :name delete_purge_histories :one
-- :doc Delete the candidates' histories in one statement, children first: flow decisions,
-- recovery decisions, operator requests (execution-scoped ones of the candidates and
-- instance-scoped ones of their instances), partitions of their steps, their steps, the
-- executions; and, unless the instances are to be forgotten, keep each instance as a tombstone
-- (its latest execution's status, the purge time; holds stay). The foreign keys are checked at
-- the end of the statement, when every child is gone, so a retained row that still references
-- a deleted one fails it as a separate DELETE would. Returns the rows deleted per table and the
-- ids of the deleted operator requests and recovery decisions (their audit-chain links are
-- marked).
WITH targets AS (
    SELECT
        CAST(:execution_ids AS BIGINT[]) AS execution_ids,
        CAST(:instance_ids AS BIGINT[]) AS instance_ids
),

flows AS (
    DELETE FROM pybatch.flow_decision AS f
    USING targets AS t
    WHERE f.job_execution_id = ANY(t.execution_ids)
    RETURNING f.id
),

recoveries AS (
    DELETE FROM pybatch.recovery_decision AS d
    USING targets AS t
    WHERE d.job_execution_id = ANY(t.execution_ids)
    RETURNING d.id
),

requests AS (
    DELETE FROM pybatch.operator_request AS o
    USING targets AS t
    WHERE
        o.job_execution_id = ANY(t.execution_ids)
        OR (
            o.job_execution_id IS NULL
            AND o.job_instance_id = ANY(t.instance_ids)
        )
    RETURNING o.id
),

partitions AS (
    DELETE FROM pybatch.step_partition AS p
    USING targets AS t, pybatch.step_execution AS ps
    WHERE
        p.step_execution_id = ps.id
        AND ps.job_execution_id = ANY(t.execution_ids)
    RETURNING p.id
),

steps AS (
    DELETE FROM pybatch.step_execution AS s
    USING targets AS t
    WHERE s.job_execution_id = ANY(t.execution_ids)
    RETURNING s.id
),

executions AS (
    DELETE FROM pybatch.job_execution AS e
    USING targets AS t
    WHERE e.id = ANY(t.execution_ids)
    RETURNING e.id
),

tombstones AS (
    UPDATE pybatch.job_instance AS i
    SET
        final_status = (
            SELECT x.status
            FROM pybatch.job_execution AS x
            WHERE x.job_instance_id = i.id
            ORDER BY x.attempt DESC
            LIMIT 1
        ),
        purged_at = :purged_at
    FROM targets AS t
    WHERE i.id = ANY(t.instance_ids) AND CAST(:tombstone AS BOOLEAN)
    RETURNING i.id
)

SELECT
    (SELECT pg_catalog.COUNT(*) AS n FROM flows) AS flow_decisions,
    (SELECT pg_catalog.COUNT(*) AS n FROM recoveries) AS recovery_decisions,
    (SELECT pg_catalog.COUNT(*) AS n FROM requests) AS operator_requests,
    (SELECT pg_catalog.COUNT(*) AS n FROM partitions) AS step_partitions,
    (SELECT pg_catalog.COUNT(*) AS n FROM steps) AS step_executions,
    (SELECT pg_catalog.COUNT(*) AS n FROM executions) AS job_executions,
    (SELECT pg_catalog.COUNT(*) AS n FROM tombstones) AS tombstones,
    ARRAY(
        SELECT q.id
        FROM requests AS q
        ORDER BY q.id
    ) AS operator_request_ids,
    ARRAY(
        SELECT r.id
        FROM recoveries AS r
        ORDER BY r.id
    ) AS recovery_decision_ids;

-- :name detach_retention_actions :affected
-- :doc Clear the instance reference of retention records before their instance is deleted.
UPDATE pybatch.retention_action
SET job_instance_id = NULL
WHERE job_instance_id = ANY(CAST(:instance_ids AS BIGINT[]));

-- :name delete_purge_instances :affected
-- :doc Delete purged instances (forget_instances), with their holds.
DELETE FROM pybatch.job_instance
WHERE id = ANY(CAST(:instance_ids AS BIGINT[]));
