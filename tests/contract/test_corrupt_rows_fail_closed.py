"""Fail closed on corrupt rows, lost commits and out-of-range ids.

Corrupt rows are written behind pybatch's back through the `admin` connection after the
CHECK constraint that would refuse them is dropped (the CHECK
constraints make such rows unwritable, and the decoders still refuse them). Every read path
of the corrupted row must raise Unavailable, never decode a default. Each case gets its own
instance, so one database serves all cases of a table; a control case with no corruption
proves that every path works on a healthy row.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest

from pybatch import JobRepository, UnitOfWork
from pybatch._chunks import load_committed_state
from pybatch.errors import (
    CommitOutcomeUnknown,
    IdentifierOutOfRange,
    Unavailable,
)
from pybatch.values.chunks import ChunkContext
from pybatch.values.definitions import DefinitionIdentity
from pybatch.values.ids import FailureId
from pybatch.values.lifecycle import LifecycleTransition
from pybatch.values.names import JobName, StepName
from pybatch.values.parameters import JobInstanceKey, JobParameters, ParameterValue
from pybatch.values.status import BatchStatus, FailureCategory, FailureSummary
from tests.support.clock import ManualClock
from tests.support.owners import TEST_OWNER
from tests.support.race import terminate_backend
from tests.support.statements import create_step

S = BatchStatus
FAILURE = FailureSummary(FailureCategory.USER_COMPONENT, FailureId(11))
BIG = 2**63  # one above PostgreSQL bigint


@dataclass(frozen=True)
class Arranged:
    """One case's rows: attempt 1 FAILED with step `extract` STARTED; attempt 2 FAILED."""

    key: JobInstanceKey
    instance_id: int
    first_id: int
    step_id: int
    latest_id: int


def arrange(repository: JobRepository, clock: ManualClock, case: str) -> Arranged:
    key = JobInstanceKey(
        JobName("corrupt"),
        JobParameters.of({"day": "2026-01-01", "n": 5, "big": ParameterValue.u64(7), "case": case}),
    )
    with repository.begin() as uow:
        instance = uow.instances.select_or_create(key).instance
        first = uow.executions.create(instance.id)
        step = create_step(uow, first.id, StepName("extract"))
        uow.steps.transition(step.id, 0, LifecycleTransition.new(S.STARTED, clock.advance()))
        uow.executions.transition(first.id, 0, LifecycleTransition.failed(clock.advance(), FAILURE))
        latest = uow.executions.create(instance.id)
        uow.executions.transition(
            latest.id, 0, LifecycleTransition.failed(clock.advance(), FAILURE)
        )
        uow.commit()
    return Arranged(key, instance.id, first.id, step.id, latest.id)


Path = Callable[[UnitOfWork, Arranged, ManualClock], object]


def outcome(repository: JobRepository, clock: ManualClock, rows: Arranged, path: Path) -> str:
    """Run one read path in its own unit of work, rolled back; report what happened."""
    with repository.begin() as uow:
        try:
            path(uow, rows, clock)
        except Unavailable as error:
            # Fail closed without leaking the stored value into the message.
            assert str(error) == "repository is unavailable", str(error)
            return "Unavailable"
        except Exception as error:
            return type(error).__name__
        return "ok"


def loosen_schema(admin: psycopg.Connection[Any], cases: dict[str, tuple[str, ...]]) -> None:
    """Run every case's DDL before any row is arranged.

    A column that changes type under a prepared statement fails it with "cached plan must
    not change result type", so the pooled connections must not have prepared anything yet.
    """
    # The planted rows bypass every guard: the constraint triggers of step_execution (its
    # open-step check of migration 0006 and its cross-column rules) depend on the columns they
    # watch, so they go before any column changes type; so do the rules of job_execution
    # (migration 0021: its CHECKs became one trigger).
    triggers = admin.execute(
        "SELECT tgname FROM pg_trigger"
        " WHERE tgrelid = 'pybatch.step_execution'::regclass AND NOT tgisinternal"
    ).fetchall()
    for (trigger,) in triggers:
        admin.execute(f"DROP TRIGGER {trigger} ON pybatch.step_execution")
    admin.execute("DROP TRIGGER job_execution_rules ON pybatch.job_execution")
    for statements in cases.values():
        for sql in statements:
            if sql.startswith("ALTER"):
                admin.execute(sql)


