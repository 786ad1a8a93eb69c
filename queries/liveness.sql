-- :name try_lock_job_execution_liveness :scalar
-- :doc Hold the session-level liveness lock of an execution for the life of its run; the server
-- releases it when the owning session ends, however it ends (a killed process included).
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
