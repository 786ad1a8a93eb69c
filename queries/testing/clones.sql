-- :name count_database_sessions :scalar
-- :doc pybatch.testing - how many sessions are connected to a database. CREATE DATABASE and DROP
-- DATABASE find a session still there (one closed a moment ago whose backend has not exited yet)
-- and then sleep 100 ms before they look again, so the clone pool waits for the count to reach 0.
SELECT pg_catalog.COUNT(*) AS sessions
FROM pg_stat_activity AS a
WHERE a.datname = :datname;

-- :name clone_template :affected
-- :doc pybatch.testing - a test's fresh database, a copy of the migrated template (PostgreSQL 13
-- and 14, which copy the template's files after a checkpoint). The two parameters are database
-- names, quoted as identifiers by Statement.run_with_identifiers: CREATE DATABASE binds nothing.
CREATE DATABASE :database TEMPLATE :template;

-- :name drop_test_database :affected
-- :doc pybatch.testing - drop a test's database once its test is over; FORCE ends whatever
-- sessions the test left open. The parameter is a database name, quoted as an identifier.
DROP DATABASE IF EXISTS :database WITH (FORCE);

-- :name clone_template_by_file_copy :affected
-- :doc pybatch.testing - a test's fresh database on PostgreSQL 15 and later, copied file by file
-- as on 13 and 14: the default strategy there (WAL_LOG) also writes every page of the template
-- to the WAL, up to 3 times slower for a template this small. sqlfluff's postgres dialect has
-- no STRATEGY clause yet, hence the noqa, and this statement is the last of its file: sqlfluff
-- stops parsing a file at its first unparsable statement (tests/sql checks the position).
CREATE DATABASE :database TEMPLATE :template STRATEGY = FILE_COPY; -- noqa: PRS
