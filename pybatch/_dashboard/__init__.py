"""`pybatch dashboard`: a read-only WSGI app over the explorer, HTML rendered on the server.

Flask (the `dashboard` extra) with Jinja2's autoescaping: every value is escaped, the pages carry
no script, and a Content-Security-Policy forbids any. Each page reads through one pinned
`JobExplorer` view, so through one read-only transaction on one pooled connection, with the
explorer's bounds (pages of at most 500 rows; identifying parameter values, never state
payloads). Only GET and HEAD are served; any other method is 405, so the app cannot
write even if a route were added by mistake. Authentication belongs in front of it
(docs/operators.md, Dashboard).

`create_app()` with no argument reads PYBATCH_* from the environment, for a WSGI server:
`gunicorn 'pybatch._dashboard:create_app()'`.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Callable
from typing import Any, TypeVar

import flask
from werkzeug.exceptions import HTTPException

from pybatch._config import ConnectionConfig
from pybatch._dashboard import _charts
from pybatch._explorer import JobExplorer
from pybatch._job_repository import JobRepository
from pybatch._services.audit import verify_audit_chain
from pybatch.errors import (
    CursorError,
    ExplorerAgeBoundTooSmall,
    ExplorerRepositoryError,
    ExplorerTimeout,
    JobExecutionNotFound,
    JobInstanceNotFound,
    PageSizeOutOfRange,
    ParameterFilterInvalid,
    PyBatchError,
    StepExecutionNotFound,
)
from pybatch.values.explorer import MAX_PAGE_SIZE, Cursor, Page, PageSize, ParameterFilter

T = TypeVar("T")

#: Sent with every response: no script, no frame, no plugin; styles and images from the app only.
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; style-src 'self'; img-src 'self' data:; frame-ancestors 'none'; "
    "base-uri 'none'; form-action 'self'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
#: Bounds of `?refresh=N` (seconds) and of `?older_than=N` on the unresolved page.
MIN_REFRESH, MAX_REFRESH = 5, 3600
#: Executions in each job's run-history strip.
HISTORY_LENGTH = 20
#: A partitioned step holds at most 1,024 partitions: three full pages at most.
PARTITION_PAGES = 3
_ALLOWED_METHODS = frozenset({"GET", "HEAD"})


def _not_found(error: PyBatchError) -> bool:
    inner = error.error if isinstance(error, ExplorerRepositoryError) else error
    return isinstance(inner, JobExecutionNotFound | JobInstanceNotFound | StepExecutionNotFound)


def _cursor_arg() -> Cursor | None:
    text = flask.request.args.get("after")
    return None if not text else Cursor.from_hex(text)


def _parameter_arg() -> ParameterFilter | None:
    """`?param=NAME=VALUE`, repeatable (all must match), as `--param`; None when absent."""
    texts = [text for text in flask.request.args.getlist("param") if text]
    return ParameterFilter.parse(texts) if texts else None


def _int_arg(name: str, low: int, high: int) -> int | None:
    """An integer query argument within [low, high], None when absent; else 400."""
    text = flask.request.args.get(name)
    if text is None or text == "":
        return None
    if not text.isascii() or not text.isdigit() or not low <= int(text) <= high:
        flask.abort(400, f"{name} must be an integer from {low} to {high}")
    return int(text)


def _all_pages(fetch: Callable[[Cursor | None], Page[T]], pages: int) -> tuple[list[T], bool]:
    """Up to `pages` pages of a listing; True when more remain."""
    page = fetch(None)
    items = list(page.items)
    for _ in range(pages - 1):
        if page.next_cursor is None:
            break
        page = fetch(page.next_cursor)
        items.extend(page.items)
    return items, page.next_cursor is not None


def create_app(source: JobExplorer | ConnectionConfig | None = None) -> flask.Flask:
    """The dashboard app over an explorer, or over a repository it connects to itself.

    Given a `ConnectionConfig` (or nothing: PYBATCH_* from the environment) the app opens its
    own pooled `JobRepository`, kept for the process's life (a WSGI server's worker); given an
    explorer, the caller owns the repository and closes it.
    """
    if isinstance(source, JobExplorer):
        explorer = source
    else:
        config = ConnectionConfig.from_env() if source is None else source
        explorer = JobExplorer(JobRepository.connect(config))
    repository = explorer.repository
    app = flask.Flask(__name__)
    app.config["MAX_CONTENT_LENGTH"] = 0  # a GET has no body
    app.extensions["pybatch"] = explorer
    app.jinja_env.globals["instant"] = _instant  # macros see globals, not the page context

    @app.before_request
    def only_reads() -> None:
        if flask.request.method not in _ALLOWED_METHODS:
            flask.abort(405)
        flask.g.refresh = _int_arg("refresh", MIN_REFRESH, MAX_REFRESH)

    @app.after_request
    def security_headers(response: flask.Response) -> flask.Response:
        response.headers.update(SECURITY_HEADERS)
        if response.status_code == 405:
            response.headers["Allow"] = "GET, HEAD"
        return response

    @app.context_processor
    def page_context() -> dict[str, Any]:
        # Set by only_reads once the argument checked out; an error page before that has none.
        return {"refresh": flask.g.get("refresh")}

    @app.errorhandler(PyBatchError)
    def pybatch_error(error: PyBatchError) -> tuple[str, int]:
        if _not_found(error):
            status = 404
        elif isinstance(
            error,
            CursorError | PageSizeOutOfRange | ExplorerAgeBoundTooSmall | ParameterFilterInvalid,
        ):
            status = 400
        elif isinstance(error, ExplorerTimeout | ExplorerRepositoryError):
            status = 503
        else:
            status = 500
        inner = error.error if isinstance(error, ExplorerRepositoryError) else error
        message = f"{type(inner).__name__}: {inner}"
        return flask.render_template("error.html", status=status, message=message), status

    @app.errorhandler(HTTPException)
    def http_error(error: HTTPException) -> tuple[str, int]:
        status = error.code or 500
        message = f"{error.name}: {error.description}"
        return flask.render_template("error.html", status=status, message=message), status

    def route(rule: str, endpoint: str) -> Callable[[Callable[..., str]], Callable[..., str]]:
        def register(view: Callable[..., str]) -> Callable[..., str]:
            # No automatic OPTIONS: the only methods are GET and HEAD.
            app.add_url_rule(rule, endpoint, view, methods=["GET"], provide_automatic_options=False)
            return view

        return register

    @route("/", "jobs")
    def jobs() -> str:
        with explorer.pinned() as view:
            page = view.job_names(PageSize(), _cursor_arg())
            history = {
                item.job_name: view.recent_executions(item.job_name, HISTORY_LENGTH)
                for item in page.items
            }
        return flask.render_template("jobs.html", page=page, history=history)

    @route("/job", "instances")
    def instances() -> str:
        name = flask.request.args.get("name", "")
        parameters = _parameter_arg()
        with explorer.pinned() as view:
            page = view.instances(name, PageSize(), _cursor_arg(), parameters)
        return flask.render_template(
            "instances.html", name=name, page=page, param=flask.request.args.getlist("param")
        )

    @route("/instances/<int:instance_id>", "executions")
    def executions(instance_id: int) -> str:
        with explorer.pinned() as view:
            page = view.executions(instance_id, PageSize(), _cursor_arg())
        return flask.render_template("executions.html", instance_id=instance_id, page=page)

    @route("/executions/<int:execution_id>", "execution")
    def execution(execution_id: int) -> str:
        size = PageSize(MAX_PAGE_SIZE)
        with explorer.pinned() as view:
            found = view.execution(execution_id)
            if found is None:
                raise JobExecutionNotFound(id=execution_id)
            latest = view.latest_attempt(found.instance_id)
            steps, more_steps = _all_pages(
                lambda after: view.step_executions(execution_id, size, after), 2
            )
            decisions = view.recovery_decisions(execution_id, size).items
            requests = view.operator_requests(execution_id, size).items
            reasons = view.failure_reasons(execution_id)
            # A manager step has partitions; one index probe per step tells which.
            partitioned = {
                step.id for step in steps if view.step_partitions(step.id, PageSize(1)).items
            }
        return flask.render_template(
            "execution.html",
            execution=found,
            latest=latest,
            steps=steps,
            more_steps=more_steps,
            decisions=decisions,
            requests=requests,
            reasons=reasons,
            partitioned=partitioned,
            timeline=_charts.timeline(steps),
            progress=_charts.progress(steps),
            charts=_charts,
        )

    @route("/steps/<int:step_id>/partitions", "partitions")
    def partitions(step_id: int) -> str:
        size = PageSize(MAX_PAGE_SIZE)
        with explorer.pinned() as view:
            items, more = _all_pages(
                lambda after: view.step_partitions(step_id, size, after), PARTITION_PAGES
            )
        counts: dict[str, int] = {}
        for item in items:
            counts[item.status.value] = counts.get(item.status.value, 0) + 1
        return flask.render_template(
            "partitions.html", step_id=step_id, partitions=items, more=more, counts=counts
        )

    @route("/unresolved", "unresolved")
    def unresolved() -> str:
        seconds = _int_arg("older_than", 60, 366 * 86400)
        older_than = (
            repository.config.stale_threshold if seconds is None else _dt.timedelta(seconds=seconds)
        )
        parameters = _parameter_arg()
        with explorer.pinned() as view:
            page = view.unresolved_executions(older_than, PageSize(), _cursor_arg(), parameters)
        return flask.render_template(
            "unresolved.html",
            page=page,
            older_than=int(older_than.total_seconds()),
            param=flask.request.args.getlist("param"),
        )

    @route("/audit", "audit")
    def audit() -> str:
        # What `pybatch audit verify` reports: the whole chain walked, page by page.
        result = verify_audit_chain(repository)
        return flask.render_template("audit.html", result=result)

    return app


def _instant(value: _dt.datetime | None) -> str:
    """A timestamp as the CLI prints it, in the database's time zone (UTC for pybatch)."""
    return "-" if value is None else value.strftime("%Y-%m-%d %H:%M:%S")