def run_cases(
    repository: JobRepository,
    clock: ManualClock,
    admin: psycopg.Connection[Any],
    cases: dict[str, tuple[str, ...]],
    paths: dict[str, Path],
    *,
    copied: frozenset[str] = frozenset(),
    copy_path: tuple[str, Path] | None = None,
) -> None:
    """Arrange every case, corrupt it with its SQL, then run every path against it.

    `cases` maps a case name to its SQL (ALTER TABLE ... DROP CONSTRAINT or ALTER COLUMN
    ... TYPE, then an UPDATE with `%(case)s` and the row ids as parameters). `copy_path` runs
    only for the cases in `copied`: the columns a restart step copies from its source.
    """
    loosen_schema(admin, cases)
    arranged = {case: arrange(repository, clock, case) for case in ["control", *cases]}
    for case, statements in cases.items():
        rows = arranged[case]
        for sql in statements:
            if sql.startswith("ALTER"):
                continue
            params = {
                "instance_id": rows.instance_id,
                "first_id": rows.first_id,
                "step_id": rows.step_id,
                "latest_id": rows.latest_id,
            }
            changed = admin.execute(sql, params if "%(" in sql else None)
            if sql.startswith("UPDATE"):
                assert changed.rowcount == 1, (case, sql)
    observed: dict[tuple[str, str], str] = {}
    expected: dict[tuple[str, str], str] = {}
    for case, rows in arranged.items():
        case_paths = dict(paths)
        if copy_path is not None and (case in copied or case == "control"):
            case_paths[copy_path[0]] = copy_path[1]
        for name, path in case_paths.items():
            observed[case, name] = outcome(repository, clock, rows, path)
            expected[case, name] = "ok" if case == "control" else "Unavailable"
    assert observed.keys() == expected.keys()
    mismatches = {
        f"{case} / {path}": f"expected {expected[case, path]}, got {got}"
        for (case, path), got in observed.items()
        if got != expected[case, path]
    }
    assert mismatches == {}


# --------------------------------------------------------------------------- N5: job executions


def _transition_latest(uow: UnitOfWork, rows: Arranged, clock: ManualClock) -> object:
    return uow.executions.transition(
        rows.latest_id, 1, LifecycleTransition.new(S.ABANDONED, clock.advance())
    )


JOB_PATHS: dict[str, Path] = {
    "get_job_execution": lambda uow, rows, clock: _present(uow.executions.get(rows.latest_id)),
    "job_executions": lambda uow, rows, clock: uow.executions.of_instance(rows.instance_id),
    "transition_job_execution": _transition_latest,
    "create_job_execution (reads the latest attempt)": lambda uow, rows, clock: (
        uow.executions.create(rows.instance_id)
    ),
    "create_step_execution (reads its job execution)": lambda uow, rows, clock: create_step(
        uow, rows.latest_id, StepName("extract")
    ),
}


def _present(value: object) -> object:
    assert value is not None
    return value


def test_corrupt_job_execution_rows_fail_closed(
    repository: JobRepository, clock: ManualClock, admin: psycopg.Connection[Any]
) -> None:
    """Scenario N5."""
    je = "pybatch.job_execution"
    cases: dict[str, tuple[str, ...]] = {
        "unknown status": (f"UPDATE {je} SET status = 'RUNNING' WHERE id = %(latest_id)s",),
        "lower-case status": (f"UPDATE {je} SET status = 'failed' WHERE id = %(latest_id)s",),
        "unknown failure category": (
            f"UPDATE {je} SET failure_category = 'MYSTERY' WHERE id = %(latest_id)s",
        ),
        "exit code over 64 bytes": (
            f"UPDATE {je} SET exit_code = repeat('X', 65) WHERE id = %(latest_id)s",
        ),
        "failure category without id": (
            f"UPDATE {je} SET failure_id = NULL WHERE id = %(latest_id)s",
        ),
        "failure id without category": (
            f"UPDATE {je} SET failure_category = NULL WHERE id = %(latest_id)s",
        ),
        "negative version": (f"UPDATE {je} SET version = -1 WHERE id = %(latest_id)s",),
        "UNKNOWN with an end time": (
            f"UPDATE {je} SET status = 'UNKNOWN', failure_category = NULL, failure_id = NULL "
            "WHERE id = %(latest_id)s",
        ),
    }
    run_cases(repository, clock, admin, cases, JOB_PATHS)


