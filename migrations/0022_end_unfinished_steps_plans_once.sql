-- Migration: end_unfinished_steps runs its two statements on generic plans, planned once per
-- session, not again at every call.
--
-- Why: every run's end calls end_unfinished_steps (through end_job_execution), which locks and
-- ends the execution's unfinished steps and releases their claimed partitions. Both statements
-- take the execution id as a parameter. PostgreSQL's plan cache plans a parameterized statement
-- for its values five times, then keeps the generic plan only if its estimate is no worse than
-- theirs. On a database whose history holds partitioned steps (hundreds of worker steps in some
-- executions), the generic estimate (the average number of steps per execution) lost to the
-- custom one for a new execution's id (past the statistics: one step), so both statements were
-- planned again at every run's end: 0.3 ms of a one-step job's 1.7-1.9 ms of server CPU there.
-- The generic plans are the index scans the custom plans chose (step_execution_execution_identity
-- for the steps, then step_partition_parent_identity for their partitions), so the function now
-- always runs them; where the generic plan already won, nothing changes.
--
-- Locks: ALTER FUNCTION rewrites one pg_proc row; running jobs are not blocked. A session picks
-- the setting up at its next call: the catalog change invalidates the plans that call the
-- function.

ALTER FUNCTION pybatch.end_unfinished_steps(BIGINT, TEXT, TEXT, TIMESTAMPTZ)
SET plan_cache_mode = force_generic_plan;
