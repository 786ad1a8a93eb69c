"""`pybatch dashboard`: a read-only WSGI app over the explorer (docs/operators.md, Dashboard).

Jinja2 autoescapes every value and a Content-Security-Policy forbids script; each page reads
through one pinned `JobExplorer` view; any method but GET and HEAD is 405. `create_app()` with
no argument reads PYBATCH_*, for a WSGI server: `gunicorn 'pybatch._dashboard:create_app()'`.
"""

from __future__ import annotations

import collections
import datetime as _dt
import functools
from typing import Any

import flask
from werkzeug.exceptions import HTTPException

from pybatch import errors as e
from pybatch._config import ConnectionConfig
from pybatch._dashboard import _charts
from pybatch._explorer import JobExplorer, all_pages, shown_instant
from pybatch._job_repository import JobRepository
from pybatch._services.audit import verify_audit_chain
from pybatch.values.explorer import MAX_PAGE_SIZE, Cursor, PageSize, ParameterFilter

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
#: The HTTP status of a refusal: not found (the repository's own error), bad input, busy.
_NOT_FOUND = e.JobExecutionNotFound | e.JobInstanceNotFound | e.StepExecutionNotFound
_BAD_REQUEST = (
    e.CursorError | e.PageSizeOutOfRange | e.ExplorerAgeBoundTooSmall | e.ParameterFilterInvalid
)
_STATUSES = ((_BAD_REQUEST, 400), (e.ExplorerTimeout | e.ExplorerRepositoryError, 503))


def _cursor_arg() -> Cursor | None:
    return Cursor.from_hex(text) if (text := flask.request.args.get("after")) else None


def _parameter_arg() -> ParameterFilter | None:
    """`?param=NAME=VALUE`, repeatable (all must match), as `--param`; None when absent."""
    texts = [text for text in flask.request.args.getlist("param") if text]
    return ParameterFilter.parse(texts) if texts else None


def _int_arg(name: str, low: int, high: int) -> int | None:
    """An integer query argument within [low, high], None when absent; else 400."""
    text = flask.request.args.get(name)
    if not text:
        return None
    if not text.isascii() or not text.isdigit() or not low <= int(text) <= high:
        flask.abort(400, f"{name} must be an integer from {low} to {high}")
    return int(text)


def create_app(source: JobExplorer | ConnectionConfig | None = None) -> flask.Flask:
    """The app over an explorer, or over its own pooled repository (from `source` or PYBATCH_*).

    Its own repository is kept for the process's life (a WSGI worker's); an explorer's, the
    caller closes.
    """
    if not isinstance(source, JobExplorer):
        source = JobExplorer(JobRepository.connect(source or ConnectionConfig.from_env()))
    explorer, repository = source, source.repository
    app = flask.Flask(__name__)
    app.config["MAX_CONTENT_LENGTH"] = 0  # a GET has no body
    app.extensions["pybatch"] = explorer
    app.jinja_env.globals["instant"] = shown_instant  # macros see globals, not the page context

    @app.before_request
    def only_reads() -> None:
        if flask.request.method not in ("GET", "HEAD"):
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
        # `param`: the filter's texts as given, shown again in its form and in the next link.
        return {"refresh": flask.g.get("refresh"), "param": flask.request.args.getlist("param")}

    @app.errorhandler(e.PyBatchError)
    def pybatch_error(error: e.PyBatchError) -> tuple[str, int]:
        inner = error.error if isinstance(error, e.ExplorerRepositoryError) else error
        if isinstance(inner, _NOT_FOUND):
            status = 404
        else:
            status = next((code for kinds, code in _STATUSES if isinstance(error, kinds)), 500)
        message = f"{type(inner).__name__}: {inner}"
        return flask.render_template("error.html", status=status, message=message), status

    @app.errorhandler(HTTPException)
    def http_error(error: HTTPException) -> tuple[str, int]:
        status = error.code or 500
        message = f"{error.name}: {error.description}"
        return flask.render_template("error.html", status=status, message=message), status

    # A view's endpoint is its name; no automatic OPTIONS: the only methods are GET and HEAD.
    route = functools.partial(app.get, provide_automatic_options=False)

    @route("/")
    def jobs() -> str:
        with explorer.pinned() as view:
            page = view.job_names(PageSize(), _cursor_arg())
            history = {
                item.job_name: view.recent_executions(item.job_name, HISTORY_LENGTH)
                for item in page.items
            }
        return flask.render_template("jobs.html", page=page, history=history)

    @route("/job")
    def instances() -> str:
        name = flask.request.args.get("name", "")
        parameters = _parameter_arg()
        with explorer.pinned() as view:
            page = view.instances(name, PageSize(), _cursor_arg(), parameters)
        return flask.render_template("instances.html", name=name, page=page)

    @route("/instances/<int:instance_id>")
    def executions(instance_id: int) -> str:
        with explorer.pinned() as view:
            page = view.executions(instance_id, PageSize(), _cursor_arg())
        return flask.render_template("executions.html", instance_id=instance_id, page=page)

    @route("/executions/<int:execution_id>")
    def execution(execution_id: int) -> str:
        size = PageSize(MAX_PAGE_SIZE)
        with explorer.pinned() as view:
            if (found := view.execution(execution_id)) is None:
                raise e.JobExecutionNotFound(id=execution_id)
            latest = view.latest_attempt(found.instance_id)
            steps, more_steps = all_pages(view.step_executions, execution_id, 2)
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

    @route("/steps/<int:step_id>/partitions")
    def partitions(step_id: int) -> str:
        with explorer.pinned() as view:
            items, more = all_pages(view.step_partitions, step_id, PARTITION_PAGES)
        counts = collections.Counter(item.status.value for item in items)
        return flask.render_template(
            "partitions.html", step_id=step_id, partitions=items, more=more, counts=counts
        )

    @route("/unresolved")
    def unresolved() -> str:
        seconds = _int_arg("older_than", 60, 366 * 86400)
        older_than = (
            repository.config.stale_threshold if seconds is None else _dt.timedelta(seconds=seconds)
        )
        parameters = _parameter_arg()
        with explorer.pinned() as view:
            page = view.unresolved_executions(older_than, PageSize(), _cursor_arg(), parameters)
        return flask.render_template(
            "unresolved.html", page=page, older_than=int(older_than.total_seconds())
        )

    @route("/audit")
    def audit() -> str:
        # What `pybatch audit verify` reports: the whole chain walked, page by page.
        return flask.render_template("audit.html", result=verify_audit_chain(repository))

    return app
