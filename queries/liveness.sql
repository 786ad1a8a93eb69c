-- :name try_lock_owner_liveness :scalar
-- :doc Hold a run's session-level liveness lock, keyed by its owner token (unpredictable to
-- anyone without the token), for the life of the run; never waits. The server releases it when
-- the owning session ends, however it ends (a killed process included).
SELECT PG_TRY_ADVISORY_LOCK(CAST(:liveness_key AS BIGINT)) AS lock_acquired;

-- :name unlock_owner_liveness :scalar
-- :doc Release the liveness lock taken by try_lock_owner_liveness.
SELECT PG_ADVISORY_UNLOCK(CAST(:liveness_key AS BIGINT)) AS lock_released;

-- :name try_lock_job_execution_liveness :scalar
-- :doc Probe the session-level liveness lock of an execution started before leases existed
-- (keyed by its id; runs of schema version 4 and later never take it); never waits.
SELECT PG_TRY_ADVISORY_LOCK(
    HASHTEXTEXTENDED('pybatch.job_execution.liveness', :job_execution_id)
) AS lock_acquired;

-- :name unlock_job_execution_liveness :scalar
-- :doc Release the liveness lock taken by try_lock_job_execution_liveness.
SELECT PG_ADVISORY_UNLOCK(
    HASHTEXTEXTENDED('pybatch.job_execution.liveness', :job_execution_id)
) AS lock_released;

-- :name try_lock_step_execution_liveness :scalar
-- :doc Hold the session-level liveness lock of a partition worker step for as long as its
-- process works on it; the server releases it when the session ends, however it ends.
SELECT PG_TRY_ADVISORY_LOCK(
    HASHTEXTEXTENDED('pybatch.step_execution.liveness', :step_execution_id)
) AS lock_acquired;

-- :name unlock_step_execution_liveness :scalar
-- :doc Release the liveness lock taken by try_lock_step_execution_liveness.
SELECT PG_ADVISORY_UNLOCK(
    HASHTEXTEXTENDED('pybatch.step_execution.liveness', :step_execution_id)
) AS lock_released;
