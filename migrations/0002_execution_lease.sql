-- Migration 0002: execution leases (schema version 2).
--
-- A running execution's ownership was evidenced by a session-level advisory lock held on an
-- idle connection: a killed idle session (idle_session_timeout, pg_terminate_backend) lost it
-- while the run went on, and any role able to connect could take the key of a dead run and
-- block its recovery. Ownership is now row state: the owner token (already recorded by
-- claim_execution_owner) and a lease expiry that the runner renews on the database clock.
--
-- Existing rows keep lease_expires_at NULL. An unresolved execution without a lease was
-- started before this migration by a runner that still holds the advisory lock; pybatch
-- keeps probing that lock for such executions only, so upgrading under live runs never
-- recovers a run that is still alive, and those runs resume normally after a restart.

ALTER TABLE pybatch.job_execution
ADD COLUMN lease_expires_at TIMESTAMPTZ;

-- A lease always belongs to a recorded owner token. Existing rows have no lease, so the
-- validating scan finds nothing to refuse.
ALTER TABLE pybatch.job_execution
ADD CONSTRAINT job_execution_lease_has_owner
CHECK (lease_expires_at IS NULL OR owner_token IS NOT NULL);

COMMENT ON COLUMN pybatch.job_execution.lease_expires_at IS
'Database-clock instant until which the owner''s lease holds; renewed by the live runner. '
'NULL: no lease (never claimed, or started before leases existed).';
