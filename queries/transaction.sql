-- :name apply_pooled_settings :one
-- :doc Set pybatch's timeouts and UTC with statements, behind a connection pooler that
-- refuses startup options - for the session (pool_mode=session, once per connection) or,
-- with transaction_only, for the current transaction alone (pool_mode=transaction, first
-- statement of every transaction). Returns the values now in force.
SELECT
    pg_catalog.SET_CONFIG(
        'statement_timeout', :statement_timeout, :transaction_only
    ) AS statement_timeout,
    pg_catalog.SET_CONFIG('lock_timeout', :lock_timeout, :transaction_only) AS lock_timeout,
    pg_catalog.SET_CONFIG(
        'idle_in_transaction_session_timeout',
        :idle_in_transaction_session_timeout,
        :transaction_only
    ) AS idle_in_transaction_session_timeout,
    pg_catalog.SET_CONFIG('TimeZone', :time_zone, :transaction_only) AS time_zone;

-- :name read_session_settings :many
-- :doc The settings pybatch relies on as the server runs them, the timeouts in milliseconds
-- as pg_settings counts them, read once per new connection: a pooler that dropped the
-- startup options is refused (SettingsNotApplied) instead of running without timeouts.
-- current_setting reads one setting where pg_settings builds every one of them (1.0 ms
-- on a new connection, against 0.5); it writes a timeout in its largest whole unit ('30s',
-- '1min'), which the cast to INTERVAL reads back.
SELECT
    s.name,
    CASE
        WHEN s.name LIKE '%timeout'
            THEN CAST(
                CAST(
                    EXTRACT(EPOCH FROM CAST(pg_catalog.CURRENT_SETTING(s.name) AS INTERVAL))
                    * 1000 AS BIGINT
                ) AS TEXT
            )
        ELSE pg_catalog.CURRENT_SETTING(s.name)
    END AS setting
FROM (
    VALUES
    ('statement_timeout'),
    ('lock_timeout'),
    ('idle_in_transaction_session_timeout'),
    ('TimeZone'),
    ('default_transaction_isolation')
) AS s (name);

-- :name short_transaction_settings :one
-- :doc The settings of a hot path's short transaction, for that transaction alone: its COMMIT
-- returns before its WAL is flushed (synchronous_commit off), and its prepared statements run
-- their generic plan from their first execution (plan_cache_mode force_generic_plan). Sent
-- first in the pipeline of a step's start, of a step's end, and of a partition worker's end of
-- a partition with its claim of the next, and of nothing else. Why those commits may skip the
-- flush: docs/contract.md, Durability of commits. Generic plans: on its own connection a
-- worker would otherwise plan its claim and its end afresh for their first five executions,
-- about 6 ms of server CPU per worker process; afterwards PostgreSQL runs these statements'
-- generic plans anyway, so forcing them changes no plan, only when it is made.
SELECT
    pg_catalog.SET_CONFIG('synchronous_commit', 'off', TRUE) AS synchronous_commit,
    pg_catalog.SET_CONFIG('plan_cache_mode', 'force_generic_plan', TRUE) AS plan_cache_mode;

-- :name commit_transaction :affected
-- :doc Commit the transaction begin_read_committed opened, in the same pipeline; an error
-- before it leaves the transaction failed and nothing committed.
COMMIT;

-- :name begin_read_committed :affected
-- :doc Behind a pooler, open a transaction that commits in the same round trip
-- (UnitOfWork.commit_statement): sent in one pipeline with its one statement and
-- commit_transaction, on a connection in autocommit so the driver adds no BEGIN of its own;
-- READ COMMITTED whatever the database's default, and READ WRITE. sqlfluff's postgres dialect
-- cannot parse the transaction modes, hence the noqa, and this statement is the last of its
-- file (tests/sql checks it).
BEGIN ISOLATION LEVEL READ COMMITTED READ WRITE; -- noqa: PRS