# --------------------------------------------------------------------------- N5: step executions


STEP_PATHS: dict[str, Path] = {
    "get_step_execution": lambda uow, rows, clock: _present(uow.steps.get(rows.step_id)),
    "step_executions": lambda uow, rows, clock: uow.steps.of_execution(rows.first_id),
    # The arranged step ended FAILED with its execution (version 2): ABANDONED is still open to it.
    "transition_step_execution": lambda uow, rows, clock: uow.steps.transition(
        rows.step_id, 2, LifecycleTransition.new(S.ABANDONED, clock.advance())
    ),
}
RESTART_COPY: tuple[str, Path] = (
    "create_step_execution (restart copies the step)",
    lambda uow, rows, clock: create_step(uow, rows.latest_id, StepName("extract")),
)


SE = "pybatch.step_execution"
STEP_WHERE = "WHERE id = %(step_id)s"


def _loosen(column: str, base_type: str) -> str:
    """Take `column` off its domain (migration 0003), so a value the domain refuses fits."""
    return f"ALTER TABLE {SE} ALTER COLUMN {column} TYPE {base_type}"


def _set(column: str, base_type: str, value: str) -> tuple[str, str]:
    """Loosen `column` and store `value` (an SQL literal) in the arranged step."""
    return (_loosen(column, base_type), f"UPDATE {SE} SET {column} = {value} {STEP_WHERE}")


#: One case per column whose rule is a domain: the value each domain refuses (counters and
#: versions below zero, names empty or over 128 bytes, codes over 64, formats and versions 0,
#: payloads that are not objects, unknown enum codes).
STEP_COLUMN_CASES: dict[str, tuple[str, ...]] = {
    "empty step name": _set("step_name", "text", "''"),
    "logical id over 128 bytes": _set("step_logical_id", "text", "repeat('n', 129)"),
    "unknown status": _set("status", "text", "'PAUSED'"),
    "exit code over 64 bytes": _set("exit_code", "text", "repeat('Y', 65)"),
    "negative read counter": _set("read_count", "bigint", "-1"),
    "negative processed counter": _set("processed_count", "bigint", "-1"),
    "negative write counter": _set("write_count", "bigint", "-1"),
    "negative filter counter": _set("filter_count", "bigint", "-1"),
    "negative commit counter": _set("commit_count", "bigint", "-1"),
    "negative rollback counter": _set("rollback_count", "bigint", "-5"),
    "checkpoint format 0": _set("checkpoint_format", "smallint", "0"),
    "empty checkpoint schema": _set("checkpoint_schema", "text", "''"),
    "checkpoint schema version 0": _set("checkpoint_schema_version", "integer", "0"),
    "checkpoint payload not an object": _set("checkpoint_payload", "jsonb", "'[1, 2]'"),
    "context format 0": _set("context_format", "smallint", "0"),
    "context schema over 128 bytes": _set("context_schema", "text", "repeat('c', 129)"),
    "context schema version 0": _set("context_schema_version", "integer", "0"),
    "context payload not an object": _set("context_payload", "jsonb", "'\"x\"'"),
    "unknown failure category": (
        _loosen("failure_category", "text"),
        f"UPDATE {SE} SET failure_category = 'MYSTERY', failure_id = 8 {STEP_WHERE}",
    ),
    "failure id 0": (
        _loosen("failure_id", "bigint"),
        f"UPDATE {SE} SET failure_category = 'TIMEOUT', failure_id = 0 {STEP_WHERE}",
    ),
    "negative version": _set("version", "bigint", "-1"),
    "negative read retry counter": _set("read_retry_count", "bigint", "-1"),
    "negative process retry counter": _set("process_retry_count", "bigint", "-1"),
    "negative write retry counter": _set("write_retry_count", "bigint", "-1"),
    "negative read skip counter": _set("read_skip_count", "bigint", "-1"),
    "negative process skip counter": _set("process_skip_count", "bigint", "-1"),
    "negative write skip counter": _set("write_skip_count", "bigint", "-1"),
    "negative no-rollback counter": _set("no_rollback_count", "bigint", "-1"),
}

