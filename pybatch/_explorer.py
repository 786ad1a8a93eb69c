"""Read-only keyset-paged views of all a repository records (docs/contract.md, Explorer)."""

from __future__ import annotations

import bisect
import datetime as _dt
import itertools
import json
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, TypeVar

import attrs

from pybatch import errors as e
from pybatch._codecs import explorer as codec
from pybatch._codecs._jsonb import CanonicalJsonb, to_jsonb
from pybatch._codecs._primitives import DecodeError, Row
from pybatch._codecs.executions import decode_recovery_decision
from pybatch._codecs.flow import decode_flow_decision
from pybatch._codecs.operator import decode_operator_record
from pybatch._job_repository import JobRepository
from pybatch._statements import Connection, Statement
from pybatch.values import explorer as v
from pybatch.values.explorer import Cursor, ExplorerQuery, Page, PageSize, ParameterFilter
from pybatch.values.flow import FlowDecision
from pybatch.values.ids import INT64_MAX, IdentifierKind, check_identifier
from pybatch.values.operator import OperatorRecord
from pybatch.values.recovery import RecoveryDecision
from pybatch.values.status import FailureReason

T = TypeVar("T")
Q, K = ExplorerQuery, IdentifierKind

#: The longest run history `recent_executions` reads.
MAX_RECENT_EXECUTIONS = 50

_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))


#: The statement parameters a cursor key fills, with their values on a first page (every other
#: listing: `after_id`, from 0), and the item attributes the key is made of (else the id).
_STARTS: dict[ExplorerQuery, Mapping[str, object]] = {
    Q.JOB_NAMES: {"after_name": ""},
    Q.INSTANCES: {"before_id": INT64_MAX},
    Q.EXECUTIONS: {"before_attempt": INT64_MAX, "before_id": INT64_MAX},
    Q.PARAMETER_EXECUTIONS: {"before_id": INT64_MAX},
    Q.FLOW_DECISIONS: {"after_sequence": 0, "after_id": 0},
}
_KEYS = {
    Q.JOB_NAMES: ("job_name",),
    Q.EXECUTIONS: ("attempt", "id"),
    Q.FLOW_DECISIONS: ("sequence", "id"),
}


#: The JSON of the rows that are not explorer projections (which have `as_json`).
_AS_JSON: dict[type, Callable[[Any], dict[str, Any]]] = {
    OperatorRecord: v.operator_request_json,
    FlowDecision: v.flow_decision_json,
    RecoveryDecision: v.recovery_decision_json,
}


def _row_size(item: Any) -> int:
    """UTF-8 size of a row's compact JSON: an estimate (the bound is per page), so no canonical."""
    document = _AS_JSON[type(item)](item) if type(item) in _AS_JSON else item.as_json()
    return len(_ENCODER.encode(document).encode("utf-8"))


def shown_instant(value: _dt.datetime | None) -> str:
    """A timestamp as the CLI and the dashboard show it, to the second; None is `-`."""
    return "-" if value is None else value.strftime("%Y-%m-%d %H:%M:%S")


def _documents(parameters: ParameterFilter | None) -> list[CanonicalJsonb]:
    """The jsonb[] of identifying-parameter fragments `parameters` matches; none: `{}`, any."""
    return [to_jsonb(d) for d in ([{}] if parameters is None else parameters.documents())]


def _taken(statement: Statement, params: dict[str, object]) -> dict[str, object]:
    """The parameters of `params` that `statement` takes."""
    return {name: params[name] for name in statement.parameters}


def _check_name(job_name: str) -> None:
    if type(job_name) is not str:
        raise TypeError("job_name must be a str")


@contextmanager
def _explorer_errors() -> Iterator[None]:
    """Repository failures as explorer errors; a row that does not decode is Unavailable."""
    try:
        yield
    except DecodeError:
        raise e.ExplorerRepositoryError(error=e.Unavailable()) from None
    except e.Unavailable as error:
        if error.sqlstate == "57014":
            raise e.ExplorerTimeout() from None
        raise e.ExplorerRepositoryError(error=error) from None
    except e.RepositoryError as error:  # PermissionDenied and the like keep their name
        raise e.ExplorerRepositoryError(error=error) from None


