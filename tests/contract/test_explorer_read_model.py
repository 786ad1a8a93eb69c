"""The explorer read model (scenarios K1-K12)."""

from __future__ import annotations

import hashlib
import itertools
import json
from datetime import timedelta
from typing import Any

import attrs
import psycopg
import pytest

from pybatch import ConnectionConfig, JobRepository
from pybatch._explorer import JobExplorer
from pybatch.errors import (
    CursorInvalid,
    CursorQueryMismatch,
    ExplorerAgeBoundTooSmall,
    ExplorerRepositoryError,
    ExplorerTimeout,
    JobExecutionNotFound,
    JobInstanceNotFound,
    PageSizeOutOfRange,
    ResponseTooLarge,
    StepExecutionNotFound,
    Unavailable,
    ZeroIdentifier,
)
from pybatch.etl import Job, StepRun
from pybatch.values.explorer import (
    MAX_RESPONSE_BYTES,
    Cursor,
    ExplorerQuery,
    IdentityKey,
    JobNameSummary,
    LatestAttempt,
    NameKey,
    PageSize,
    ParameterFilter,
    operator_request_json,
    query_binding,
)
from pybatch.values.ids import FailureId
from pybatch.values.lifecycle import LifecycleTransition
from pybatch.values.names import JobName, StepName
from pybatch.values.parameters import JobInstanceKey, JobParameter, JobParameters, ParameterValue
from pybatch.values.records import JobExecution
from pybatch.values.status import BatchStatus, FailureCategory, FailureSummary
from tests.support.clock import ManualClock
from tests.support.statements import create_step

S = BatchStatus
USER = FailureSummary(FailureCategory.USER_COMPONENT, FailureId(7))
_runs = itertools.count(1)


@pytest.fixture
def explorer(repository: JobRepository) -> JobExplorer:
    return JobExplorer(repository)


def launch(
    repository: JobRepository,
    clock: ManualClock,
    name: str = "orders",
    parameters: dict[str, Any] | None = None,
    *,
    status: BatchStatus = S.STARTED,
) -> JobExecution:
    params = parameters if parameters is not None else {"run": next(_runs)}
    with repository.begin() as uow:
        instance = uow.instances.select_or_create(
            JobInstanceKey(JobName(name), JobParameters.of(params))
        ).instance
        execution = uow.executions.create(instance.id)
        path = {S.STARTING: (), S.STARTED: (S.STARTED,), S.FAILED: (S.STARTED, S.FAILED)}
        path |= {S.COMPLETED: (S.STARTED, S.COMPLETED), S.UNKNOWN: (S.STARTED, S.UNKNOWN)}
        path |= {S.STOPPING: (S.STARTED, S.STOPPING)}
        for target in path[status]:
            transition = (
                LifecycleTransition.failed(clock.advance(), USER)
                if target is S.FAILED
                else LifecycleTransition.new(target, clock.advance())
            )
            execution = uow.executions.transition(execution.id, execution.version, transition)
        uow.commit()
    return execution


def restart_after_failure(
    repository: JobRepository, clock: ManualClock, failed: JobExecution
) -> JobExecution:
    with repository.begin() as uow:
        execution = uow.executions.create(failed.job_instance_id)
        uow.commit()
    return execution


def walk(fetch: Any, page_size: int) -> list[Any]:
    items: list[Any] = []
    cursor = None
    for _ in range(1000):
        page = fetch(PageSize(page_size), cursor)
        items.extend(page.items)
        cursor = page.next_cursor
        if cursor is None:
            return items
    raise AssertionError("traversal did not end")


def reseal(data: bytes) -> Cursor:
    """Recompute a cursor's checksum after an edit (a forger who knows the layout)."""
    body = data[:-32]
    return Cursor(body + hashlib.sha256(body).digest())


# --------------------------------------------------------------------------- K1, K2


