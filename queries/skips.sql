-- :name get_step_skip_total :scalar
-- :doc The skips a step has committed (read, process and write, carried over from earlier
-- attempts): what a fault-tolerant chunk checks its skip limit against. It is the chunk's
-- first statement, so the chunk's savepoints open inside its transaction.
SELECT s.read_skip_count + s.process_skip_count + s.write_skip_count AS skips
FROM pybatch.step_execution AS s
WHERE s.id = :step_execution_id;

-- :name insert_step_skip :affected
-- :doc Record one skipped item in the chunk's own transaction (step_skip_item_unique: an item
-- is recorded once per step execution); created_at is the database clock.
INSERT INTO pybatch.step_skip (
    step_execution_id,
    item_position,
    item_key,
    sqlstate,
    constraint_name,
    table_name,
    column_name,
    message,
    created_at
)
VALUES (
    :step_execution_id,
    :item_position,
    :item_key,
    :sqlstate,
    :constraint_name,
    :table_name,
    :column_name,
    :message,
    pg_catalog.STATEMENT_TIMESTAMP()
);

-- :name get_step_skip_ceiling :scalar
-- :doc Identity ceiling of skip-record pages (step_skip_pkey).
SELECT pg_catalog.MAX(k.id) AS ceiling
FROM pybatch.step_skip AS k;

-- :name list_step_skips :many
-- :doc Skip records of one job execution's steps, id ascending after after_id, up to the
-- page's ceiling (step_skip_step_listing, per step of the execution).
SELECT
    k.id,
    k.step_execution_id,
    s.step_name,
    k.item_position,
    k.item_key,
    k.sqlstate,
    k.constraint_name,
    k.table_name,
    k.column_name,
    k.message,
    k.created_at
FROM pybatch.step_skip AS k
INNER JOIN pybatch.step_execution AS s ON k.step_execution_id = s.id
WHERE
    s.job_execution_id = :job_execution_id
    AND k.id > :after_id
    AND k.id <= :ceiling
ORDER BY k.id
LIMIT :row_limit;

-- :name list_step_skip_counts :many
-- :doc The skip counters of one job execution's steps, by step id (step_execution's
-- job_execution_id index); `pybatch show` prints them.
SELECT
    s.id AS step_execution_id,
    s.read_skip_count + s.process_skip_count + s.write_skip_count AS skips
FROM pybatch.step_execution AS s
WHERE s.job_execution_id = :job_execution_id
ORDER BY s.id
LIMIT :row_limit;