#: The fault-state columns: only the chunk and fault-state paths decode them.
FAULT_STATE_COLUMN_CASES: dict[str, tuple[str, ...]] = {
    "fault state format 2": _set("fault_state_format", "smallint", "2"),
    "empty fault state schema": _set("fault_state_schema", "text", "''"),
    "fault state schema version 2": _set("fault_state_schema_version", "integer", "2"),
    "fault state payload not an object": _set("fault_state_payload", "jsonb", "'[]'"),
    "fault state checksum of 1 byte": _set("fault_state_checksum", "bytea", "'\\x00'"),
}


def test_corrupt_step_execution_rows_fail_closed(
    repository: JobRepository, clock: ManualClock, admin: psycopg.Connection[Any]
) -> None:
    """Scenario N5."""
    deep = '{"a":' * 70 + "1" + "}" * 70
    cases: dict[str, tuple[str, ...]] = {
        **STEP_COLUMN_CASES,
        # The arranged step ended FAILED with its execution, so it has a category and an id.
        # The rules of both (failure_shape, failed_has_failure) are triggers loosen_schema drops.
        "failure id without category": (f"UPDATE {SE} SET failure_category = NULL {STEP_WHERE}",),
        "failure category without id": (f"UPDATE {SE} SET failure_id = NULL {STEP_WHERE}",),
        "checkpoint payload too deep": (
            f"UPDATE {SE} SET checkpoint_payload = jsonb_build_object('p', '{deep}'::jsonb) "
            + STEP_WHERE,
        ),
        "checkpoint number of 5,000 digits": (
            f"UPDATE {SE} SET checkpoint_payload = "
            "jsonb_build_object('n', repeat('9', 5000)::numeric) " + STEP_WHERE,
        ),
        "context schema id with surrounding whitespace": (
            f"UPDATE {SE} SET context_schema = ' oxide_batch.empty.v1' {STEP_WHERE}",
        ),
        "unsupported checkpoint format": (f"UPDATE {SE} SET checkpoint_format = 2 {STEP_WHERE}",),
    }
    # A restart copies the counters and the state columns from its source step.
    copied = frozenset(
        case for case in cases if any(part in case for part in ("counter", "checkpoint", "context"))
    )
    run_cases(repository, clock, admin, cases, STEP_PATHS, copied=copied, copy_path=RESTART_COPY)


def _chunk_state(repository: JobRepository, rows: Arranged) -> str:
    """What the chunk path makes of the arranged step's committed state."""
    try:
        load_committed_state(repository, ChunkContext(rows.step_id, rows.first_id, TEST_OWNER))
    except Exception as error:
        return type(error).__name__
    return "ok"


def test_corrupt_chunk_state_fails_closed(
    repository: JobRepository, clock: ManualClock, admin: psycopg.Connection[Any]
) -> None:
    """Every column the chunk path decodes: FaultStateCorrupt for the fault state, else
    Unavailable; a healthy step decodes.

    Scenario N5.
    """
    chunk_columns = ("status", "count", "counter", "checkpoint", "context", "version")
    cases = {
        case: sql
        for case, sql in STEP_COLUMN_CASES.items()
        if any(part in case for part in chunk_columns)
        and not any(part in case for part in ("retry", "skip", "no-rollback"))
    }
    cases.update(FAULT_STATE_COLUMN_CASES)
    loosen_schema(admin, cases)
    arranged = {case: arrange(repository, clock, case) for case in ["control", *cases]}
    for case, statements in cases.items():
        for sql in statements:
            if not sql.startswith("ALTER"):
                admin.execute(sql, {"step_id": arranged[case].step_id})
    observed = {case: _chunk_state(repository, rows) for case, rows in arranged.items()}
    expected = {
        case: "ok"
        if case == "control"
        else "FaultStateCorrupt"
        if case in FAULT_STATE_COLUMN_CASES
        else "Unavailable"
        for case in arranged
    }
    assert observed == expected