def test_job_names_are_listed_in_byte_order_from_instances_and_paged(
    repository: JobRepository, clock: ManualClock, explorer: JobExplorer
) -> None:
    """Scenario K1."""
    names = ["b", "B", "a", "\u00e9t\u00e9", "a2", "Z", "orders"]
    for name in names:
        with repository.begin() as uow:  # an instance without any execution or definition
            uow.instances.select_or_create(
                JobInstanceKey(JobName(name), JobParameters.of({"k": 1}))
            )
            uow.commit()
    launched = launch(repository, clock, "orders")
    listed = walk(lambda size, after: explorer.job_names(size, after), 2)
    assert [item.job_name for item in listed] == sorted(names, key=lambda n: n.encode())
    orders = next(item for item in listed if item.job_name == "orders")
    assert orders.latest_execution_id == launched.id
    assert orders.latest_status is S.STARTED
    assert next(item for item in listed if item.job_name == "a").latest_execution_id is None


def test_job_names_report_the_newest_instance_under_the_ceiling(
    repository: JobRepository, clock: ManualClock, explorer: JobExplorer
) -> None:
    """Scenario K1."""

    def idle(name: str) -> None:  # an instance without any execution
        with repository.begin() as uow:
            uow.instances.select_or_create(
                JobInstanceKey(JobName(name), JobParameters.of({"k": 1}))
            )
            uow.commit()

    def restarted(name: str) -> JobExecution:  # an older instance, then a restarted one
        launch(repository, clock, name, status=S.COMPLETED)
        return restart_after_failure(
            repository, clock, launch(repository, clock, name, status=S.FAILED)
        )

    launch(repository, clock, "alpha")
    launch(repository, clock, "beta")
    idle("cat")
    delta = restarted("delta")
    echo = restarted("echo")
    idle("foxtrot")
    first = explorer.job_names(PageSize(2))
    assert [item.job_name for item in first.items] == ["alpha", "beta"]
    # After the traversal began: a newer instance of every name, each with an execution, and
    # new names. Pages of two check both the first name of a page and its successor.
    names = ("alpha", "beta", "cat", "delta", "dog", "echo", "eel", "foxtrot", "zulu")
    late = {name: launch(repository, clock, name) for name in names}
    assert first.ceiling < min(execution.job_instance_id for execution in late.values())
    rest: list[JobNameSummary] = []
    cursor = first.next_cursor
    while cursor is not None:
        page = explorer.job_names(PageSize(2), cursor)
        rest.extend(page.items)
        cursor = page.next_cursor
    assert [
        (item.job_name, item.latest_execution_id, item.latest_status, item.latest_updated_at)
        for item in rest
    ] == [
        ("cat", None, None, None),
        ("delta", delta.id, S.STARTING, delta.updated_at),
        ("echo", echo.id, S.STARTING, echo.updated_at),
        ("foxtrot", None, None, None),
    ]
    fresh = {item.job_name: item.latest_execution_id for item in explorer.job_names().items}
    assert fresh == {name: execution.id for name, execution in late.items()}


def test_instances_are_listed_newest_first_paged_and_bounded_by_the_ceiling(
    repository: JobRepository, clock: ManualClock, explorer: JobExplorer
) -> None:
    """Scenario K2."""
    ids = [launch(repository, clock, "daily").job_instance_id for _ in range(5)]
    launch(repository, clock, "other")
    first = explorer.instances("daily", PageSize(2))
    assert [item.id for item in first.items] == ids[::-1][:2]
    assert first.ceiling == ids[-1]
    late = launch(repository, clock, "daily").job_instance_id  # after the traversal began
    rest: list[int] = []
    cursor = first.next_cursor
    while cursor is not None:
        page = explorer.instances("daily", PageSize(2), cursor)
        rest.extend(item.id for item in page.items)
        cursor = page.next_cursor
    assert [item.id for item in first.items] + rest == ids[::-1]
    assert late not in rest
    assert explorer.instances("daily").items[0].id == late  # a new traversal sees it


# --------------------------------------------------------------------------- K3


