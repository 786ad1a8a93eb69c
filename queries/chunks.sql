-- :name get_step_chunk_state :one
-- :doc The committed chunk state of a step (counters, checkpoint, context, fault state): the first
-- chunk of a step in a process opens with it (prepared; not after a fresh partition claim, whose
-- returned row and bound empty fault state are that state), and load_committed_state reads it in
-- a read-only transaction. The row is not locked: the commit is a compare-and-swap.
SELECT
    s.id,
    s.job_execution_id,
    s.status,
    s.version,
    s.read_count,
    s.processed_count,
    s.write_count,
    s.filter_count,
    s.commit_count,
    s.rollback_count,
    s.checkpoint_format,
    s.checkpoint_schema,
    s.checkpoint_schema_version,
    s.checkpoint_payload,
    s.context_format,
    s.context_schema,
    s.context_schema_version,
    s.context_payload,
    s.fault_state_format,
    s.fault_state_schema,
    s.fault_state_schema_version,
    s.fault_state_payload,
    s.fault_state_checksum
FROM pybatch.step_execution AS s
WHERE s.id = :step_execution_id AND s.job_execution_id = :job_execution_id;

-- :name update_step_chunk_commit :affected
-- :doc Commit a chunk's progress with the business writes of the same transaction - a
-- compare-and-swap on version and STARTED; it clears retained retry reservations because the
-- checkpoint generation advances. Zero rows means another writer won, the step left STARTED, or
-- the owner no longer owns it (the fence below).
UPDATE pybatch.step_execution
SET
    read_count = :read_count,
    processed_count = :processed_count,
    write_count = :write_count,
    filter_count = :filter_count,
    commit_count = :commit_count,
    checkpoint_format = 1,
    checkpoint_schema = :checkpoint_schema,
    checkpoint_schema_version = :checkpoint_schema_version,
    checkpoint_payload = :checkpoint_payload,
    context_format = 1,
    context_schema = :context_schema,
    context_schema_version = :context_schema_version,
    context_payload = :context_payload,
    read_skip_count = read_skip_count + :read_skips,
    process_skip_count = process_skip_count + :process_skips,
    write_skip_count = write_skip_count + :write_skips,
    no_rollback_count = no_rollback_count + :no_rollbacks,
    fault_state_format = 1,
    fault_state_schema = 'oxide-batch.fault-state',
    fault_state_schema_version = 1,
    fault_state_payload = :fault_state_payload,
    fault_state_checksum = :fault_state_checksum,
    updated_at = GREATEST(updated_at, :now),
    version = version + 1
WHERE
    id = :step_execution_id
    AND job_execution_id = :job_execution_id
    AND version = :expected_version
    AND status = 'STARTED'
    -- The fence: the chunk's owner still owns the step, through its job execution (live, this
    -- owner's token). Ending an execution ends its steps in the same transaction
    -- (end_unfinished_step_executions), so the status guard above already refuses a chunk of an
    -- ended owner; this predicate also refuses one whose token was replaced. A partition worker's
    -- step commits through the partition variant instead: a step and a partition worker have
    -- separate statements, so that each plans once per connection (a parameter choosing between
    -- the two fences would make PostgreSQL re-plan the statement on every chunk).
    AND EXISTS (
        SELECT 1
        FROM pybatch.job_execution AS e
        WHERE
            e.id = :job_execution_id
            AND e.owner_token = :owner_token
            AND e.status IN ('STARTED', 'STOPPING')
    );

-- :name update_partition_chunk_commit :affected
-- :doc update_step_chunk_commit for a partition worker's step, fenced by its partition claim.
UPDATE pybatch.step_execution
SET
    read_count = :read_count,
    processed_count = :processed_count,
    write_count = :write_count,
    filter_count = :filter_count,
    commit_count = :commit_count,
    checkpoint_format = 1,
    checkpoint_schema = :checkpoint_schema,
    checkpoint_schema_version = :checkpoint_schema_version,
    checkpoint_payload = :checkpoint_payload,
    context_format = 1,
    context_schema = :context_schema,
    context_schema_version = :context_schema_version,
    context_payload = :context_payload,
    read_skip_count = read_skip_count + :read_skips,
    process_skip_count = process_skip_count + :process_skips,
    write_skip_count = write_skip_count + :write_skips,
    no_rollback_count = no_rollback_count + :no_rollbacks,
    fault_state_format = 1,
    fault_state_schema = 'oxide-batch.fault-state',
    fault_state_schema_version = 1,
    fault_state_payload = :fault_state_payload,
    fault_state_checksum = :fault_state_checksum,
    updated_at = GREATEST(updated_at, :now),
    version = version + 1
