-- :name get_transaction_settings :one
-- :doc Read back the isolation level and timeouts in force (tests only).
SELECT
    pg_catalog.CURRENT_SETTING('transaction_isolation') AS transaction_isolation,
    pg_catalog.CURRENT_SETTING('statement_timeout') AS statement_timeout,
    pg_catalog.CURRENT_SETTING('lock_timeout') AS lock_timeout,
    pg_catalog.CURRENT_SETTING('idle_in_transaction_session_timeout')
        AS idle_in_transaction_session_timeout,
    pg_catalog.CURRENT_SETTING('TimeZone') AS time_zone;

-- :name create_step_execution :one
-- :doc Create a step (STARTING) in one statement (migration 0014 create_step_execution): checked
-- for duplicates, in a restart with the durable state of the same (or upgrade-mapped) step of the
-- previous attempt. outcome - created, or the error that refuses it, with details; the execution
-- comes back whole (execution_ columns), so no step begins under a corrupt one.
SELECT
    o.outcome,
    o.details,
    (o.execution).id AS execution_id,
    (o.execution).job_instance_id AS execution_job_instance_id,
    (o.execution).definition_id AS execution_definition_id,
    (o.execution).upgrade_from_definition_id AS execution_upgrade_from_definition_id,
    (o.execution).restart_of_execution_id AS execution_restart_of_execution_id,
    (o.execution).attempt AS execution_attempt,
    (o.execution).status AS execution_status,
    (o.execution).exit_code AS execution_exit_code,
    (o.execution).failure_category AS execution_failure_category,
    (o.execution).failure_id AS execution_failure_id,
    (o.execution).created_at AS execution_created_at,
    (o.execution).started_at AS execution_started_at,
    (o.execution).ended_at AS execution_ended_at,
    (o.execution).updated_at AS execution_updated_at,
    (o.execution).version AS execution_version,
    (o.step).id AS id,
    (o.step).job_execution_id AS job_execution_id,
    (o.step).step_name AS step_name,
    (o.step).step_logical_id AS step_logical_id,
    (o.step).status AS status,
    (o.step).exit_code AS exit_code,
    (o.step).read_count AS read_count,
    (o.step).processed_count AS processed_count,
    (o.step).write_count AS write_count,
    (o.step).filter_count AS filter_count,
    (o.step).commit_count AS commit_count,
    (o.step).rollback_count AS rollback_count,
    (o.step).checkpoint_format AS checkpoint_format,
    (o.step).checkpoint_schema AS checkpoint_schema,
    (o.step).checkpoint_schema_version AS checkpoint_schema_version,
    (o.step).checkpoint_payload AS checkpoint_payload,
    (o.step).context_format AS context_format,
    (o.step).context_schema AS context_schema,
    (o.step).context_schema_version AS context_schema_version,
    (o.step).context_payload AS context_payload,
    (o.step).failure_category AS failure_category,
    (o.step).failure_id AS failure_id,
    (o.step).created_at AS created_at,
    (o.step).started_at AS started_at,
    (o.step).ended_at AS ended_at,
    (o.step).updated_at AS updated_at,
    (o.step).version AS version,
    (o.step).read_retry_count AS read_retry_count,
    (o.step).process_retry_count AS process_retry_count,
    (o.step).write_retry_count AS write_retry_count,
    (o.step).read_skip_count AS read_skip_count,
    (o.step).process_skip_count AS process_skip_count,
    (o.step).write_skip_count AS write_skip_count,
    (o.step).no_rollback_count AS no_rollback_count
FROM pybatch.create_step_execution(:job_execution_id, :step_name, :now) AS o;