def all_pages(
    listing: Callable[[int, PageSize, Cursor | None], Page[T]], parent_id: int, pages: int = 0
) -> tuple[list[T], bool]:
    """The rows under a parent, up to `pages` full pages (0: all); True when more remain."""
    size, after = PageSize(v.MAX_PAGE_SIZE), None
    items: list[T] = []
    for _ in range(pages) if pages else itertools.count():
        page = listing(parent_id, size, after)
        items.extend(page.items)
        after = page.next_cursor
        if after is None:
            break
    return items, after is not None


class JobExplorer:
    """Paged reads over a `JobRepository`'s pool (docs/contract.md, Explorer)."""

    def __init__(self, repository: JobRepository) -> None:
        self._repository = repository
        #: The transaction of a `pinned()` view, which every read then shares; else None.
        self._conn: Connection | None = None
        self._statements = q = repository.statements
        # A child listing's parent: the statement telling whether it exists (its one parameter
        # is the parent's id, named as in the listing's statement), the id's kind, its error.
        execution = (q.explore_job_execution_exists, K.JOB_EXECUTION, e.JobExecutionNotFound)
        step = (q.explore_step_execution_exists, K.STEP_EXECUTION, e.StepExecutionNotFound)
        children = (Q.STEP_EXECUTIONS, Q.RECOVERY_DECISIONS, Q.FLOW_DECISIONS, Q.OPERATOR_REQUESTS)
        self._parents: dict[ExplorerQuery, tuple[Statement, IdentifierKind, Callable[..., Any]]] = {
            Q.EXECUTIONS: (q.explore_job_instance_exists, K.JOB_INSTANCE, e.JobInstanceNotFound),
            Q.STEP_PARTITIONS: step,
            **dict.fromkeys((*children, Q.STEP_SKIPS), execution),
        }
        decode_execution = codec.decode_execution_projection
        #: Each listing's statement and row decoder.
        self._listings: dict[ExplorerQuery, tuple[Statement, Callable[[Row], Any]]] = {
            Q.JOB_NAMES: (q.explore_job_names, codec.decode_job_name_summary),
            Q.INSTANCES: (q.explore_instances, codec.decode_instance_projection),
            Q.EXECUTIONS: (q.explore_executions, decode_execution),
            Q.PARAMETER_EXECUTIONS: (q.explore_executions_with_parameters, decode_execution),
            Q.UNRESOLVED_EXECUTIONS: (q.explore_unresolved_executions, decode_execution),
            Q.STEP_EXECUTIONS: (q.explore_step_executions, codec.decode_step_projection),
            Q.RECOVERY_DECISIONS: (q.explore_recovery_decisions, decode_recovery_decision),
            Q.FLOW_DECISIONS: (q.explore_flow_decisions, decode_flow_decision),
            Q.STEP_PARTITIONS: (q.explore_step_partitions, codec.decode_partition_projection),
            Q.OPERATOR_REQUESTS: (q.explore_operator_requests, decode_operator_record),
            Q.STEP_SKIPS: (q.explore_step_skips, codec.decode_step_skip),
        }
        executions = (Q.EXECUTIONS, Q.PARAMETER_EXECUTIONS, Q.UNRESOLVED_EXECUTIONS)
        #: Each listing's identity ceiling statement.
        self._ceilings = {
            Q.JOB_NAMES: q.explore_ceiling_job_names,
            Q.INSTANCES: q.explore_ceiling_instances,
            **dict.fromkeys(executions, q.explore_ceiling_executions),
            Q.STEP_EXECUTIONS: q.explore_ceiling_step_executions,
            Q.RECOVERY_DECISIONS: q.explore_ceiling_recovery_decisions,
            Q.FLOW_DECISIONS: q.explore_ceiling_flow_decisions,
            Q.STEP_PARTITIONS: q.explore_ceiling_step_partitions,
            Q.OPERATOR_REQUESTS: q.explore_ceiling_operator_requests,
            Q.STEP_SKIPS: q.explore_ceiling_step_skips,
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

    def _read(self, work: Callable[[Connection], T]) -> T:
        """Run `work` in one read-only transaction, always rolled back; map failures."""
        with _explorer_errors():
            if self._conn is not None:  # a pinned view: its transaction maps driver errors
                return work(self._conn)
            with self._repository.read_transaction() as conn:
                return work(conn)

    def _one(self, statement: Statement, decode: Callable[[Row], T], **params: object) -> T | None:
        """The decoded row of a `:one` statement, or None when it returns none."""
        return self._read(
            lambda conn: None if (row := statement.one(conn, **params)) is None else decode(row)
        )

    def _many(self, statement: Statement, decode: Callable[[Row], T], **params: object) -> list[T]:
        """The decoded rows of a `:many` statement."""
        return self._read(lambda conn: [decode(row) for row in statement.many(conn, **params)])

    def _page(
        self,
        query: ExplorerQuery,
        page_size: PageSize | None,
        after: Cursor | None,
        bound_to: object,
        rows: Statement | None = None,
        **params: object,
    ) -> Page[Any]:
        """A page of `query` with `params` (of its statement); its cursor binds `bound_to`."""
        statement, decode = self._listings[query]
        ceilings = self._ceilings[query]
        starts = _STARTS.get(query, {"after_id": 0})
        page_size = page_size or PageSize()
        binding = v.query_binding(query, page_size, bound_to)
        key, ceiling = (None, None) if after is None else after.open(query, binding)
        start = starts if key is None else dict(zip(starts, attrs.astuple(key), strict=True))

        def work(conn: Connection) -> tuple[list[Any], int]:
            if query in self._parents:
                exists, _, missing = self._parents[query]
                if not exists.scalar(conn, **_taken(exists, params)):
                    (parent_id,) = _taken(exists, params).values()
                    raise e.ExplorerRepositoryError(error=missing(id=parent_id))
            current = ceilings.scalar(conn, **_taken(ceilings, params))  # None: no rows yet
            if current is not None and (type(current) is not int or not 0 < current <= INT64_MAX):
                raise DecodeError("ceiling")
            current = current or 0
            if ceiling is not None and ceiling > current:
                raise e.CursorInvalid()  # a forged ceiling (docs/contract.md, Explorer vocabulary)
            bound = current if ceiling is None else ceiling
            if bound == 0:
                return [], 0
            found = (rows or statement).many(
                conn, **start, **params, ceiling=bound, row_limit=page_size.value
            )
            return [decode(row) for row in found], bound

        items, bound = self._read(work)
        totals = list(itertools.accumulate(map(_row_size, items)))  # the page's size row by row
        if totals and totals[0] > v.MAX_RESPONSE_BYTES:
            raise e.ResponseTooLarge(limit=page_size.value)
        kept = items[: bisect.bisect_right(totals, v.MAX_RESPONSE_BYTES)]
        # More may follow when the response bound cut the page short or the page is full.
        more = bool(kept) and (len(kept) < len(items) or len(items) == page_size.value)
        if not more:
            return Page(items=tuple(kept), next_cursor=None, ceiling=bound)
        last = query.key_kind(*(getattr(kept[-1], name) for name in _KEYS.get(query, ("id",))))
        return Page(tuple(kept), Cursor.issue(query, last, bound, binding), bound)

    def job_names(
        self, page_size: PageSize | None = None, after: Cursor | None = None
    ) -> Page[v.JobNameSummary]:
        """Distinct job names of instances in byte order, with their latest execution."""
        return self._page(Q.JOB_NAMES, page_size, after, None)

    def instances(
        self,
        job_name: str,
        page_size: PageSize | None = None,
        after: Cursor | None = None,
        parameters: ParameterFilter | None = None,
    ) -> Page[v.JobInstanceProjection]:
        """Instances of `job_name` (with `parameters`), newest first; unknown: an empty page."""
        _check_name(job_name)
        if parameters is None:
            return self._page(Q.INSTANCES, page_size, after, job_name, job_name=job_name)
        return self._page(
            Q.INSTANCES,
            page_size,
            after,
            [job_name, parameters.pairs],
            self._statements.explore_instances_with_parameters,
            job_name=job_name,
            parameter_documents=_documents(parameters),
        )

    def executions(
        self, job_instance_id: int, page_size: PageSize | None = None, after: Cursor | None = None
    ) -> Page[v.JobExecutionProjection]:
        """Attempts of an instance, (attempt, id) descending (wraps JobInstanceNotFound)."""
        return self._children(Q.EXECUTIONS, job_instance_id, page_size, after)

    def executions_with_parameters(
        self,
        parameters: ParameterFilter,
        page_size: PageSize | None = None,
        after: Cursor | None = None,
    ) -> Page[v.JobExecutionProjection]:
        """Executions of every instance with `parameters`, of any job, newest (highest id) first."""
        return self._page(
            Q.PARAMETER_EXECUTIONS,
            page_size,
            after,
            parameters.pairs,
            parameter_documents=_documents(parameters),
        )

    def unresolved_executions(
        self,
        minimum_age: _dt.timedelta,
        page_size: PageSize | None = None,
        after: Cursor | None = None,
        parameters: ParameterFilter | None = None,
    ) -> Page[v.JobExecutionProjection]:
        """Unresolved executions not updated for `minimum_age` (60 s or more), with `parameters`.

        The cutoff is the server's statement time minus the age, to the microsecond, so a client
        whose clock is wrong neither hides a stale run nor lists a fresh one.
        """
        if not isinstance(minimum_age, _dt.timedelta) or minimum_age < v.MIN_UNRESOLVED_AGE:
            seconds = minimum_age.total_seconds() if isinstance(minimum_age, _dt.timedelta) else -1
            raise e.ExplorerAgeBoundTooSmall(requested_seconds=seconds)
        age_us = minimum_age // _dt.timedelta(microseconds=1)
        return self._page(
            Q.UNRESOLVED_EXECUTIONS,
            page_size,
            after,
            age_us if parameters is None else [age_us, parameters.pairs],
            minimum_age_us=age_us,
            parameter_documents=_documents(parameters),
        )

    def step_executions(
        self, job_execution_id: int, page_size: PageSize | None = None, after: Cursor | None = None
    ) -> Page[v.StepExecutionProjection]:
        """Steps of an execution, id ascending (wraps JobExecutionNotFound)."""
        return self._children(Q.STEP_EXECUTIONS, job_execution_id, page_size, after)

    def recovery_decisions(
        self, job_execution_id: int, page_size: PageSize | None = None, after: Cursor | None = None
    ) -> Page[RecoveryDecision]:
        """Recovery decisions of an execution, id ascending (wraps JobExecutionNotFound)."""
        return self._children(Q.RECOVERY_DECISIONS, job_execution_id, page_size, after)

    def flow_decisions(
        self, job_execution_id: int, page_size: PageSize | None = None, after: Cursor | None = None
    ) -> Page[FlowDecision]:
        """Flow decisions of an execution, (sequence, id) ascending (wraps JobExecutionNotFound)."""
        return self._children(Q.FLOW_DECISIONS, job_execution_id, page_size, after)

    def step_partitions(
        self, step_execution_id: int, page_size: PageSize | None = None, after: Cursor | None = None
    ) -> Page[v.StepPartitionProjection]:
        """Partitions of a manager step, id ascending (wraps StepExecutionNotFound)."""
        return self._children(Q.STEP_PARTITIONS, step_execution_id, page_size, after)

    def operator_requests(
        self, job_execution_id: int, page_size: PageSize | None = None, after: Cursor | None = None
    ) -> Page[OperatorRecord]:
        """Operator requests aimed at an execution, id ascending (wraps JobExecutionNotFound)."""
        return self._children(Q.OPERATOR_REQUESTS, job_execution_id, page_size, after)

    def skips(
        self, job_execution_id: int, page_size: PageSize | None = None, after: Cursor | None = None
    ) -> Page[v.StepSkip]:
        """Skip records of an execution's steps, id ascending (wraps JobExecutionNotFound).

        One per item `StepRun.load` skipped: its position and key, the SQLSTATE and the names
        the server gave, never the item's values.
        """
        return self._children(Q.STEP_SKIPS, job_execution_id, page_size, after)

    def _children(
        self, query: ExplorerQuery, parent_id: int, page_size: PageSize | None, after: Cursor | None
    ) -> Page[Any]:
        """A page of the rows under one parent (an instance, a job or a step execution)."""
        exists, kind, _ = self._parents[query]
        check_identifier(kind, parent_id)
        (parameter,) = exists.parameters
        return self._page(query, page_size, after, parent_id, None, **{parameter: parent_id})

    def job_exists(self, job_name: str) -> bool:
        """Whether any instance has `job_name`: tells an unknown name from an empty page."""
        _check_name(job_name)
        exists = self._statements.explore_job_name_exists
        return self._read(lambda conn: bool(exists.scalar(conn, job_name=job_name)))

    def execution(self, job_execution_id: int) -> v.JobExecutionProjection | None:
        """One execution projection, or None when it does not exist."""
        check_identifier(IdentifierKind.JOB_EXECUTION, job_execution_id)
        return self._one(
            self._statements.explore_execution,
            codec.decode_execution_projection,
            job_execution_id=job_execution_id,
        )

    def latest_attempt(self, job_instance_id: int) -> v.LatestAttempt | None:
        """The instance's newest attempt, or None when it has none (or does not exist)."""
        check_identifier(IdentifierKind.JOB_INSTANCE, job_instance_id)
        return self._one(
            self._statements.explore_latest_attempt,
            codec.decode_latest_attempt,
            job_instance_id=job_instance_id,
        )

    def failure_reasons(self, job_execution_id: int) -> dict[int | None, FailureReason]:
        """Why the execution (key None) and its steps (by id) failed, where recorded."""
        check_identifier(IdentifierKind.JOB_EXECUTION, job_execution_id)
        reasons = self._many(
            self._statements.explore_failure_reasons,
            codec.decode_failure_reason,
            job_execution_id=job_execution_id,
            row_limit=v.MAX_PAGE_SIZE,
        )
        return dict(reasons)

    def skip_counts(self, job_execution_id: int) -> dict[int, int]:
        """How many items each step of the execution skipped (its read, process and write skips)."""
        check_identifier(IdentifierKind.JOB_EXECUTION, job_execution_id)
        counts = self._many(
            self._statements.explore_step_skip_counts,
            codec.decode_skip_count,
            job_execution_id=job_execution_id,
            row_limit=v.MAX_PAGE_SIZE,
        )
        return dict(counts)

    def recent_executions(self, job_name: str, limit: int = 20) -> tuple[v.LatestAttempt, ...]:
        """The newest `limit` (1 to 50) executions of a job name, newest first: a run history."""
        _check_name(job_name)
        if type(limit) is not int or not 1 <= limit <= MAX_RECENT_EXECUTIONS:
            raise e.PageSizeOutOfRange(requested=limit)
        recent = self._many(
            self._statements.explore_recent_executions,
            codec.decode_latest_attempt,
            job_name=job_name,
            row_limit=limit,
        )
        return tuple(recent)

    def running_executions(
        self, page_size: PageSize | None = None, after_id: int | None = None
    ) -> tuple[v.RunningExecution, ...]:
        """Executions whose lease is live on the database clock, id ascending after `after_id`."""
        page_size = page_size or PageSize()
        if after_id is not None:
            check_identifier(IdentifierKind.JOB_EXECUTION, after_id)
        running = self._many(
            self._statements.explore_running_executions,
            codec.decode_running_execution,
            after_id=after_id or 0,
            row_limit=page_size.value,
        )
        return tuple(running)
