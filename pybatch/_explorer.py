"""The explorer: read-only, keyset-paged views of everything the repository records.

Every page is its own READ COMMITTED, READ ONLY transaction with the configured timeouts, always
rolled back: no locks, never part of a unit of work. A traversal fixes an identity ceiling on its
first page and carries it in the cursor, so rows created meanwhile never join it.

A cursor is not a credential: its unkeyed SHA-256 catches damage, not forgery. A forger could
only raise the ceiling, so every continued page reads the current ceiling in the same transaction
and refuses a higher one (`CursorInvalid`); any lower ceiling and key describe a window plain
paging reaches anyway. Keying it (HMAC) was rejected: a per-process key breaks cursors across
`pybatch` invocations, and a key in the database is readable by every role that can page. The
cost is one index-backed `MAX(id)` per continued page; a traversal whose newest rows were purged
is refused the same way and starts again.
"""

from __future__ import annotations

import datetime as _dt
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import psycopg

from pybatch import _skips
from pybatch._codecs import explorer as codec
from pybatch._codecs._jsonb import CanonicalJsonb, to_jsonb
from pybatch._codecs._primitives import DecodeError, Row
from pybatch._job_repository import JobRepository
from pybatch._statements import Statement
from pybatch.errors import (
    CursorInvalid,
    ExplorerAgeBoundTooSmall,
    ExplorerRepositoryError,
    ExplorerTimeout,
    JobExecutionNotFound,
    JobInstanceNotFound,
    PageSizeOutOfRange,
    RepositoryError,
    ResponseTooLarge,
    StepExecutionNotFound,
    Unavailable,
)
from pybatch.values.explorer import (
    MAX_PAGE_SIZE,
    MAX_RESPONSE_BYTES,
    MIN_UNRESOLVED_AGE,
    Cursor,
    CursorKey,
    ExplorerQuery,
    IdentityKey,
    JobExecutionProjection,
    JobInstanceProjection,
    JobNameSummary,
    LatestAttempt,
    NameKey,
    OrderedKey,
    Page,
    PageSize,
    ParameterFilter,
    RunningExecution,
    StepExecutionProjection,
    StepPartitionProjection,
    flow_decision_json,
    operator_request_json,
    query_binding,
    recovery_decision_json,
)
from pybatch.values.flow import FlowDecision
from pybatch.values.ids import INT64_MAX, IdentifierKind, check_identifier
from pybatch.values.operator import OperatorRecord
from pybatch.values.recovery import RecoveryDecision
from pybatch.values.status import FailureReason

T = TypeVar("T")
Conn = psycopg.Connection[Any]
#: Reads the rows after a key; `bounds` holds the `ceiling` and `row_limit` parameters.
Fetch = Callable[[Conn, CursorKey | None, dict[str, int]], list[Row]]
#: A child listing's parent: the statement telling whether it exists, the error when it does
#: not, and the statement's parameters.
Parent = tuple[Statement, RepositoryError, dict[str, Any]]


#: The longest run history `recent_executions` reads.
MAX_RECENT_EXECUTIONS = 50

_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))


def _row_size(item: object) -> int:
    """UTF-8 size of a row's compact JSON: an estimate (the bound is per page), so no canonical."""
    if isinstance(item, OperatorRecord):
        document = operator_request_json(item)
    elif isinstance(item, FlowDecision):
        document = flow_decision_json(item)
    elif isinstance(item, RecoveryDecision):
        document = recovery_decision_json(item)
    else:
        as_json: Callable[[], dict[str, Any]] = item.as_json  # type: ignore[attr-defined]
        document = as_json()
    return len(_ENCODER.encode(document).encode("utf-8"))


def _documents(parameters: ParameterFilter | None) -> list[CanonicalJsonb]:
    """The jsonb[] of identifying-parameter fragments `parameters` matches; none: `{}`, any."""
    return [to_jsonb(d) for d in ([{}] if parameters is None else parameters.documents())]


