-- Migration: partition worker leases.
--
-- A partition worker's liveness was evidenced only by a session-level advisory lock on its
-- worker step, held on an idle connection: a killed idle session (idle_session_timeout,
-- pg_terminate_backend) lost it while the worker went on, so another worker recovered a
-- partition that was still being worked on, and any role able to connect could take the key
-- of a dead worker and block the recovery of its partition for ever. Ownership of a claimed
-- partition is now row state, as for job executions (migration 0004): the claiming worker's
-- owner token and a lease expiry that it renews on the database clock. They live on the
-- partition because the partition is what a worker claims and what a recovery hands on: the
-- claim sets both, the owner renews them, and the end or the recovery of the worker clears
-- them in the statement that moves the partition out of STARTED.
--
-- Existing rows: nothing is moved. A STARTED partition keeps worker_owner_token and
-- worker_lease_expires_at NULL: it was claimed before this migration by a worker that still
-- holds the advisory lock, and pybatch keeps probing that lock for partitions without a lease
-- only (as migration 0004 did for executions), so an upgrade under live workers never
-- recovers a partition whose worker is alive. Partitions in other statuses have no owner.
--
-- Lint: ADD COLUMN without a default and CHECK constraints over NULL columns rewrite nothing;
-- the validating scans find only NULLs.

ALTER TABLE pybatch.step_partition
ADD COLUMN worker_owner_token BYTEA,
ADD COLUMN worker_lease_expires_at TIMESTAMPTZ;

ALTER TABLE pybatch.step_partition
ADD CONSTRAINT step_partition_worker_owner_token_length
CHECK (OCTET_LENGTH(worker_owner_token) = 16),
-- A lease always belongs to a recorded owner token.
ADD CONSTRAINT step_partition_worker_lease_has_owner
CHECK (worker_lease_expires_at IS NULL OR worker_owner_token IS NOT NULL),
-- Only a partition being worked on has an owner (a STARTED partition always has its worker,
-- step_partition_worker_shape).
ADD CONSTRAINT step_partition_worker_owner_when_started
CHECK (worker_owner_token IS NULL OR status = 'STARTED');

COMMENT ON COLUMN pybatch.step_partition.worker_owner_token IS
'Random 16-byte token of the process that claimed the partition for its current worker; '
'NULL when not STARTED, or claimed before worker leases existed (advisory-lock liveness).';
COMMENT ON COLUMN pybatch.step_partition.worker_lease_expires_at IS
'Database-clock instant until which the worker''s lease holds; renewed by the live worker. '
'Once it has passed, any worker of the plan may recover the partition. NULL: no lease.';
