-- :name get_transaction_settings :one
-- :doc Read back the isolation level and timeouts in force (used by tests and diagnostics).
SELECT
    pg_catalog.CURRENT_SETTING('transaction_isolation') AS transaction_isolation,
    pg_catalog.CURRENT_SETTING('statement_timeout') AS statement_timeout,
    pg_catalog.CURRENT_SETTING('lock_timeout') AS lock_timeout,
    pg_catalog.CURRENT_SETTING('idle_in_transaction_session_timeout')
        AS idle_in_transaction_session_timeout,
    pg_catalog.CURRENT_SETTING('TimeZone') AS time_zone;