@contextmanager
def _explorer_errors() -> Iterator[None]:
    """Repository failures as explorer errors; a row that does not decode is Unavailable."""
    try:
        yield
    except DecodeError:
        raise ExplorerRepositoryError(error=Unavailable()) from None
    except Unavailable as error:
        if error.sqlstate == "57014":
            raise ExplorerTimeout() from None
        raise ExplorerRepositoryError(error=error) from None
    except RepositoryError as error:  # PermissionDenied and the like keep their name
        raise ExplorerRepositoryError(error=error) from None


class JobExplorer:
    """Paged reads over a `JobRepository`'s pool (docs/contract.md, Explorer)."""

    def __init__(self, repository: JobRepository) -> None:
        self._repository = repository
        #: The transaction of a `pinned()` view, which every read then shares; else None.
        self._conn: Conn | None = None
        self._statements = q = repository.statements
        self._ceilings: dict[ExplorerQuery, Statement] = {
            ExplorerQuery.JOB_NAMES: q.explore_ceiling_job_names,
            ExplorerQuery.INSTANCES: q.explore_ceiling_instances,
            ExplorerQuery.EXECUTIONS: q.explore_ceiling_executions,
            ExplorerQuery.UNRESOLVED_EXECUTIONS: q.explore_ceiling_executions,
            ExplorerQuery.PARAMETER_EXECUTIONS: q.explore_ceiling_executions,
            ExplorerQuery.STEP_EXECUTIONS: q.explore_ceiling_step_executions,
            ExplorerQuery.RECOVERY_DECISIONS: q.explore_ceiling_recovery_decisions,
            ExplorerQuery.FLOW_DECISIONS: q.explore_ceiling_flow_decisions,
            ExplorerQuery.STEP_PARTITIONS: q.explore_ceiling_step_partitions,
            ExplorerQuery.OPERATOR_REQUESTS: q.explore_ceiling_operator_requests,
        }

    def __repr__(self) -> str:
        return f"JobExplorer({self._repository!r})"

    @property
    def repository(self) -> JobRepository:
        """The repository read, for a reader that also verifies its audit chain (the dashboard)."""
        return self._repository

    @contextmanager
    def pinned(self) -> Iterator[JobExplorer]:
        """A view whose reads all run in one read-only transaction: one page, one connection.

        The view is for one thread (a web request); the transaction is rolled back on exit.
        Its isolation stays READ COMMITTED, so each statement still sees its own snapshot.
        """
        view = JobExplorer(self._repository)
        try:
            with _explorer_errors(), self._repository.read_transaction() as conn:
                view._conn = conn
                yield view
        finally:
            view._conn = None

    def _read(self, work: Callable[[Conn], T]) -> T:
        """Run `work` in one read-only transaction, always rolled back; map failures."""
        with _explorer_errors():
            if self._conn is not None:  # a pinned view: its transaction maps driver errors
                return work(self._conn)
            with self._repository.read_transaction() as conn:
                return work(conn)

    def _ceiling(self, conn: Conn, query: ExplorerQuery, job_name: str | None) -> int:
        if query is ExplorerQuery.STEP_SKIPS:
            return _skips.skip_ceiling(self._statements, conn)
        params = {"job_name": job_name} if query is ExplorerQuery.INSTANCES else {}
        value = self._ceilings[query].scalar(conn, **params)
        if value is None:
            return 0
        if type(value) is not int or not 0 < value <= INT64_MAX:
            raise DecodeError("ceiling")
        return value

    def identity_ceiling(self, query: ExplorerQuery, *, job_name: str | None = None) -> int:
        """The current identity ceiling of `query` (0 when empty); `job_name` only for instances."""
        if query is ExplorerQuery.INSTANCES and job_name is None:
            raise TypeError("the instances ceiling is per job name")
        return self._read(lambda conn: self._ceiling(conn, query, job_name))

    def _page(
        self,
        query: ExplorerQuery,
        filter_value: object,
        page_size: PageSize | None,
        after: Cursor | None,
        fetch: Fetch,
        decode: Callable[[Row], T],
        key_of: Callable[[T], CursorKey],
        parent: Parent | None = None,
        *,
        job_name: str | None = None,
    ) -> Page[T]:
        page_size = page_size or PageSize()
        binding = query_binding(query, page_size, filter_value)
        key, ceiling = (None, None) if after is None else after.open(query, binding)

        def work(conn: Conn) -> tuple[list[T], int]:
            if parent is not None:
                exists, missing, parent_params = parent
                if not exists.scalar(conn, **parent_params):
                    raise ExplorerRepositoryError(error=missing)
            current = self._ceiling(conn, query, job_name)
            if ceiling is not None and ceiling > current:
                raise CursorInvalid()  # a ceiling no traversal was given (module docstring)
            bound = current if ceiling is None else ceiling
            if bound == 0:
                return [], 0
            bounds = {"ceiling": bound, "row_limit": page_size.value}
            return [decode(row) for row in fetch(conn, key, bounds)], bound

        items, bound = self._read(work)
        kept: list[T] = []
        total = 0
        for item in items:
            size = _row_size(item)
            if not kept and size > MAX_RESPONSE_BYTES:
                raise ResponseTooLarge(limit=page_size.value)
            total += size
            if total > MAX_RESPONSE_BYTES:
                break
            kept.append(item)
        # More may follow when the response bound cut the page short or the page is full.
        more = bool(kept) and (len(kept) < len(items) or len(items) == page_size.value)
        next_cursor = Cursor.issue(query, key_of(kept[-1]), bound, binding) if more else None
        return Page(items=tuple(kept), next_cursor=next_cursor, ceiling=bound)

    def job_names(
        self, page_size: PageSize | None = None, after: Cursor | None = None
    ) -> Page[JobNameSummary]:
        """Distinct job names of instances in byte order, with their latest execution."""

        def fetch(conn: Conn, key: CursorKey | None, bounds: dict[str, int]) -> list[Row]:
            after_name = key.name if isinstance(key, NameKey) else ""
            return self._statements.explore_job_names.many(conn, after_name=after_name, **bounds)

        return self._page(
            ExplorerQuery.JOB_NAMES,
            None,
            page_size,
            after,
            fetch,
            codec.decode_job_name_summary,
            lambda item: NameKey(item.job_name),
        )

    def instances(
        self,
        job_name: str,
        page_size: PageSize | None = None,
        after: Cursor | None = None,
        parameters: ParameterFilter | None = None,
    ) -> Page[JobInstanceProjection]:
        """Instances of `job_name` (with `parameters`), newest first; unknown: an empty page."""
        if type(job_name) is not str:
            raise TypeError("job_name must be a str")

        q = self._statements
        statement = (
            q.explore_instances if parameters is None else q.explore_instances_with_parameters
        )
        filtered = {} if parameters is None else {"parameter_documents": _documents(parameters)}

        def fetch(conn: Conn, key: CursorKey | None, bounds: dict[str, int]) -> list[Row]:
            before = key.id if isinstance(key, IdentityKey) else INT64_MAX
            return statement.many(conn, job_name=job_name, before_id=before, **filtered, **bounds)

        return self._page(
            ExplorerQuery.INSTANCES,
            job_name if parameters is None else [job_name, parameters.pairs],
            page_size,
            after,
            fetch,
            codec.decode_instance_projection,
            lambda item: IdentityKey(item.id),
            job_name=job_name,
        )

    def executions(
        self, job_instance_id: int, page_size: PageSize | None = None, after: Cursor | None = None
    ) -> Page[JobExecutionProjection]:
        """Attempts of an instance, (attempt, id) descending (wraps JobInstanceNotFound)."""
        check_identifier(IdentifierKind.JOB_INSTANCE, job_instance_id)

        def fetch(conn: Conn, key: CursorKey | None, bounds: dict[str, int]) -> list[Row]:
            last = (key.primary, key.id) if isinstance(key, OrderedKey) else (INT64_MAX, INT64_MAX)
            attempt, before = last
            return self._statements.explore_executions.many(
                conn,
                job_instance_id=job_instance_id,
                before_attempt=attempt,
                before_id=before,
                **bounds,
            )

        return self._page(
            ExplorerQuery.EXECUTIONS,
            job_instance_id,
            page_size,
            after,
            fetch,
            codec.decode_execution_projection,
            lambda item: OrderedKey(item.attempt, item.id),
            (
                self._statements.explore_job_instance_exists,
                JobInstanceNotFound(id=job_instance_id),
                {"job_instance_id": job_instance_id},
            ),
        )

    def executions_with_parameters(
        self,
        parameters: ParameterFilter,
        page_size: PageSize | None = None,
        after: Cursor | None = None,
    ) -> Page[JobExecutionProjection]:
        """Executions of every instance with `parameters`, of any job, newest (highest id) first."""

        def fetch(conn: Conn, key: CursorKey | None, bounds: dict[str, int]) -> list[Row]:
            return self._statements.explore_executions_with_parameters.many(
                conn,
                parameter_documents=_documents(parameters),
                before_id=key.id if isinstance(key, IdentityKey) else INT64_MAX,
                **bounds,
            )

        return self._page(
            ExplorerQuery.PARAMETER_EXECUTIONS,
            parameters.pairs,
            page_size,
            after,
            fetch,
            codec.decode_execution_projection,
            lambda item: IdentityKey(item.id),
        )

    def job_exists(self, job_name: str) -> bool:
        """Whether any instance has `job_name`: tells an unknown name from an empty page."""
        if type(job_name) is not str:
            raise TypeError("job_name must be a str")

        def work(conn: Conn) -> bool:
            return bool(self._statements.explore_job_name_exists.scalar(conn, job_name=job_name))

        return self._read(work)

    def execution(self, job_execution_id: int) -> JobExecutionProjection | None:
        """One execution projection, or None when it does not exist."""
        check_identifier(IdentifierKind.JOB_EXECUTION, job_execution_id)

        def work(conn: Conn) -> JobExecutionProjection | None:
            row = self._statements.explore_execution.one(conn, job_execution_id=job_execution_id)
            return None if row is None else codec.decode_execution_projection(row)

        return self._read(work)

    def failure_reasons(self, job_execution_id: int) -> dict[int | None, FailureReason]:
        """Why the execution (key None) and its steps (by id) failed, where recorded."""
        check_identifier(IdentifierKind.JOB_EXECUTION, job_execution_id)

        def work(conn: Conn) -> dict[int | None, FailureReason]:
            rows = self._statements.explore_failure_reasons.many(
                conn, job_execution_id=job_execution_id, row_limit=MAX_PAGE_SIZE
            )
            return dict(codec.decode_failure_reason(row) for row in rows)

        return self._read(work)

    def recent_executions(self, job_name: str, limit: int = 20) -> tuple[LatestAttempt, ...]:
        """The newest `limit` executions of a job name, newest first: a run history.

        `limit` is 1 to 50 (PageSizeOutOfRange): the statement reads at most `limit` attempts
        of each of the `limit` newest instances.
        """
        if type(job_name) is not str:
            raise TypeError("job_name must be a str")
        if type(limit) is not int or not 1 <= limit <= MAX_RECENT_EXECUTIONS:
            raise PageSizeOutOfRange(requested=limit)
        size = PageSize(limit)

        def work(conn: Conn) -> tuple[LatestAttempt, ...]:
            rows = self._statements.explore_recent_executions.many(
                conn, job_name=job_name, row_limit=size.value
            )
            return tuple(codec.decode_latest_attempt(row) for row in rows)

        return self._read(work)

    def latest_attempt(self, job_instance_id: int) -> LatestAttempt | None:
        """The instance's newest attempt, or None when it has none (or does not exist)."""
        check_identifier(IdentifierKind.JOB_INSTANCE, job_instance_id)

        def work(conn: Conn) -> LatestAttempt | None:
            row = self._statements.explore_latest_attempt.one(conn, job_instance_id=job_instance_id)
            return None if row is None else codec.decode_latest_attempt(row)

        return self._read(work)

    def _children(
        self, query: ExplorerQuery, parent_id: int, page_size: PageSize | None, after: Cursor | None
    ) -> Page[Any]:
        """A page of the rows under one job execution (or, for partitions, step execution)."""
        q = self._statements
        statement, decode = {
            ExplorerQuery.STEP_EXECUTIONS: (
                q.explore_step_executions,
                codec.decode_step_projection,
            ),
            ExplorerQuery.RECOVERY_DECISIONS: (
                q.explore_recovery_decisions,
                codec.decode_recovery_decision,
            ),
            ExplorerQuery.FLOW_DECISIONS: (q.explore_flow_decisions, codec.decode_flow_decision),
            ExplorerQuery.STEP_PARTITIONS: (
                q.explore_step_partitions,
                codec.decode_partition_projection,
            ),
            ExplorerQuery.OPERATOR_REQUESTS: (
                q.explore_operator_requests,
                codec.decode_operator_request,
            ),
        }[query]
        # Flow decisions page by (sequence, id), every other child listing by id.
        ordered = query is ExplorerQuery.FLOW_DECISIONS
        missing: RepositoryError
        if query is ExplorerQuery.STEP_PARTITIONS:
            kind, parent_column = IdentifierKind.STEP_EXECUTION, "step_execution_id"
            exists, missing = q.explore_step_execution_exists, StepExecutionNotFound(id=parent_id)
        else:
            kind, parent_column = IdentifierKind.JOB_EXECUTION, "job_execution_id"
            exists, missing = q.explore_job_execution_exists, JobExecutionNotFound(id=parent_id)
        check_identifier(kind, parent_id)

        def fetch(conn: Conn, key: CursorKey | None, bounds: dict[str, int]) -> list[Row]:
            params: dict[str, Any] = {parent_column: parent_id, **bounds}
            if ordered:
                params["after_sequence"], params["after_id"] = (
                    (key.primary, key.id) if isinstance(key, OrderedKey) else (0, 0)
                )
            else:
                params["after_id"] = key.id if isinstance(key, IdentityKey) else 0
            return statement.many(conn, **params)

        exists_check: Parent = (exists, missing, {parent_column: parent_id})

        def key_of(item: Any) -> CursorKey:
            return OrderedKey(item.sequence, item.id) if ordered else IdentityKey(item.id)

        return self._page(query, parent_id, page_size, after, fetch, decode, key_of, exists_check)

    def step_executions(
        self, job_execution_id: int, page_size: PageSize | None = None, after: Cursor | None = None
    ) -> Page[StepExecutionProjection]:
        """Steps of an execution, id ascending (wraps JobExecutionNotFound)."""
        return self._children(ExplorerQuery.STEP_EXECUTIONS, job_execution_id, page_size, after)

    def recovery_decisions(
        self, job_execution_id: int, page_size: PageSize | None = None, after: Cursor | None = None
    ) -> Page[RecoveryDecision]:
        """Recovery decisions of an execution, id ascending (wraps JobExecutionNotFound)."""
        return self._children(ExplorerQuery.RECOVERY_DECISIONS, job_execution_id, page_size, after)

    def flow_decisions(
        self, job_execution_id: int, page_size: PageSize | None = None, after: Cursor | None = None
    ) -> Page[FlowDecision]:
        """Flow decisions of an execution, (sequence, id) ascending (wraps JobExecutionNotFound)."""
        return self._children(ExplorerQuery.FLOW_DECISIONS, job_execution_id, page_size, after)

    def step_partitions(
        self, step_execution_id: int, page_size: PageSize | None = None, after: Cursor | None = None
    ) -> Page[StepPartitionProjection]:
        """Partitions of a manager step, id ascending (wraps StepExecutionNotFound)."""
        return self._children(ExplorerQuery.STEP_PARTITIONS, step_execution_id, page_size, after)

    def operator_requests(
        self, job_execution_id: int, page_size: PageSize | None = None, after: Cursor | None = None
    ) -> Page[OperatorRecord]:
        """Operator requests aimed at an execution, id ascending (wraps JobExecutionNotFound)."""
        return self._children(ExplorerQuery.OPERATOR_REQUESTS, job_execution_id, page_size, after)

    def running_executions(
        self, page_size: PageSize | None = None, after_id: int | None = None
    ) -> tuple[RunningExecution, ...]:
        """Executions running now (STARTED or STOPPING, lease live on the database clock).

        Id ascending after `after_id`, at most `page_size` of them (running executions are
        as many as the processes running them, so a page of 500 shows every one in practice).
        """
        page_size = page_size or PageSize()
        if after_id is not None:
            check_identifier(IdentifierKind.JOB_EXECUTION, after_id)

        def work(conn: Conn) -> tuple[RunningExecution, ...]:
            rows = self._statements.explore_running_executions.many(
                conn, after_id=after_id or 0, row_limit=page_size.value
            )
            return tuple(codec.decode_running_execution(row) for row in rows)

        return self._read(work)

    def skips(
        self, job_execution_id: int, page_size: PageSize | None = None, after: Cursor | None = None
    ) -> Page[_skips.StepSkip]:
        """Skip records of an execution's steps, id ascending (wraps JobExecutionNotFound).

        One per item `StepRun.load` skipped: its position and key, the SQLSTATE and the names
        the server gave, never the item's values.
        """
        check_identifier(IdentifierKind.JOB_EXECUTION, job_execution_id)

        def fetch(conn: Conn, key: CursorKey | None, bounds: dict[str, int]) -> list[Row]:
            return _skips.list_skips(
                self._statements,
                conn,
                job_execution_id,
                key.id if isinstance(key, IdentityKey) else 0,
                bounds["ceiling"],
                bounds["row_limit"],
            )

        return self._page(
            ExplorerQuery.STEP_SKIPS,
            job_execution_id,
            page_size,
            after,
            fetch,
            _skips.decode_skip,
            lambda item: IdentityKey(item.id),
            (
                self._statements.explore_job_execution_exists,
                JobExecutionNotFound(id=job_execution_id),
                {"job_execution_id": job_execution_id},
            ),
        )

    def skip_counts(self, job_execution_id: int) -> dict[int, int]:
        """How many items each step of the execution skipped (its read, process and write skips)."""
        check_identifier(IdentifierKind.JOB_EXECUTION, job_execution_id)
        return self._read(
            lambda conn: _skips.skip_counts(self._statements, conn, job_execution_id, MAX_PAGE_SIZE)
        )

    def unresolved_executions(
        self,
        minimum_age: _dt.timedelta,
        page_size: PageSize | None = None,
        after: Cursor | None = None,
        parameters: ParameterFilter | None = None,
    ) -> Page[JobExecutionProjection]:
        """Unresolved executions not updated for `minimum_age` (60 s or more), with `parameters`.

        The cutoff is the server's statement time minus the age, to the microsecond, so a client
        whose clock is wrong neither hides a stale run nor lists a fresh one.
        """
        if not isinstance(minimum_age, _dt.timedelta) or minimum_age < MIN_UNRESOLVED_AGE:
            seconds = minimum_age.total_seconds() if isinstance(minimum_age, _dt.timedelta) else -1
            raise ExplorerAgeBoundTooSmall(requested_seconds=seconds)
        age_us = minimum_age // _dt.timedelta(microseconds=1)

        def fetch(conn: Conn, key: CursorKey | None, bounds: dict[str, int]) -> list[Row]:
            return self._statements.explore_unresolved_executions.many(
                conn,
                minimum_age_us=age_us,
                parameter_documents=_documents(parameters),
                after_id=key.id if isinstance(key, IdentityKey) else 0,
                **bounds,
            )

        return self._page(
            ExplorerQuery.UNRESOLVED_EXECUTIONS,
            age_us if parameters is None else [age_us, parameters.pairs],
            page_size,
            after,
            fetch,
            codec.decode_execution_projection,
            lambda item: IdentityKey(item.id),
        )
