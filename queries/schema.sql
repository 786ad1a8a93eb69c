-- :name read_schema_version :scalar
-- :doc Installed schema version; relies on the schema_version singleton (docs/tables.md 2.1).
SELECT sv.version
FROM pybatch.schema_version AS sv
WHERE sv.singleton;

-- :name set_migrator_transaction_settings :one
-- :doc The migrator's own bounds, first in each of its transactions: no statement timeout (a
-- migration may be long), the configured lock and idle-in-transaction timeouts, UTC. Local to
-- the transaction, so they beat role and database defaults and survive a transaction pooler.
SELECT
    pg_catalog.SET_CONFIG('statement_timeout', :statement_timeout, TRUE) AS statement_timeout,
    pg_catalog.SET_CONFIG('lock_timeout', :lock_timeout, TRUE) AS lock_timeout,
    pg_catalog.SET_CONFIG(
        'idle_in_transaction_session_timeout', :idle_in_transaction_session_timeout, TRUE
    ) AS idle_in_transaction_session_timeout,
    pg_catalog.SET_CONFIG('TimeZone', :time_zone, TRUE) AS time_zone;

-- :name lock_schema_migration_history :affected
-- :doc Serialize migrators for the rest of the transaction on a lock that only the schema owner
-- (or a role granted writes on the migration history) may take, waited for at most lock_timeout.
LOCK TABLE pybatch.schema_migration IN EXCLUSIVE MODE;

-- :name create_pybatch_schema :affected
-- :doc Create the pybatch schema before the first migration file runs (docs/tables.md 7).
CREATE SCHEMA IF NOT EXISTS pybatch;

-- :name find_schema_migration_table :scalar
-- :doc Whether the migration history table exists yet (it is created by migration 0001).
SELECT pg_catalog.TO_REGCLASS('pybatch.schema_migration') IS NOT NULL AS present;

-- :name list_schema_migrations :many
-- :doc Applied migrations in order, for the checksum comparison (schema_migration_pkey).
SELECT
    sm.version,
    sm.name,
    sm.checksum
FROM pybatch.schema_migration AS sm
ORDER BY sm.version;

-- :name insert_schema_migration :affected
-- :doc Record an applied migration file in the transaction that applied it.
INSERT INTO pybatch.schema_migration (
    version, name, checksum, installed_at, installed_by, execution_ms, success
)
VALUES (
    :version,
    :name,
    :checksum,
    pg_catalog.CLOCK_TIMESTAMP(),
    CURRENT_USER,
    :execution_ms,
    TRUE
);

-- :name update_schema_version :affected
-- :doc Advance the singleton version; the guard refuses to skip a version (docs/tables.md 7).
-- Version 1 inserts the row; later versions update it only from version - 1.
INSERT INTO pybatch.schema_version AS sv (singleton, version, installed_at)
VALUES (TRUE, :version, pg_catalog.CLOCK_TIMESTAMP())
ON CONFLICT (singleton) DO UPDATE
    SET
        version = excluded.version,
        installed_at = excluded.installed_at
    WHERE sv.version = excluded.version - 1;

-- :name read_server_clock :scalar
-- :doc The database server's clock, for the connect-time clock-skew check (JobRepository.connect).
SELECT pg_catalog.CLOCK_TIMESTAMP() AS server_time;