# --------------------------------------------------------------------------- N5: job instances


INSTANCE_PATHS: dict[str, Path] = {
    "get_job_instance": lambda uow, rows, clock: _present(uow.instances.get(rows.instance_id)),
    "find_job_instance": lambda uow, rows, clock: _present(uow.instances.find(rows.key)),
    "select_or_create_job_instance": lambda uow, rows, clock: uow.instances.select_or_create(
        rows.key
    ),
    "create_job_execution (reads the instance)": lambda uow, rows, clock: uow.executions.create(
        rows.instance_id, DefinitionIdentity.LEGACY
    ),
}


def test_corrupt_job_instance_rows_fail_closed(
    repository: JobRepository, clock: ManualClock, admin: psycopg.Connection[Any]
) -> None:
    """Scenario N5."""
    ji = "pybatch.job_instance"
    where = "WHERE id = %(instance_id)s"
    cases: dict[str, tuple[str, ...]] = {
        "unknown type tag": (
            f"UPDATE {ji} SET identifying_parameters = "
            f"jsonb_set(identifying_parameters, '{{day,type}}', '\"date\"') {where}",
        ),
        "upper-case type tag": (
            f"UPDATE {ji} SET identifying_parameters = "
            f"jsonb_set(identifying_parameters, '{{n,type}}', '\"I64\"') {where}",
        ),
        "missing type tag": (
            f"UPDATE {ji} SET identifying_parameters = "
            f"identifying_parameters #- '{{big,type}}' {where}",
        ),
        "parameters not an object": (
            f"ALTER TABLE {ji} DROP CONSTRAINT job_instance_identifying_parameters_object",
            f"UPDATE {ji} SET identifying_parameters = '[]' {where}",
        ),
        "parameter marked non-identifying": (
            f"UPDATE {ji} SET identifying_parameters = "
            f"jsonb_set(identifying_parameters, '{{day,identifying}}', 'false') {where}",
        ),
        "u64 value out of range": (
            f"UPDATE {ji} SET identifying_parameters = "
            f"jsonb_set(identifying_parameters, '{{big,value}}', '18446744073709551616') {where}",
        ),
        "i64 value is a boolean": (
            f"UPDATE {ji} SET identifying_parameters = "
            f"jsonb_set(identifying_parameters, '{{n,value}}', 'true') {where}",
        ),
        "key digest does not match the parameters": (
            f"UPDATE {ji} SET identifying_parameters = "
            f"jsonb_set(identifying_parameters, '{{day,value}}', '\"2099-12-31\"') {where}",
        ),
    }
    run_cases(repository, clock, admin, cases, INSTANCE_PATHS)


# --------------------------------------------------------------------------- N9


def test_a_lost_commit_acknowledgement_is_commit_outcome_unknown(
    repository: JobRepository, clock: ManualClock, admin: psycopg.Connection[Any]
) -> None:
    """Scenario N9."""
    key = JobInstanceKey(JobName("lost_ack"), JobParameters.of({"day": "2026-02-02"}))
    with repository.begin() as uow:
        instance = uow.instances.select_or_create(key).instance
        execution = uow.executions.create(instance.id)
        pid = uow.connection.info.backend_pid
        state = admin.execute("SELECT state FROM pg_stat_activity WHERE pid = %s", (pid,))
        assert state.fetchone() == ("idle in transaction",)
        terminate_backend(admin, pid)
        with pytest.raises(CommitOutcomeUnknown):
            uow.commit()
        assert not uow.is_open
    # A fresh unit of work (on a new pooled connection) sees the true outcome: the server
    # rolled the transaction back when its backend ended before COMMIT arrived.
    with repository.begin() as uow:
        assert uow.instances.find(key) is None
        assert uow.executions.get(execution.id) is None
        assert uow.connection.info.backend_pid != pid
        relaunched = uow.executions.create(uow.instances.select_or_create(key).instance.id)
        uow.commit()
    assert relaunched.attempt == 1


