-- :name count_flow_node_starts :scalar
-- :doc How often a node has started in an instance, across every attempt (start limits);
-- driven by job_execution_attempt_unique, then step_execution_logical_id_unique.
SELECT COUNT(*) AS start_count
FROM pybatch.job_execution AS e
INNER JOIN pybatch.step_execution AS s
    ON e.id = s.job_execution_id AND s.step_logical_id = :node_id
WHERE e.job_instance_id = :job_instance_id;

-- :name find_latest_flow_step_execution :scalar
-- :doc The newest step of a node in an instance (attempt, then step id, descending): the source
-- whose durable state a flow step copies.
SELECT s.id
FROM pybatch.job_execution AS e
INNER JOIN pybatch.step_execution AS s
    ON e.id = s.job_execution_id AND s.step_logical_id = :node_id
WHERE e.job_instance_id = :job_instance_id
ORDER BY e.attempt DESC, s.id DESC
LIMIT 1;
