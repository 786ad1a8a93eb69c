-- Migration: a run's end checks its steps on generic plans, planned once per session, not again
-- at every end.
--
-- Why: two statements run at every run's end with the execution's id as their parameter.
-- end_job_execution reads the run's first unfinished step before it completes it
-- (StepsUnfinished, migration 0024), and the deferred trigger
-- job_execution_finished_has_no_open_step, at the COMMIT of every end, checks that no step is
-- still open under the finished execution (check_finished_execution_has_no_open_step). As for
-- end_unfinished_steps (migration 0022), PostgreSQL's plan cache plans such a statement for its
-- values five times, then keeps the generic plan only if its estimate is no worse. Where the
-- history holds partitioned steps, the generic estimate of "the steps of one execution" is the
-- history's average (hundreds of worker steps per partitioned run) and loses to a plan for the
-- new execution's id (past the statistics: one step), so both were planned again at every end:
-- 0.15 ms of a one-step job's 1.3 ms of server CPU on a development database whose 48,000 runs
-- include partitioned ones (200,000 partitions). Their generic plans read the execution's row
-- and its steps through indexes on the execution's id, as the custom plans do, so both
-- functions now always run them. On a database of one-step runs the generic plans already won
-- and nothing changes, as for the trigger function's step branch, which already ran its
-- generic plan.
--
-- Locks: ALTER FUNCTION rewrites one pg_proc row each; no table is locked and running jobs
-- are not blocked. A session picks the settings up at its next call: the catalog change
-- invalidates the plans that call the functions.

ALTER FUNCTION pybatch.end_job_execution(
    BIGINT, BYTEA, TEXT, TEXT, TEXT, TEXT, TEXT, TEXT, TEXT, TIMESTAMPTZ
)
SET plan_cache_mode = force_generic_plan;

ALTER FUNCTION pybatch.check_finished_execution_has_no_open_step()
SET plan_cache_mode = force_generic_plan;
