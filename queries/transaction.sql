-- :name get_transaction_settings :one
-- :doc Read back the isolation level and timeouts in force (used by tests and diagnostics).
SELECT
    CURRENT_SETTING('transaction_isolation') AS transaction_isolation,
    CURRENT_SETTING('statement_timeout') AS statement_timeout,
    CURRENT_SETTING('lock_timeout') AS lock_timeout,
    CURRENT_SETTING('idle_in_transaction_session_timeout')
        AS idle_in_transaction_session_timeout,
    CURRENT_SETTING('TimeZone') AS time_zone;
