"""The unit of work and concurrency (scenarios L1-L15).

L4 lives with the operator requests (test_operator_request_audit.py), L5 and L6 with flow steps
and recovery (test_recovery_of_orphaned_executions.py).
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import attrs
import psycopg
import pytest

from pybatch import ConnectionConfig, JobRepository, UnitOfWork
from pybatch.errors import (
    CommitOutcomeUnknown,
    CompletedInstance,
    ExecutionAlreadyActive,
    IncompatibleDefinition,
    RetryableConflict,
    StaleVersion,
    TransactionAborted,
    UnitOfWorkClosed,
)
from pybatch.values.definitions import DefinitionIdentity
from pybatch.values.ids import FailureId
from pybatch.values.lifecycle import LifecycleTransition
from pybatch.values.names import DefinitionRevision, ExitCode, JobName, StepName
from pybatch.values.parameters import JobInstanceKey, JobParameters
from pybatch.values.records import Created, Existing, JobExecution
from pybatch.values.status import BatchStatus, FailureCategory, FailureSummary
from tests.support.clock import ManualClock
from tests.support.race import (
    DEADLINE_SECONDS,
    Contender,
    race,
    terminate_backend,
    wait_until_lock_wait,
)
from tests.support.rows import write_exit_code
from tests.support.statements import create_step, transaction_settings

S = BatchStatus
FAILURE = FailureSummary(FailureCategory.CANCELLED, FailureId(3))
_runs = itertools.count(1)


def new_key(job: str = "settlement") -> JobInstanceKey:
    return JobInstanceKey(JobName(job), JobParameters.of({"run": next(_runs)}))


def to(target: S, clock: ManualClock) -> LifecycleTransition:
    at = clock.advance()
    if target is S.FAILED:
        return LifecycleTransition.failed(at, FAILURE)
    return LifecycleTransition.new(target, at)


def launched(
    repository: JobRepository, clock: ManualClock, *path: S, key: JobInstanceKey | None = None
) -> JobExecution:
    """A committed first attempt of a new instance, moved along `path`."""
    with repository.begin() as uow:
        execution = uow.executions.create(
            uow.instances.select_or_create(key or new_key()).instance.id
        )
        for target in path:
            execution = uow.executions.transition(
                execution.id, execution.version, to(target, clock)
            )
        uow.commit()
    return execution


def scalar(admin: psycopg.Connection[Any], sql: str, *params: object) -> Any:
    row = admin.execute(sql, params).fetchone()
    assert row is not None
    return row[0]


@pytest.fixture
def connect(
    pg_config: ConnectionConfig, clock: ManualClock
) -> Iterator[Callable[..., JobRepository]]:
    """Open extra repositories (closed at teardown) with configuration overrides."""
    opened: list[JobRepository] = []

    def factory(**overrides: Any) -> JobRepository:
        repository = JobRepository.connect(attrs.evolve(pg_config, **overrides), clock=clock)
        opened.append(repository)
        return repository

    yield factory
    for repository in opened:
        repository.close()


# --------------------------------------------------------------------------- L1 - L3


def test_second_launch_waits_on_the_instance_lock_then_sees_the_new_attempt(
    repository: JobRepository, clock: ManualClock, admin: psycopg.Connection[Any]
) -> None:
    """Scenario L1."""
    stopped = launched(repository, clock, S.STARTED, S.STOPPED)
    instance_id = stopped.job_instance_id
    with repository.begin() as first:
        winner = first.executions.create(instance_id)
        loser = Contender(repository, lambda uow: uow.executions.create(instance_id))
        loser.start_blocked(admin)
        first.commit()
    outcome = loser.outcome()
    assert isinstance(outcome.error, ExecutionAlreadyActive), outcome
    assert (outcome.error.instance_id, outcome.error.execution_id, outcome.error.status) == (
        instance_id,
        winner.id,
        "STARTING",
    )
    with repository.begin() as uow:
        assert [e.attempt for e in uow.executions.of_instance(instance_id)] == [1, 2]


def test_second_launch_proceeds_when_the_first_rolls_back(
    repository: JobRepository, clock: ManualClock, admin: psycopg.Connection[Any]
) -> None:
    """Scenario L1."""
    stopped = launched(repository, clock, S.STARTED, S.STOPPED)
    instance_id = stopped.job_instance_id
    with repository.begin() as first:
        first.executions.create(instance_id)
        other = Contender(repository, lambda uow: uow.executions.create(instance_id))
        other.start_blocked(admin)
        first.rollback()
    outcome = other.outcome()
    assert outcome.ok, outcome
    assert outcome.value is not None and outcome.value.restart_of_execution_id == stopped.id
    with repository.begin() as uow:
        executions = uow.executions.of_instance(instance_id)
    assert [e.id for e in executions] == [stopped.id, outcome.value.id]
    assert executions[1].status is S.STARTING


def test_two_transitions_at_one_expected_version_have_one_winner_and_one_stale_version(
    repository: JobRepository, clock: ManualClock, admin: psycopg.Connection[Any]
) -> None:
    """Scenario L2."""
    started = launched(repository, clock, S.STARTED)
    expected = started.version
    with repository.begin() as first:
        won = first.executions.transition(started.id, expected, to(S.COMPLETED, clock))
        loser = Contender(
            repository,
            lambda uow: uow.executions.transition(started.id, expected, to(S.FAILED, clock)),
        )
        loser.start_blocked(admin)
        first.commit()
    outcome = loser.outcome()
    assert isinstance(outcome.error, StaleVersion), outcome
    assert (outcome.error.expected, outcome.error.actual) == (expected, expected + 1)
    with repository.begin() as uow:
        assert uow.executions.get(started.id) == won
    assert won.version == expected + 1 and won.status is S.COMPLETED


def test_concurrent_select_or_create_gives_one_created_and_one_existing(
    repository: JobRepository, admin: psycopg.Connection[Any]
) -> None:
    """Scenario L3."""
    key = new_key()
    with repository.begin() as first:
        created = first.instances.select_or_create(key)
        second = Contender(repository, lambda uow: uow.instances.select_or_create(key))
        second.start_blocked(admin)
        first.commit()
    outcome = second.outcome()
    assert isinstance(created, Created)
    assert isinstance(outcome.value, Existing), outcome
    assert outcome.value.instance == created.instance
    assert scalar(admin, "SELECT count(*) FROM pybatch.job_instance") == 1


def test_select_or_create_after_the_creator_rolled_back_creates(
    repository: JobRepository, admin: psycopg.Connection[Any]
) -> None:
    """Scenario L3."""
    key = new_key()
    with repository.begin() as first:
        abandoned = first.instances.select_or_create(key).instance
        second = Contender(repository, lambda uow: uow.instances.select_or_create(key))
        second.start_blocked(admin)
        first.rollback()
    outcome = second.outcome()
    assert isinstance(outcome.value, Created), outcome
    assert outcome.value.instance.id != abandoned.id
    assert scalar(admin, "SELECT count(*) FROM pybatch.job_instance") == 1


# --------------------------------------------------------------------------- L7 - L10


def test_rollback_discards_everything_and_others_still_commit(
    repository: JobRepository, clock: ManualClock, admin: psycopg.Connection[Any]
) -> None:
    """Scenario L7."""
    existing = launched(repository, clock, S.STARTED)
    discarded_key, kept_key = new_key(), new_key()
    with repository.begin() as other:
        other.instances.select_or_create(kept_key)
        with repository.begin() as uow:
            instance = uow.instances.select_or_create(discarded_key).instance
            execution = uow.executions.create(instance.id)
            create_step(uow, execution.id, StepName("s"))
            uow.executions.transition(existing.id, existing.version, to(S.COMPLETED, clock))
            uow.rollback()
            assert not uow.is_open
            uow.rollback()  # a second rollback is a no-op
            with pytest.raises(UnitOfWorkClosed):
                uow.executions.get(existing.id)
            with pytest.raises(UnitOfWorkClosed):
                uow.commit()
        other.executions.transition(existing.id, existing.version, to(S.STOPPING, clock))
        other.commit()
    with repository.begin() as uow:
        assert uow.instances.find(discarded_key) is None
        assert uow.instances.find(kept_key) is not None
        stored = uow.executions.get(existing.id)
    assert stored is not None and stored.status is S.STOPPING
    assert stored.metadata.exit_status == ExitCode("UNKNOWN")
    assert scalar(admin, "SELECT count(*) FROM pybatch.step_execution") == 0


def test_leaving_the_context_without_commit_rolls_back(
    connect: Callable[..., JobRepository], admin: psycopg.Connection[Any]
) -> None:
    # One connection and a short acquire timeout: a leaked connection would fail begin().
    """Scenario L8."""
    repository = connect(pool_size=1, acquire_timeout=timedelta(seconds=2))
    quiet, loud = new_key(), new_key()
    with repository.begin() as uow:
        uow.executions.create(uow.instances.select_or_create(quiet).instance.id)
    assert not uow.is_open

    class Boom(Exception):
        pass

    with pytest.raises(Boom), repository.begin() as uow:
        uow.executions.create(uow.instances.select_or_create(loud).instance.id)
        raise Boom
    assert not uow.is_open
    with repository.begin() as uow:
        assert uow.instances.find(quiet) is None
        assert uow.instances.find(loud) is None
    assert scalar(admin, "SELECT count(*) FROM pybatch.job_execution") == 0
    in_transaction = scalar(
        admin,
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pybatch' "
        "AND state LIKE 'idle in transaction%%'",
    )
    assert in_transaction == 0


def test_a_unit_of_work_reads_its_own_staged_writes(
    repository: JobRepository, clock: ManualClock
) -> None:
    """Scenario L9."""
    key = new_key()
    with repository.begin() as uow, repository.begin() as outsider:
        instance = uow.instances.select_or_create(key).instance
        assert uow.instances.find(key) == instance
        assert uow.instances.get(instance.id) == instance
        execution = uow.executions.create(instance.id)
        assert uow.executions.of_instance(instance.id) == [execution]
        assert uow.executions.get(execution.id) == execution
        started = uow.executions.transition(execution.id, 0, to(S.STARTED, clock))
        assert uow.executions.get(execution.id) == started
        step = create_step(uow, execution.id, StepName("read"))
        assert uow.steps.of_execution(execution.id) == [step]
        assert uow.steps.get(step.id) == step
        # Nothing is visible to another unit of work before commit.
        assert outsider.instances.find(key) is None
        assert outsider.instances.get(instance.id) is None
        assert outsider.executions.get(execution.id) is None
        assert outsider.steps.get(step.id) is None
        uow.commit()
        assert outsider.executions.get(execution.id) == started


def test_ids_of_a_rolled_back_unit_of_work_are_never_reissued(
    repository: JobRepository,
) -> None:
    """Scenario L10."""
    key = new_key()
    with repository.begin() as uow:
        instance = uow.instances.select_or_create(key).instance
        execution = uow.executions.create(instance.id)
        step = create_step(uow, execution.id, StepName("s"))
        uow.rollback()
    with repository.begin() as uow:
        again = uow.instances.select_or_create(key)
        assert isinstance(again, Created)
        execution2 = uow.executions.create(again.instance.id)
        step2 = create_step(uow, execution2.id, StepName("s"))
        uow.commit()
    assert again.instance.id > instance.id
    assert execution2.id > execution.id
    assert step2.id > step.id


# --------------------------------------------------------------------------- L11


def definition(revision: str, steps: list[str]) -> DefinitionIdentity:
    return DefinitionIdentity.from_manifest(
        None, DefinitionRevision(revision), {"format": 1, "steps": steps}
    )


def test_a_failed_operation_leaves_nothing_staged_and_the_unit_of_work_usable(
    repository: JobRepository, clock: ManualClock, admin: psycopg.Connection[Any]
) -> None:
    """Scenario L11."""
    completed = launched(repository, clock, S.STARTED, S.COMPLETED)
    definitions = scalar(admin, "SELECT count(*) FROM pybatch.job_definition")
    other_key = new_key()
    with repository.begin() as uow:
        other = uow.instances.select_or_create(other_key).instance
        with pytest.raises(CompletedInstance):
            uow.executions.create(completed.job_instance_id, definition("r-new", ["x"]))
        execution = uow.executions.create(other.id)
        uow.commit()
    with repository.begin() as uow:
        assert uow.executions.of_instance(other.id) == [execution]
    assert scalar(admin, "SELECT count(*) FROM pybatch.job_definition") == definitions


def test_a_failure_after_a_definition_insert_rolls_the_insert_back(
    repository: JobRepository, clock: ManualClock, admin: psycopg.Connection[Any]
) -> None:
    """IncompatibleDefinition is raised after ensure inserted the new definition row.

    Scenario L11.
    """
    failed = launched(repository, clock, S.FAILED)
    definitions = scalar(admin, "SELECT count(*) FROM pybatch.job_definition")
    with repository.begin() as uow:
        with pytest.raises(IncompatibleDefinition):
            uow.executions.create(failed.job_instance_id, definition("r-other", ["y"]))
        # The same unit of work goes on and commits a restart under the legacy definition.
        restart = uow.executions.create(failed.job_instance_id)
        uow.commit()
    assert restart.attempt == 2
    assert scalar(admin, "SELECT count(*) FROM pybatch.job_definition") == definitions
    assert (
        scalar(
            admin,
            "SELECT count(*) FROM pybatch.job_definition WHERE definition_revision = 'r-other'",
        )
        == 0
    )


# --------------------------------------------------------------------------- L12


def test_commit_of_a_failed_transaction_is_transaction_aborted(
    repository: JobRepository, admin: psycopg.Connection[Any]
) -> None:
    """Scenario L12."""
    key = new_key()
    with repository.begin() as uow:
        instance = uow.instances.select_or_create(key).instance
        uow.executions.create(instance.id)
        with pytest.raises(psycopg.errors.DivisionByZero):
            uow.connection.execute("SELECT 1 / 0")  # a business statement, outside any savepoint
        with pytest.raises(TransactionAborted):
            uow.commit()
        assert not uow.is_open
        with pytest.raises(UnitOfWorkClosed):
            uow.commit()
    with repository.begin() as uow:
        assert uow.instances.find(key) is None
        assert uow.instances.get(instance.id) is None
    assert scalar(admin, "SELECT count(*) FROM pybatch.job_instance") == 0


# --------------------------------------------------------------------------- L13


def test_units_of_work_run_read_committed_with_the_configured_timeouts_despite_database_defaults(
    connect: Callable[..., JobRepository], db_dsn: str, admin: psycopg.Connection[Any]
) -> None:
    """Scenario L13."""
    database = admin.info.dbname
    for setting, value in (
        ("default_transaction_isolation", "serializable"),
        ("statement_timeout", "777s"),
        ("lock_timeout", "333s"),
        ("idle_in_transaction_session_timeout", "999s"),
    ):
        admin.execute(f"ALTER DATABASE \"{database}\" SET {setting} = '{value}'")
    with psycopg.connect(db_dsn) as plain:  # the database default really is SERIALIZABLE now
        assert plain.execute("SHOW transaction_isolation").fetchone() == ("serializable",)
    repository = connect(
        statement_timeout=timedelta(milliseconds=12345),
        lock_timeout=timedelta(milliseconds=2345),
        idle_transaction_timeout=timedelta(milliseconds=61001),
    )
    for _ in range(2):  # a fresh and a reused pooled connection
        with repository.begin() as uow:
            uow.instances.select_or_create(new_key())
            settings = transaction_settings(uow)
            uow.commit()
        assert settings == {
            "transaction_isolation": "read committed",
            "statement_timeout": "12345ms",
            "lock_timeout": "2345ms",
            "idle_in_transaction_session_timeout": "61001ms",
            "time_zone": "UTC",
        }


def test_timeouts_the_server_shows_in_seconds_minutes_or_hours_pass_the_new_connection_check(
    connect: Callable[..., JobRepository],
) -> None:
    """A new connection reads its settings back in milliseconds, whatever unit shows them."""
    repository = connect(
        statement_timeout=timedelta(hours=2),
        lock_timeout=timedelta(minutes=3),
        idle_transaction_timeout=timedelta(seconds=45),
    )
    with repository.begin() as uow:
        uow.instances.select_or_create(new_key())
        settings = transaction_settings(uow)
        uow.commit()
    assert (settings["statement_timeout"], settings["lock_timeout"]) == ("2h", "3min")
    assert settings["idle_in_transaction_session_timeout"] == "45s"


# --------------------------------------------------------------------------- L14


@pytest.fixture
def fast_deadlocks(admin: psycopg.Connection[Any]) -> None:
    """Detect deadlocks after 20 ms instead of 1 s in sessions opened from now on."""
    admin.execute(f"ALTER DATABASE \"{admin.info.dbname}\" SET deadlock_timeout = '20ms'")


class ForcedDeadlock:
    """Drives two units of work into a deadlock whose victim is always racer 1.

    Racer 0 locks its row, then racer 1 locks its own; racer 0 asks for racer 1's row and,
    once pg_stat_activity shows it waiting on that lock, racer 1 asks for racer 0's row.
    Racer 0 never runs the deadlock check (its session's deadlock_timeout is an hour), so
    racer 1's check, 20 ms into its wait, finds the cycle and aborts racer 1. A rerun of
    racer 1 starts once racer 0 has updated both rows (`wait_for_winner`). No step depends
    on how fast either thread runs.
    """

    def __init__(self, admin: psycopg.Connection[Any]) -> None:
        self._admin = admin
        self._locked = [threading.Event(), threading.Event()]
        self._waiting_pid: int | None = None
        self._admin_lock = threading.Lock()
        self._winner_holds_both = threading.Event()

    def winner_holds_both(self) -> None:
        """Racer 0 has updated both rows (its transaction is still open)."""
        self._winner_holds_both.set()

    def wait_for_winner(self) -> None:
        """Hold a rerun of racer 1 until racer 0 has updated both rows.

        Without it the rerun could update racer 1's own row again before racer 0, woken by
        the victim's rollback, gets to it (the row's last writer aborted, so nothing makes
        the rerun wait), then wait for racer 0's row while racer 0 waits for that one: a
        second deadlock, decided by which thread the scheduler runs first.
        """
        assert self._winner_holds_both.wait(DEADLINE_SECONDS)

    def hold(self, index: int, uow: UnitOfWork) -> None:
        """Called once the racer holds its own row; returns when it may ask for the other."""
        if index == 0:
            uow.connection.execute("SET LOCAL deadlock_timeout = '1h'")
            self._waiting_pid = uow.connection.info.backend_pid
            self._locked[0].set()
            assert self._locked[1].wait(DEADLINE_SECONDS)
        else:
            assert self._locked[0].wait(DEADLINE_SECONDS)
            self._locked[1].set()
            assert self._waiting_pid is not None
            with self._admin_lock:
                wait_until_lock_wait(self._admin, self._waiting_pid)


def test_a_deadlock_victim_gets_a_retryable_conflict_and_can_only_roll_back(
    fast_deadlocks: None,
    connect: Callable[..., JobRepository],
    clock: ManualClock,
    admin: psycopg.Connection[Any],
) -> None:
    """Scenario L14."""
    repository = connect()
    first, second = (launched(repository, clock) for _ in range(2))
    forced = ForcedDeadlock(admin)

    def racer(index: int) -> str:
        mine, theirs = (first, second) if index == 0 else (second, first)
        with repository.begin() as uow:
            uow.executions.transition(mine.id, 0, to(S.STARTED, clock))
            forced.hold(index, uow)
            try:
                uow.executions.transition(theirs.id, 0, to(S.STARTED, clock))
            except RetryableConflict as conflict:
                assert conflict.sqlstate == "40P01"
                refused: list[Callable[[], object]] = [
                    lambda: uow.executions.get(mine.id),
                    lambda: uow.executions.create(mine.job_instance_id),
                    lambda: uow.connection,
                    lambda: transaction_settings(uow),
                    uow.commit,
                ]
                for call in refused:
                    with pytest.raises(RetryableConflict) as again:
                        call()
                    assert again.value is conflict
                uow.rollback()
                assert not uow.is_open
                return "victim"
            uow.commit()
            return "winner"

    outcomes = race(2, racer)
    assert all(o.ok for o in outcomes), [o.error for o in outcomes]
    assert [o.value for o in outcomes] == ["winner", "victim"]
    with repository.begin() as uow:
        for execution in (first, second):
            stored = uow.executions.get(execution.id)
            assert stored is not None and (stored.status, stored.version) == (S.STARTED, 1)


def test_run_in_unit_of_work_reruns_the_deadlock_victim(
    fast_deadlocks: None,
    connect: Callable[..., JobRepository],
    clock: ManualClock,
    admin: psycopg.Connection[Any],
) -> None:
    """Scenario L14."""
    repository = connect(unit_of_work_attempts=3)
    first, second = (launched(repository, clock) for _ in range(2))
    forced = ForcedDeadlock(admin)
    calls = [0, 0]

    def racer(index: int) -> int:
        mine, theirs = (first, second) if index == 0 else (second, first)

        def work(uow: UnitOfWork) -> int:
            calls[index] += 1
            if index == 1 and calls[index] > 1:
                forced.wait_for_winner()
            write_exit_code(uow, mine, f"BY_{index}")
            if calls[index] == 1:
                forced.hold(index, uow)
            write_exit_code(uow, theirs, f"BY_{index}")
            if index == 0:
                forced.winner_holds_both()
            return calls[index]

        return repository.run_in_unit_of_work(work)

    outcomes = race(2, racer)
    assert all(o.ok for o in outcomes), [o.error for o in outcomes]
    assert calls == [1, 2]  # the victim's (racer 1's) work ran again, the winner's once
    assert [o.value for o in outcomes] == [1, 2]
    with repository.begin() as uow:
        for execution in (first, second):
            stored = uow.executions.get(execution.id)
            assert stored is not None and stored.version == 2  # written once by each racer


RAISE_40001 = "DO $$ BEGIN RAISE EXCEPTION 'conflict' USING ERRCODE = '40001'; END $$"


def test_run_in_unit_of_work_stops_after_the_configured_attempts(
    connect: Callable[..., JobRepository], admin: psycopg.Connection[Any]
) -> None:
    """Scenario L14."""
    for attempts in (1, 3):
        check_attempts(connect(unit_of_work_attempts=attempts), admin, attempts)


def check_attempts(
    repository: JobRepository, admin: psycopg.Connection[Any], attempts: int
) -> None:
    calls = 0

    def work(uow: UnitOfWork) -> None:
        nonlocal calls
        calls += 1
        uow.instances.select_or_create(new_key())
        with uow.operation() as conn:  # a real 40001 from the server, mapped by pybatch
            conn.execute(RAISE_40001)

    with pytest.raises(RetryableConflict) as conflict:
        repository.run_in_unit_of_work(work)
    assert conflict.value.sqlstate == "40001"
    assert calls == attempts
    assert scalar(admin, "SELECT count(*) FROM pybatch.job_instance") == 0


def test_run_in_unit_of_work_retries_a_conflict_raised_by_commit(
    repository: JobRepository, admin: psycopg.Connection[Any]
) -> None:
    """Scenario L14."""
    admin.execute("CREATE SEQUENCE public.conflict_once")
    admin.execute(
        "CREATE FUNCTION public.conflict_once() RETURNS trigger LANGUAGE plpgsql AS $$ "
        "BEGIN IF nextval('public.conflict_once') = 1 THEN "
        "RAISE EXCEPTION 'conflict' USING ERRCODE = '40001'; END IF; RETURN NULL; END $$"
    )
    admin.execute(
        "CREATE CONSTRAINT TRIGGER conflict_once AFTER INSERT ON pybatch.job_instance "
        "DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION public.conflict_once()"
    )
    key = new_key()
    ids: list[int] = []

    def work(uow: UnitOfWork) -> int:
        instance = uow.instances.select_or_create(key).instance
        ids.append(instance.id)
        return instance.id

    assert repository.run_in_unit_of_work(work) == ids[-1]
    assert len(ids) == 2 and ids[0] != ids[1]  # the first COMMIT failed; its id is burned
    assert scalar(admin, "SELECT array_agg(id) FROM pybatch.job_instance") == [ids[1]]


def test_run_in_unit_of_work_never_retries_commit_outcome_unknown(
    repository: JobRepository, admin: psycopg.Connection[Any]
) -> None:
    """Scenario L14."""
    key = new_key()
    calls = 0

    def work(uow: UnitOfWork) -> None:
        nonlocal calls
        calls += 1
        uow.executions.create(uow.instances.select_or_create(key).instance.id)
        terminate_backend(admin, uow.connection.info.backend_pid)

    with pytest.raises(CommitOutcomeUnknown):
        repository.run_in_unit_of_work(work)
    assert calls == 1
    with repository.begin() as uow:  # the pool replaced the lost connection
        assert uow.instances.find(key) is None


def test_run_in_unit_of_work_never_retries_other_errors(
    repository: JobRepository, clock: ManualClock
) -> None:
    """Scenario L14."""
    active = launched(repository, clock)
    calls = {"aborted": 0, "typed": 0}

    def aborted(uow: UnitOfWork) -> None:
        calls["aborted"] += 1
        uow.instances.select_or_create(new_key())
        try:
            uow.connection.execute("SELECT 1 / 0")
        except psycopg.errors.DivisionByZero:
            pass

    def typed(uow: UnitOfWork) -> None:
        calls["typed"] += 1
        uow.executions.create(active.job_instance_id)

    with pytest.raises(TransactionAborted):
        repository.run_in_unit_of_work(aborted)
    with pytest.raises(ExecutionAlreadyActive):
        repository.run_in_unit_of_work(typed)
    assert calls == {"aborted": 1, "typed": 1}


# --------------------------------------------------------------------------- L15


def test_units_of_work_on_different_instances_never_conflict(
    repository: JobRepository, clock: ManualClock
) -> None:
    """Scenario L15."""
    one, two = launched(repository, clock), launched(repository, clock)
    with repository.begin() as a, repository.begin() as b:
        key_a, key_b = new_key(), new_key()
        a.instances.select_or_create(key_a)
        b.instances.select_or_create(key_b)
        a_one = a.executions.transition(one.id, 0, to(S.STARTED, clock))
        b_two = b.executions.transition(two.id, 0, to(S.STARTED, clock))
        a_step = create_step(a, one.id, StepName("s"))
        b_step = create_step(b, two.id, StepName("s"))
        with repository.begin() as reader:  # a read-only unit of work commits in between
            reader.executions.of_instance(one.job_instance_id)
            reader.commit()
        b.commit()
        a.commit()
    with repository.begin() as uow:
        assert uow.executions.get(one.id) == a_one
        assert uow.executions.get(two.id) == b_two
        assert uow.steps.of_execution(one.id) == [a_step]
        assert uow.steps.of_execution(two.id) == [b_step]
        assert uow.instances.find(key_a) is not None
        assert uow.instances.find(key_b) is not None
