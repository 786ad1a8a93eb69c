-- :name set_transaction_timeouts :scalar
-- :doc Apply the configured timeouts to the current transaction only (schema.md 4.1).
-- set_config(..., true) is SET LOCAL with bound values; everything reverts at COMMIT/ROLLBACK.
SELECT
    SET_CONFIG('statement_timeout', :statement_timeout_ms, TRUE) AS statement_timeout,
    SET_CONFIG('lock_timeout', :lock_timeout_ms, TRUE) AS lock_timeout,
    SET_CONFIG(
        'idle_in_transaction_session_timeout', :idle_transaction_timeout_ms, TRUE
    ) AS idle_in_transaction_session_timeout;

-- :name set_session_time_zone :scalar
-- :doc Make every timestamptz of this pooled connection come back in UTC (schema.md 4.5).
SELECT SET_CONFIG('TimeZone', 'UTC', FALSE) AS time_zone;

-- :name get_transaction_settings :one
-- :doc Read back the isolation level and timeouts in force (used by tests and diagnostics).
SELECT
    CURRENT_SETTING('transaction_isolation') AS transaction_isolation,
    CURRENT_SETTING('statement_timeout') AS statement_timeout,
    CURRENT_SETTING('lock_timeout') AS lock_timeout,
    CURRENT_SETTING('idle_in_transaction_session_timeout')
        AS idle_in_transaction_session_timeout,
    CURRENT_SETTING('TimeZone') AS time_zone;

-- :name set_session_lock_timeout :scalar
-- :doc Bound every lock wait of a migrator connection, the advisory lock included (schema.md 6.1).
SELECT SET_CONFIG('lock_timeout', :lock_timeout_ms, FALSE) AS lock_timeout;