# --------------------------------------------------------------------------- N10


def test_identifiers_above_bigint_are_out_of_range(
    repository: JobRepository, clock: ManualClock
) -> None:
    """Scenario N10."""
    t = LifecycleTransition.new(S.STARTED, clock.now())
    calls: dict[str, tuple[Callable[[UnitOfWork], object], str]] = {
        "get_job_instance": (lambda uow: uow.instances.get(BIG), "job instance"),
        "create_job_execution": (lambda uow: uow.executions.create(BIG), "job instance"),
        "job_executions": (lambda uow: uow.executions.of_instance(BIG), "job instance"),
        "get_job_execution": (lambda uow: uow.executions.get(BIG), "job execution"),
        "transition_job_execution": (
            lambda uow: uow.executions.transition(BIG, 0, t),
            "job execution",
        ),
        "create_step_execution": (
            lambda uow: create_step(uow, BIG, StepName("s")),
            "job execution",
        ),
        "step_executions": (lambda uow: uow.steps.of_execution(BIG), "job execution"),
        "get_step_execution": (lambda uow: uow.steps.get(BIG), "step execution"),
        "transition_step_execution": (
            lambda uow: uow.steps.transition(BIG, 0, t),
            "step execution",
        ),
    }
    with repository.begin() as uow:
        for name, (call, kind) in calls.items():
            with pytest.raises(IdentifierOutOfRange) as out_of_range:
                call(uow)
            assert (out_of_range.value.kind, out_of_range.value.value) == (kind, BIG), name
            assert str(out_of_range.value) == f"{kind} identifier {BIG} exceeds PostgreSQL bigint"
        # The largest bigint itself is in range: it is simply not there.
        assert uow.executions.get(BIG - 1) is None
        assert uow.steps.get(BIG - 1) is None
        assert uow.instances.get(BIG - 1) is None


def test_a_failure_id_above_bigint_is_out_of_range_and_changes_nothing(
    repository: JobRepository, clock: ManualClock
) -> None:
    """Scenario N10."""
    huge = FailureSummary(FailureCategory.TIMEOUT, FailureId(BIG))  # a valid u64, but not storable
    with repository.begin() as uow:  # a live step: only an unfinished step can still fail
        fresh = JobInstanceKey(JobName("corrupt"), JobParameters.of({"case": "failure-id-live"}))
        restart = uow.executions.create(uow.instances.select_or_create(fresh).instance.id)
        step = create_step(uow, restart.id, StepName("extract"))
        step = uow.steps.transition(
            step.id, step.version, LifecycleTransition.new(S.STARTED, clock.advance())
        )
        with pytest.raises(IdentifierOutOfRange) as out_of_range:
            uow.steps.transition(
                step.id, step.version, LifecycleTransition.failed(clock.advance(), huge)
            )
        assert (out_of_range.value.kind, out_of_range.value.value) == ("failure", BIG)
        with pytest.raises(IdentifierOutOfRange):
            uow.executions.transition(
                restart.id, 0, LifecycleTransition.failed(clock.advance(), huge)
            )
        assert uow.steps.get(step.id) == step


def test_an_expected_version_above_bigint_is_unavailable(
    repository: JobRepository, clock: ManualClock
) -> None:
    """Scenario N10."""
    rows = arrange(repository, clock, "version")
    t = LifecycleTransition.new(S.ABANDONED, clock.advance())
    with repository.begin() as uow:
        for call in (
            lambda: uow.executions.transition(rows.latest_id, BIG, t),
            lambda: uow.steps.transition(rows.step_id, BIG, t),
        ):
            with pytest.raises(Unavailable):
                call()
