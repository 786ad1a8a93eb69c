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
