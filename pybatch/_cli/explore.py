"""`pybatch jobs | instances | executions | show | skips | unresolved`: explorer read commands.

Tables sized to the terminal, or with `--json` one document (`{"items": [...], "next": ...}`
for lists); `--limit` and `--after` page.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import shutil
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Protocol, TypeVar

from pybatch._cli._arguments import duration_type
from pybatch._cli._connection import Commands, Handler, add_command, config_from_args
from pybatch._explorer import JobExplorer
from pybatch._job_repository import JobRepository
from pybatch._migrator import installed_schema_version
from pybatch.errors import JobExecutionNotFound
from pybatch.values.definitions import LEGACY_REVISION
from pybatch.values.explorer import (
    DEFAULT_PAGE_SIZE,
    MAX_PAGE_SIZE,
    Cursor,
    JobExecutionProjection,
    LatestAttempt,
    Page,
    PageSize,
    operator_request_json,
    recovery_decision_json,
)
from pybatch.values.state import EMPTY_STATE_SCHEMA

T = TypeVar("T")
Parser = argparse.ArgumentParser


def _page_size(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"an integer from 1 to {MAX_PAGE_SIZE}") from None


def _identifier(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError("a positive integer id") from None
    if value < 1:
        raise argparse.ArgumentTypeError("a positive integer id")
    return value


def register(commands: Commands) -> None:

    def command(name: str, handler: Handler, help_text: str, *, paged: bool = True) -> Parser:
        parser = add_command(commands, name, handler, help=help_text, description=help_text)
        parser.add_argument("--json", action="store_true", help="print JSON for scripts")
        if paged:
            parser.add_argument(
                "--limit",
                type=_page_size,
                default=DEFAULT_PAGE_SIZE,
                help=f"rows per page, 1 to {MAX_PAGE_SIZE} ({DEFAULT_PAGE_SIZE})",
            )
            parser.add_argument(
                "--after", type=str, metavar="CURSOR", help="the cursor printed by the last page"
            )
        return parser

    command("jobs", _jobs, "list job names with the latest execution's status and time")
    instances = command("instances", _instances, "list the instances of a job, newest first")
    instances.add_argument("job", help="the job name")
    executions = command(
        "executions", _executions, "list the attempts of an instance, newest first"
    )
    executions.add_argument("instance", type=_identifier, help="the job instance id")
    show = command(
        "show",
        _show,
        "show one execution: steps, counters, checkpoints, failure, stop and owner evidence, "
        "recovery decisions",
        paged=False,
    )
    show.add_argument("execution", type=_identifier, help="the job execution id")
    skips = command(
        "skips",
        _skips,
        "list the items an execution's steps skipped (StepRun.load): position, key, SQLSTATE "
        "and the constraint, table and column the server named",
    )
    skips.add_argument("execution", type=_identifier, help="the job execution id")
    unresolved = command(
        "unresolved",
        _unresolved,
        "list STARTING, STARTED, STOPPING or UNKNOWN executions left unattended",
    )
    unresolved.add_argument(
        "--older-than",
        type=duration_type("--older-than", unit_required=False),
        default=None,
        metavar="DURATION",
        help="not updated for this long on the database clock: 90s, 10m, 2h, 1d (at least 60s;"
        " default: the stale threshold, PYBATCH_STALE_THRESHOLD_MS, 15m unless set)",
    )


@contextmanager
def _explorer(args: argparse.Namespace) -> Iterator[JobExplorer]:
    config = config_from_args(args)
    # One direct connection first: an unreachable server or a refused login is reported at
    # once (and as exit 3 or 6), instead of after the pool's acquire timeout.
    installed_schema_version(config)
    with JobRepository.connect(config) as repository:
        yield JobExplorer(repository)


#: Legacy stored names as `show` prints them; stored values (digest inputs) and --json keep them.
_SHOWN_NAMES = {LEGACY_REVISION: "pybatch default definition", EMPTY_STATE_SCHEMA.value: "empty"}


def _shown(name: str) -> str:
    """A stored definition revision or state schema as an operator reads it."""
    return _SHOWN_NAMES.get(name, name)


def _instant(value: _dt.datetime | None) -> str:
    return "-" if value is None else value.strftime("%Y-%m-%d %H:%M:%S")


def _print_table(
    headers: Sequence[str], rows: Sequence[Sequence[str]], empty: str | None = None
) -> None:
    """Columns padded to their widest cell, shrunk to fit a terminal; no rows: `empty`, if given."""
    if not rows and empty is not None:
        print(empty)
        return
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(headers)]
    if sys.stdout.isatty():
        columns = shutil.get_terminal_size().columns
        # Shrink the widest column first, down to 6 characters; then leave out columns
        # from the right until the rest fits.
        while sum(widths) + 2 * (len(widths) - 1) > columns and max(widths) > 6:
            widths[widths.index(max(widths))] -= 1
        while len(widths) > 1 and sum(widths) + 2 * (len(widths) - 1) > columns:
            widths.pop()

    def fit(text: str, width: int) -> str:
        return text if len(text) <= width else text[: max(width - 1, 0)] + "\u2026"

    for line in (headers, *rows):  # cells past the columns left (widths) are dropped
        print("  ".join(fit(c, w).ljust(w) for c, w in zip(line, widths, strict=False)).rstrip())


class _Item(Protocol):
    def as_json(self) -> dict[str, Any]: ...


Item = TypeVar("Item", bound=_Item)


def _list(
    args: argparse.Namespace,
    fetch: Callable[[JobExplorer, PageSize, Cursor | None], Page[Item]],
    headers: Sequence[str],
    as_row: Callable[[Item], Sequence[str]],
    empty: str,
) -> int:
    """Read one page and print it: a table and the next cursor, or with --json one document."""
    size = PageSize(args.limit)
    after = None if args.after is None else Cursor.from_hex(args.after)
    with _explorer(args) as explorer:
        page = fetch(explorer, size, after)
    next_cursor = None if page.next_cursor is None else str(page.next_cursor)
    if args.json:
        document = {"items": [item.as_json() for item in page.items], "next": next_cursor}
        print(json.dumps(document, ensure_ascii=False))
        return 0
    _print_table(headers, [as_row(item) for item in page.items], empty)
    if next_cursor is not None:
        print(f"next page: --after {next_cursor}")
    return 0


def _execution_row(item: JobExecutionProjection) -> list[str]:
    return [
        str(item.id),
        str(item.instance_id),
        item.job_name,
        str(item.attempt),
        item.status.value,
        item.exit_code,
        str(item.counts.read),
        str(item.counts.written),
        str(item.counts.commits),
        _instant(item.started_at),
        _instant(item.ended_at),
        _instant(item.updated_at),
        "yes" if item.owner_recorded else "no",
    ]


_EXECUTION_HEADERS = (
    "EXECUTION INSTANCE JOB ATTEMPT STATUS EXIT READ WRITTEN COMMITS STARTED ENDED UPDATED OWNER"
).split()


def _jobs(args: argparse.Namespace) -> int:
    return _list(
        args,
        lambda explorer, size, after: explorer.job_names(size, after),
        ("JOB", "LATEST EXECUTION", "STATUS", "UPDATED"),
        lambda item: [
            item.job_name,
            "-" if item.latest_execution_id is None else str(item.latest_execution_id),
            "-" if item.latest_status is None else item.latest_status.value,
            _instant(item.latest_updated_at),
        ],
        "no jobs",
    )


def _instances(args: argparse.Namespace) -> int:
    return _list(
        args,
        lambda explorer, size, after: explorer.instances(args.job, size, after),
        ("INSTANCE", "JOB", "PARAMETERS", "CREATED", "HOLD"),
        lambda item: [
            str(item.id),
            item.job_name,
            ", ".join(f"{p.name}:{p.kind}" for p in item.parameters) or "-",
            _instant(item.created_at),
            "-" if item.hold is None else f"{item.hold.reason} by {item.hold.actor}",
        ],
        "no instances",
    )


def _executions(args: argparse.Namespace) -> int:
    return _list(
        args,
        lambda explorer, size, after: explorer.executions(args.instance, size, after),
        _EXECUTION_HEADERS,
        _execution_row,
        "no executions",
    )


def _skips(args: argparse.Namespace) -> int:
    return _list(
        args,
        lambda explorer, size, after: explorer.skips(args.execution, size, after),
        "SKIP STEP POSITION KEY SQLSTATE CONSTRAINT TABLE COLUMN RECORDED".split(),
        lambda item: [
            str(item.id),
            f"{item.step_name} ({item.step_execution_id})",
            str(item.item_position),
            item.item_key,
            item.sqlstate,
            item.constraint or "-",
            item.table or "-",
            item.column or "-",
            _instant(item.created_at),
        ],
        "no skipped items",
    )


def _unresolved(args: argparse.Namespace) -> int:
    def fetch(
        explorer: JobExplorer, size: PageSize, after: Cursor | None
    ) -> Page[JobExecutionProjection]:
        older_than = args.older_than
        if older_than is None:  # the configured stale threshold (validated: 1 min..24 h)
            older_than = config_from_args(args).stale_threshold
        return explorer.unresolved_executions(older_than, size, after)

    return _list(args, fetch, _EXECUTION_HEADERS, _execution_row, "no unresolved executions")


def _all(fetch: Callable[[int, PageSize, Cursor | None], Page[T]], execution_id: int) -> list[T]:
    size = PageSize(MAX_PAGE_SIZE)
    page = fetch(execution_id, size, None)
    items = list(page.items)
    while page.next_cursor is not None:
        page = fetch(execution_id, size, page.next_cursor)
        items.extend(page.items)
    return items


def _latest(execution_id: int, latest: LatestAttempt | None) -> str:
    """Which attempt a restart of this instance starts from, as `show` prints it."""
    if latest is None:
        return "-"
    if latest.execution_id == execution_id:
        return "this attempt"
    return f"attempt {latest.attempt}, execution {latest.execution_id} ({latest.status.value})"


def _show(args: argparse.Namespace) -> int:
    with _explorer(args) as explorer:
        execution = explorer.execution(args.execution)
        if execution is None:
            raise JobExecutionNotFound(id=args.execution)
        latest = explorer.latest_attempt(execution.instance_id)
        steps = _all(explorer.step_executions, execution.id)
        decisions = _all(explorer.recovery_decisions, execution.id)
        requests = _all(explorer.operator_requests, execution.id)
        reasons = explorer.failure_reasons(execution.id)
        skip_counts = explorer.skip_counts(execution.id)
    if args.json:

        def with_reason(document: dict[str, Any], key: int | None) -> dict[str, Any]:
            reason = reasons.get(key)
            return {**document, "failure_reason": None if reason is None else reason.as_json()}

        def with_skips(document: dict[str, Any], step_id: int) -> dict[str, Any]:
            return {**document, "skip_count": skip_counts.get(step_id, 0)}

        document = {
            "execution": with_reason(execution.as_json(), None),
            "latest_attempt": None if latest is None else latest.as_json(),
            "steps": [with_skips(with_reason(step.as_json(), step.id), step.id) for step in steps],
            "recovery_decisions": [recovery_decision_json(d) for d in decisions],
            "operator_requests": [operator_request_json(request) for request in requests],
        }
        print(json.dumps(document, ensure_ascii=False))
        return 0
    failure = execution.failure
    fields = {
        "execution": str(execution.id),
        "job": f"{execution.job_name} (instance {execution.instance_id})",
        "attempt": str(execution.attempt),
        "latest": _latest(execution.id, latest),
        "status": f"{execution.status.value} (exit {execution.exit_code})",
        "version": str(execution.version),
        "created": _instant(execution.created_at),
        "started": _instant(execution.started_at),
        "ended": _instant(execution.ended_at),
        "updated": _instant(execution.updated_at),
        "counts": ", ".join(
            f"{name} {value}" for name, value in execution.counts.as_json().items()
        ),
        "failure": "-"
        if failure is None
        else f"{failure.category.value} (id {failure.failure_id})",
        "reason": str(reasons[None]) if None in reasons else "-",
        "stop": "-"
        if execution.stop_requested_at is None
        else f"requested {_instant(execution.stop_requested_at)} by {execution.stop_requested_by}",
        "owner": "recorded" if execution.owner_recorded else "none recorded",
        "definition": f"{_shown(execution.definition.revision)} (manifest format "
        f"{execution.definition.manifest_format})",
        "context": f"{_shown(execution.context.schema_id)} v{execution.context.schema_version}, "
        f"{execution.context.encoded_len} bytes",
    }
    width = max(len(name) for name in fields)
    for name, value in fields.items():
        print(f"{name.ljust(width)}  {value}")
    print()
    _print_table(
        "STEP NAME STATUS EXIT READ WRITTEN SKIPS COMMITS ROLLBACKS CHECKPOINT FAILURE".split(),
        [
            [
                str(step.id),
                step.step_name,
                step.status.value,
                step.exit_code,
                str(step.counts.read),
                str(step.counts.written),
                str(skip_counts.get(step.id, 0)),
                str(step.counts.commits),
                str(step.counts.rollbacks),
                f"{_shown(step.checkpoint.schema_id)} v{step.checkpoint.schema_version}, "
                f"{step.checkpoint.encoded_len} bytes",
                "-" if step.failure is None else step.failure.category.value,
            ]
            for step in steps
        ],
        "no steps",
    )
    for step in steps:
        if step.id in reasons:
            print(f"step {step.id} failed: {reasons[step.id]}")
    print()
    _print_table(
        "DECISION FROM TO REASON BY DECIDED".split(),
        [
            [
                str(d.id),
                d.prior_status.value,
                d.resulting_status.value,
                d.reason_code,
                d.operator_reference,
                _instant(d.decided_at),
            ]
            for d in decisions
        ],
        "no recovery decisions",
    )
    if requests:
        print()
        _print_table(
            "REQUEST ACTION OUTCOME ACTOR REQUESTED".split(),
            [
                [str(r.id), r.action.value, r.outcome.value, str(r.actor), _instant(r.requested_at)]
                for r in requests
            ],
        )
    return 0