def test_executions_steps_and_flow_decisions_are_listed_in_their_orders(
    repository: JobRepository,
    clock: ManualClock,
    explorer: JobExplorer,
    admin: psycopg.Connection[Any],
) -> None:
    """Scenario K3."""
    first = launch(repository, clock, status=S.FAILED)
    second = restart_after_failure(repository, clock, first)
    page = explorer.executions(first.job_instance_id, PageSize(1))
    assert [item.attempt for item in page.items] == [2]
    assert page.next_cursor is not None
    tail = explorer.executions(first.job_instance_id, PageSize(1), page.next_cursor)
    assert [item.id for item in tail.items] == [first.id]
    assert page.items[0].id == second.id

    running = launch(repository, clock)
    with repository.begin() as uow:
        steps = [create_step(uow, running.id, StepName(f"s{i}")).id for i in range(5)]
        uow.commit()
    listed = walk(lambda size, after: explorer.step_executions(running.id, size, after), 2)
    assert [item.id for item in listed] == sorted(steps)

    for sequence, node in ((2, "b"), (1, "a"), (3, "c")):
        admin.execute(
            "INSERT INTO pybatch.flow_decision (job_execution_id, sequence, source_node_id,"
            " observed_outcome, target_node_id, transition_kind, plan_fingerprint, input_digest,"
            " decided_at) VALUES (%s, %s, %s, 'COMPLETED', 'next', 'STEP_EXIT', %s, %s, now())",
            (second.id, sequence, node, bytes(32), bytes(32)),
        )
    decisions = walk(lambda size, after: explorer.flow_decisions(second.id, size, after), 2)
    assert [item.sequence for item in decisions] == [1, 2, 3]
    assert [str(item.source_node_id) for item in decisions] == ["a", "b", "c"]


def test_the_latest_attempt_is_the_one_a_restart_starts_from(
    repository: JobRepository, clock: ManualClock, explorer: JobExplorer
) -> None:
    first = launch(repository, clock, status=S.FAILED)
    instance = first.job_instance_id
    assert explorer.latest_attempt(instance) == LatestAttempt(
        execution_id=first.id, attempt=1, status=S.FAILED
    )
    second = restart_after_failure(repository, clock, first)
    assert explorer.latest_attempt(instance) == LatestAttempt(
        execution_id=second.id, attempt=2, status=S.STARTING
    )
    assert explorer.latest_attempt(instance).as_json() == {  # type: ignore[union-attr]
        "execution_id": second.id,
        "attempt": 2,
        "status": "STARTING",
    }
    with repository.begin() as uow:
        empty = uow.instances.select_or_create(
            JobInstanceKey(JobName("orders"), JobParameters.of({"run": next(_runs)}))
        ).instance
        uow.commit()
    assert explorer.latest_attempt(empty.id) is None
    assert explorer.latest_attempt(2**62) is None
    with pytest.raises(ZeroIdentifier):
        explorer.latest_attempt(0)


# --------------------------------------------------------------------------- K4


def test_unresolved_executions_listed_are_strictly_older_than_the_age(
    repository: JobRepository, clock: ManualClock, explorer: JobExplorer
) -> None:
    """Scenario K4."""
    unresolved = [launch(repository, clock, status=status) for status in (S.STARTING, S.STARTED)]
    unresolved += [launch(repository, clock, status=status) for status in (S.STOPPING, S.UNKNOWN)]
    finished = [launch(repository, clock, status=s) for s in (S.FAILED, S.COMPLETED)]
    newest = max(e.updated_at for e in unresolved + finished)
    age = timedelta(minutes=10)
    clock.set(newest + age)  # cutoff == newest: strictly earlier excludes the newest row
    listed = walk(lambda size, after: explorer.unresolved_executions(age, size, after), 3)
    expected = sorted(e.id for e in unresolved if e.updated_at < newest)
    assert [item.id for item in listed] == expected
    clock.advance(timedelta(microseconds=1))
    listed = list(explorer.unresolved_executions(age).items)
    assert [item.id for item in listed] == sorted(e.id for e in unresolved)
    assert all(item.status in {S.STARTING, S.STARTED, S.STOPPING, S.UNKNOWN} for item in listed)
    with pytest.raises(ExplorerAgeBoundTooSmall):
        explorer.unresolved_executions(timedelta(seconds=59, microseconds=999999))