WHERE
    id = :step_execution_id
    AND job_execution_id = :job_execution_id
    AND version = :expected_version
    AND status = 'STARTED'
    -- The fence: the claiming worker still owns its partition (STARTED, this worker step, this
    -- worker's token) under a STARTED parent step of a live execution. A recovered partition's
    -- worker step is ended FAILED, so the status guard above already refuses its chunks; this
    -- predicate also refuses a worker whose claim was taken over.
    AND EXISTS (
        SELECT 1
        FROM pybatch.step_partition AS p
        INNER JOIN pybatch.step_execution AS parent ON p.step_execution_id = parent.id
        INNER JOIN pybatch.job_execution AS e ON parent.job_execution_id = e.id
        WHERE
            p.id = :step_partition_id
            AND p.worker_step_execution_id = :step_execution_id
            AND p.worker_owner_token = :owner_token
            AND p.status = 'STARTED'
            AND parent.status = 'STARTED'
            AND e.id = :job_execution_id
            AND e.status IN ('STARTED', 'STOPPING')
    );

-- :name update_step_chunk_progress :affected
-- :doc Commit the progress of a chunk that keeps the step's context and retained no faults - the
-- same compare-and-swap and fence as update_step_chunk_commit, writing only the
-- counters, the checkpoint, updated_at and version. Every column it leaves alone already holds
-- what update_step_chunk_commit would write: the version guard proves the row is the state the
-- chunk started from, which had format 1 envelopes, this context and the empty fault state.
-- Fewer assigned columns means fewer domain checks per chunk (migration 0003).
UPDATE pybatch.step_execution
SET
    read_count = :read_count,
    processed_count = :processed_count,
    write_count = :write_count,
    filter_count = :filter_count,
    commit_count = :commit_count,
    checkpoint_schema = :checkpoint_schema,
    checkpoint_schema_version = :checkpoint_schema_version,
    checkpoint_payload = :checkpoint_payload,
    updated_at = GREATEST(updated_at, :now),
    version = version + 1
WHERE
    id = :step_execution_id
    AND job_execution_id = :job_execution_id
    AND version = :expected_version
    AND status = 'STARTED'
    -- The fence: the chunk's owner still owns the step, through its job execution (live, this
    -- owner's token). Ending an execution ends its steps in the same transaction
    -- (end_unfinished_step_executions), so the status guard above already refuses a chunk of an
    -- ended owner; this predicate also refuses one whose token was replaced. A partition worker's
    -- step commits through the partition variant instead: a step and a partition worker have
    -- separate statements, so that each plans once per connection (a parameter choosing between
    -- the two fences would make PostgreSQL re-plan the statement on every chunk).
    AND EXISTS (
        SELECT 1
        FROM pybatch.job_execution AS e
        WHERE
            e.id = :job_execution_id
            AND e.owner_token = :owner_token
            AND e.status IN ('STARTED', 'STOPPING')
    );

-- :name update_partition_chunk_progress :affected
-- :doc update_step_chunk_progress for a partition worker's step, fenced by its partition claim.
UPDATE pybatch.step_execution
SET
    read_count = :read_count,
    processed_count = :processed_count,
    write_count = :write_count,
    filter_count = :filter_count,
    commit_count = :commit_count,
    checkpoint_schema = :checkpoint_schema,
    checkpoint_schema_version = :checkpoint_schema_version,
    checkpoint_payload = :checkpoint_payload,
    updated_at = GREATEST(updated_at, :now),
    version = version + 1
WHERE
    id = :step_execution_id
    AND job_execution_id = :job_execution_id
    AND version = :expected_version
    AND status = 'STARTED'
    -- The fence: the claiming worker still owns its partition (STARTED, this worker step, this
    -- worker's token) under a STARTED parent step of a live execution. A recovered partition's
    -- worker step is ended FAILED, so the status guard above already refuses its chunks; this
    -- predicate also refuses a worker whose claim was taken over.
    AND EXISTS (
        SELECT 1
        FROM pybatch.step_partition AS p
        INNER JOIN pybatch.step_execution AS parent ON p.step_execution_id = parent.id
        INNER JOIN pybatch.job_execution AS e ON parent.job_execution_id = e.id
        WHERE
            p.id = :step_partition_id
            AND p.worker_step_execution_id = :step_execution_id
            AND p.worker_owner_token = :owner_token
            AND p.status = 'STARTED'
            AND parent.status = 'STARTED'
            AND e.id = :job_execution_id
            AND e.status IN ('STARTED', 'STOPPING')
    );

-- :name update_step_chunk_rollback :affected
-- :doc Count a chunk the ETL rolled back (explicitly, or by leaving its block without a commit):
-- rollback_count advances, as its own transaction after the chunk's ROLLBACK, guarded by STARTED
-- and the same fence as update_step_chunk_progress. Zero rows means the step left STARTED or its
-- owner no longer owns it. The version stays: an increment commutes with a chunk commit (which
-- never writes rollback_count), so a chunk still open on another connection can still commit,
-- and a lifecycle transition locks the row before it reads the count it writes back.
UPDATE pybatch.step_execution
SET
    rollback_count = rollback_count + 1,
    updated_at = GREATEST(updated_at, :now)
WHERE
    id = :step_execution_id
    AND job_execution_id = :job_execution_id
    AND status = 'STARTED'
    AND EXISTS (
        SELECT 1
        FROM pybatch.job_execution AS e
        WHERE
            e.id = :job_execution_id
            AND e.owner_token = :owner_token
            AND e.status IN ('STARTED', 'STOPPING')
    );

-- :name update_partition_chunk_rollback :affected
-- :doc update_step_chunk_rollback for a partition worker's step, fenced by its partition claim.
UPDATE pybatch.step_execution
SET
    rollback_count = rollback_count + 1,
    updated_at = GREATEST(updated_at, :now)
WHERE
    id = :step_execution_id
    AND job_execution_id = :job_execution_id
    AND status = 'STARTED'
    AND EXISTS (
        SELECT 1
        FROM pybatch.step_partition AS p
        INNER JOIN pybatch.step_execution AS parent ON p.step_execution_id = parent.id
        INNER JOIN pybatch.job_execution AS e ON parent.job_execution_id = e.id
        WHERE
            p.id = :step_partition_id
            AND p.worker_step_execution_id = :step_execution_id
            AND p.worker_owner_token = :owner_token
            AND p.status = 'STARTED'
            AND parent.status = 'STARTED'
            AND e.id = :job_execution_id
            AND e.status IN ('STARTED', 'STOPPING')
    );