# --------------------------------------------------------------------------- K5, K11


def test_tampered_cursor_bytes_are_refused(
    repository: JobRepository, clock: ManualClock, explorer: JobExplorer
) -> None:
    """Scenario K5."""
    for _ in range(3):
        launch(repository, clock, "tamper")
    cursor = explorer.instances("tamper", PageSize(1)).next_cursor
    assert cursor is not None
    data = cursor.data
    for index in range(len(data)):
        forged = bytearray(data)
        forged[index] ^= 0x01
        with pytest.raises(CursorInvalid):
            explorer.instances("tamper", PageSize(1), Cursor(bytes(forged)))
    with pytest.raises(CursorInvalid):
        explorer.instances("tamper", PageSize(1), Cursor(data[:-1]))
    with pytest.raises(CursorInvalid):
        explorer.instances("tamper", PageSize(1), reseal(bytes([2]) + data[1:]))  # version
    for text in ("", "0", "AB", "zz", data.hex().upper()):
        with pytest.raises(CursorInvalid):
            Cursor.from_hex(text)
    assert Cursor.from_hex(str(cursor)) == cursor
    assert repr(cursor) == f"Cursor(<{len(data)} bytes>)"


def test_a_cursor_re_signed_with_a_raised_ceiling_is_refused(
    repository: JobRepository, clock: ManualClock, explorer: JobExplorer
) -> None:
    """The checksum is plain SHA-256, so a forger can re-sign; the database refuses the ceiling."""
    launch(repository, clock, "a_first")
    launch(repository, clock, "b_second")
    first = explorer.job_names(PageSize(1))
    assert [item.job_name for item in first.items] == ["a_first"]
    assert first.next_cursor is not None
    launch(repository, clock, "c_created_during_the_traversal")
    current = explorer.job_names(PageSize(1)).ceiling  # a new traversal's ceiling
    assert current > first.ceiling
    binding = query_binding(ExplorerQuery.JOB_NAMES, PageSize(1), None)
    for raised in (current + 1, current + 1_000, 2**63 - 1):
        forged = Cursor.issue(ExplorerQuery.JOB_NAMES, NameKey("a_first"), raised, binding)
        with pytest.raises(CursorInvalid):
            explorer.job_names(PageSize(1), forged)
        with pytest.raises(CursorInvalid):
            explorer.job_names(PageSize(1), reseal(forged.data))
    # The honest cursor still pages, without the row created during the traversal.
    second = explorer.job_names(PageSize(1), first.next_cursor)
    assert [item.job_name for item in second.items] == ["b_second"]
    assert second.ceiling == first.ceiling
    assert second.next_cursor is not None  # a full page: the end is one page later
    assert explorer.job_names(PageSize(1), second.next_cursor).items == ()
    # The refusal is the same for a raised identity ceiling on any query.
    instances = explorer.instances("b_second", PageSize(1))
    binding = query_binding(ExplorerQuery.INSTANCES, PageSize(1), "b_second")
    forged = Cursor.issue(ExplorerQuery.INSTANCES, IdentityKey(2**62), 2**62, binding)
    with pytest.raises(CursorInvalid):
        explorer.instances("b_second", PageSize(1), forged)
    assert instances.ceiling >= 1


def test_a_cursor_reused_with_another_page_size_filter_or_query_is_refused(
    repository: JobRepository, clock: ManualClock, explorer: JobExplorer
) -> None:
    """Scenario K5."""
    for _ in range(3):
        launch(repository, clock, "bound")
    launch(repository, clock, "other")
    cursor = explorer.instances("bound", PageSize(1)).next_cursor
    assert cursor is not None
    with pytest.raises(CursorQueryMismatch):
        explorer.instances("bound", PageSize(2), cursor)
    with pytest.raises(CursorQueryMismatch):
        explorer.instances("other", PageSize(1), cursor)
    steps_cursor = Cursor.issue(ExplorerQuery.STEP_EXECUTIONS, IdentityKey(5), 9, bytes(8))
    execution = launch(repository, clock)
    with pytest.raises(CursorQueryMismatch):
        explorer.recovery_decisions(execution.id, PageSize(1), steps_cursor)
    for bad in (0, 501):
        with pytest.raises(PageSizeOutOfRange) as refused:
            PageSize(bad)
        assert refused.value.requested == bad
    assert (PageSize().value, PageSize(1).value, PageSize(500).value) == (50, 1, 500)


def test_identity_cursor_given_to_executions_is_invalid(
    repository: JobRepository, clock: ManualClock, explorer: JobExplorer
) -> None:
    """Scenario K11."""
    failed = launch(repository, clock, status=S.FAILED)
    restart_after_failure(repository, clock, failed)
    cursor = explorer.instances("orders", PageSize(1)).next_cursor or Cursor.issue(
        ExplorerQuery.INSTANCES, IdentityKey(1), 1, bytes(8)
    )
    forged = bytearray(cursor.data)
    forged[1] = ExplorerQuery.EXECUTIONS.value  # an intact Identity cursor "for" executions
    with pytest.raises(CursorInvalid):
        explorer.executions(failed.job_instance_id, PageSize(1), reseal(bytes(forged)))


# --------------------------------------------------------------------------- K6, K7, K8


def test_every_listing_of_an_empty_database_is_one_empty_page_with_ceiling_zero(
    repository: JobRepository, clock: ManualClock, explorer: JobExplorer
) -> None:
    """Scenario K6."""
    day = ParameterFilter.parse(["business_date=2024-01-01"])
    for page in (
        explorer.job_names(),
        explorer.instances("none"),
        explorer.instances("none", parameters=day),
        explorer.executions_with_parameters(day),
        explorer.unresolved_executions(timedelta(minutes=1)),
    ):
        assert (page.items, page.next_cursor, page.ceiling) == ((), None, 0)
    execution = launch(repository, clock, status=S.STARTING)  # nothing under it yet
    for listing in (
        explorer.step_executions,
        explorer.recovery_decisions,
        explorer.flow_decisions,
        explorer.operator_requests,
        explorer.skips,
    ):
        below = listing(execution.id)
        assert (below.items, below.next_cursor, below.ceiling) == ((), None, 0)


def test_projections_carry_identifying_values_never_other_parameters_or_payloads(
    repository: JobRepository, explorer: JobExplorer
) -> None:
    """Scenario K7: the values that tell instances apart, and nothing else of a run's input."""
    secret = "s3cret-value-0xC0FFEE"
    password = JobParameter(ParameterValue.string(secret), identifying=False)
    parameters = JobParameters.of({"token": "t-1", "n": 5, "flag": True, "password": password})

    def load(step: StepRun) -> None:
        with step.chunk() as chunk:
            chunk.commit(read=1, written=1, checkpoint={"secret": secret})

    with Job(repository, "redacted", parameters).launch() as run:
        run.step("load", load)
    (instance,) = explorer.instances("redacted").items
    assert [(p.name, p.kind, p.value, p.identifying) for p in instance.parameters] == [
        ("flag", "bool", True, True),
        ("n", "i64", 5, True),
        ("token", "string", "t-1", True),
    ]
    (execution,) = explorer.executions(instance.id).items
    assert execution.parameters == instance.parameters
    steps = explorer.step_executions(execution.id).items
    views = [instance.as_json(), execution.as_json(), *(s.as_json() for s in steps)]
    assert views[0]["parameters"][2] == {
        "name": "token",
        "kind": "string",
        "value": "t-1",
        "identifying": True,
    }
    for view in views:
        text = json.dumps(view)
        assert secret not in text
        assert "payload" not in text
    assert "t-1" not in repr(instance) + repr(execution)
    assert steps[0].checkpoint.encoded_len > 0 and steps[0].checkpoint.kind == "checkpoint"


def test_pages_stop_before_the_response_bound(
    repository: JobRepository, clock: ManualClock, explorer: JobExplorer
) -> None:
    """Scenario K8."""

    def wide(prefix: str, count: int) -> dict[str, Any]:
        return {f"{prefix}{i:05d}" + "x" * 100: i for i in range(count)}

    for run in range(3):  # ~ 120 KiB of parameter descriptors each
        launch(repository, clock, "wide", wide(f"r{run}_", 700))
    page = explorer.instances("wide", PageSize(3))
    assert len(page.items) == 2
    assert page.next_cursor is not None  # truncated, so there is a next page
    rest = explorer.instances("wide", PageSize(3), page.next_cursor)
    assert len(rest.items) == 1
    assert sum(len(json.dumps(i.as_json())) for i in page.items) < MAX_RESPONSE_BYTES

    launch(repository, clock, "huge", wide("h", 2400))  # one row alone over 256 KiB
    with pytest.raises(ResponseTooLarge) as raised:
        explorer.instances("huge", PageSize(7))
    assert raised.value.limit == 7


# --------------------------------------------------------------------------- K9, K10


def test_uncommitted_unit_of_work_writes_are_invisible(
    repository: JobRepository, clock: ManualClock, explorer: JobExplorer
) -> None:
    """Scenario K9."""
    with repository.begin() as uow:
        uow.instances.select_or_create(
            JobInstanceKey(JobName("pending"), JobParameters.of({"k": 1}))
        )
        assert explorer.job_names().items == ()
        assert explorer.instances("pending").items == ()
        uow.commit()
    assert [n.job_name for n in explorer.job_names().items] == ["pending"]


def test_reads_under_a_missing_parent_name_it_or_return_nothing(
    repository: JobRepository, clock: ManualClock, explorer: JobExplorer
) -> None:
    """Scenario K10."""

    def cause(call: Any) -> Any:
        with pytest.raises(ExplorerRepositoryError) as raised:
            call()
        return raised.value.error

    assert isinstance(cause(lambda: explorer.executions(999)), JobInstanceNotFound)
    for listing in (
        explorer.step_executions,
        explorer.recovery_decisions,
        explorer.flow_decisions,
        explorer.operator_requests,
    ):
        error = cause(lambda listing=listing: listing(999))
        assert isinstance(error, JobExecutionNotFound)
        assert error.id == 999
    assert isinstance(cause(lambda: explorer.step_partitions(999)), StepExecutionNotFound)
    assert explorer.instances("never-launched").items == ()
    assert explorer.execution(999) is None
    # Tables other features fill: an existing parent without rows is an empty page.
    execution = launch(repository, clock)
    assert explorer.flow_decisions(execution.id).items == ()
    assert explorer.operator_requests(execution.id).items == ()
    assert explorer.recovery_decisions(execution.id).items == ()


# --------------------------------------------------------------------------- K12


def test_owner_recorded_and_derived_counts_exclude_partition_workers(
    repository: JobRepository,
    clock: ManualClock,
    explorer: JobExplorer,
    admin: psycopg.Connection[Any],
) -> None:
    """Scenario K12."""
    execution = launch(repository, clock)
    assert explorer.execution(execution.id).owner_recorded is False  # type: ignore[union-attr]
    with repository.begin() as uow:
        plain, parent, worker_a, worker_b = (
            create_step(uow, execution.id, StepName(name)).id
            for name in ("plain", "parent", "worker-a", "worker-b")
        )
        uow.commit()
    counters = {plain: 10, parent: 100, worker_a: 40, worker_b: 60}
    for step_id, n in counters.items():
        admin.execute(
            "UPDATE pybatch.step_execution SET read_count = %s, processed_count = %s,"
            " write_count = %s, commit_count = 1 WHERE id = %s",
            (n, n, n, step_id),
        )
    for ordinal, worker in ((1, worker_a), (2, worker_b)):
        admin.execute(
            "INSERT INTO pybatch.step_partition (step_execution_id, worker_step_execution_id,"
            " partition_key, partition_ordinal, status, context_format, context_schema,"
            " context_schema_version, context_payload, context_checksum)"
            " VALUES (%s, %s, %s, %s, 'STARTED', 1, 'p', 1, '{}', %s)",
            (parent, worker, f"key-{ordinal}", ordinal, bytes(32)),
        )
    admin.execute(
        "UPDATE pybatch.job_execution SET owner_token = %s WHERE id = %s",
        (bytes(range(16)), execution.id),
    )
    projection = explorer.execution(execution.id)
    assert projection is not None
    assert projection.owner_recorded is True
    assert projection.counts.read == 110  # plain + parent; the workers are counted once, via it
    assert projection.counts.commits == 2
    partitions = explorer.step_partitions(parent).items
    assert [(p.ordinal, p.worker_step_execution_id) for p in partitions] == [
        (1, worker_a),
        (2, worker_b),
    ]
    assert [p.id for p in explorer.executions(execution.job_instance_id).items] == [execution.id]


def test_corrupt_row_fails_closed(
    repository: JobRepository,
    clock: ManualClock,
    explorer: JobExplorer,
    admin: psycopg.Connection[Any],
) -> None:
    execution = launch(repository, clock)
    admin.execute("ALTER TABLE pybatch.job_execution DISABLE TRIGGER job_execution_rules")
    admin.execute(
        "UPDATE pybatch.job_execution SET status = 'started' WHERE id = %s", (execution.id,)
    )
    with pytest.raises(ExplorerRepositoryError) as raised:
        explorer.execution(execution.id)
    assert isinstance(raised.value.error, Unavailable)


def test_operator_requests_are_listed_as_records(
    repository: JobRepository, clock: ManualClock, explorer: JobExplorer
) -> None:
    from pybatch.values.names import ActorRef, OperationId
    from pybatch.values.operator import (
        OperatorAction,
        OperatorOutcomeClass,
        OperatorRecordDraft,
        RequestDigest,
    )

    execution = launch(repository, clock)
    with repository.begin() as uow:
        uow.operator_requests.append(
            OperatorRecordDraft(
                action=OperatorAction.STOP,
                operation_id=OperationId("op-1"),
                actor=ActorRef("alice"),
                reason=None,
                digest=RequestDigest(bytes(32)),
                job_instance_id=execution.job_instance_id,
                job_execution_id=execution.id,
                observed_version=execution.version,
                prior_status=S.STARTED,
                result_status=S.STOPPING,
                outcome=OperatorOutcomeClass.APPLIED,
                rejection=None,
                requested_at=clock.now(),
            )
        )
        uow.commit()
    (record,) = explorer.operator_requests(execution.id).items
    assert record.action is OperatorAction.STOP
    assert operator_request_json(record)["actor"] == "alice"


def test_statement_timeout_is_explorer_timeout(
    pg_config: ConnectionConfig, admin: psycopg.Connection[Any]
) -> None:
    # Equal lock and statement timeouts: PostgreSQL cancels with the statement timeout.
    config = attrs.evolve(
        pg_config,
        statement_timeout=timedelta(milliseconds=200),
        lock_timeout=timedelta(milliseconds=200),
    )
    with JobRepository.connect(config) as repository, admin.transaction():
        admin.execute("LOCK TABLE pybatch.job_instance IN ACCESS EXCLUSIVE MODE")
        with pytest.raises(ExplorerTimeout):
            JobExplorer(repository).job_names()
