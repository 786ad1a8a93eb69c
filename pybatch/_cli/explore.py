"""`pybatch jobs | instances | executions | show | skips | running | unresolved`: reads.

Tables sized to the terminal (`COLUMNS`, else the terminal's width; unbounded into a pipe), or
with `--json` one document (`{"items": [...], "next": ...}` for lists); `--limit` and
`--after` page.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import enum
import json
import os
import shutil
import sys
import textwrap
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, NamedTuple, Protocol, TypeVar

from pybatch._cli._arguments import duration_type
from pybatch._cli._connection import Commands, Handler, add_command, config_from_args
from pybatch._explorer import JobExplorer
from pybatch._job_repository import JobRepository
from pybatch._migrator import installed_schema_version
from pybatch.errors import CommandArgumentInvalid, JobExecutionNotFound, JobNotFound
from pybatch.values.definitions import LEGACY_REVISION
from pybatch.values.explorer import (
    DEFAULT_PAGE_SIZE,
    MAX_PAGE_SIZE,
    Cursor,
    InstanceTombstone,
    JobExecutionProjection,
    JobInstanceProjection,
    LatestAttempt,
    Page,
    PageSize,
    ParameterFilter,
    RunningExecution,
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

    def command(
        name: str, handler: Handler, help_text: str, *, paged: bool = True, filtered: bool = False
    ) -> Parser:
        parser = add_command(commands, name, handler, help=help_text, description=help_text)
        parser.add_argument("--json", action="store_true", help="print JSON for scripts")
        if filtered:
            parser.add_argument(
                "--param",
                action="append",
                metavar="NAME=VALUE",
                help="only instances whose identifying parameter NAME has VALUE (a string as is, "
                "an integer in decimal, a boolean true or false); repeat it: all must match",
            )
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
    instances = command(
        "instances", _instances, "list the instances of a job, newest first", filtered=True
    )
    instances.add_argument("job", help="the job name")
    executions = command(
        "executions",
        _executions,
        "list the attempts of an instance, or with --param those of every instance (of any "
        "job) with those parameters, newest first",
        filtered=True,
    )
    executions.add_argument(
        "instance", type=_identifier, nargs="?", help="the job instance id (or give --param)"
    )
    show = command(
        "show",
        _show,
        "show one execution: steps, counters, checkpoints, failure, stop and owner evidence, "
        "recovery decisions",
        paged=False,
    )
    show.add_argument("execution", type=_identifier, help="the job execution id")
    running = command(
        "running",
        _running,
        "list the executions running now: their step, progress, rate and lease",
        paged=False,
    )
    running.add_argument(
        "--limit",
        type=_page_size,
        default=MAX_PAGE_SIZE,
        help=f"at most this many, 1 to {MAX_PAGE_SIZE} ({MAX_PAGE_SIZE})",
    )
    running.add_argument(
        "--after", type=_identifier, metavar="EXECUTION", help="only executions after this id"
    )
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
        filtered=True,
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


class Kind(enum.Enum):
    """What a column holds, which decides whether its cells may be shortened."""

    ID = "id"  # an identifier: never shortened
    STATUS = "status"  # a status or code: never shortened (a cut `COMPL\u2026` reads as nothing)
    TIME = "time"  # a timestamp: never shortened
    NUMBER = "number"  # a counter: never shortened
    TEXT = "text"  # free text (names, reasons, messages): shortened with an ellipsis


class Column(NamedTuple):
    """A table column: its header, its kind, and when it is left out for want of width.

    `drop` 0: always shown; otherwise columns are left out highest `drop` first (the last
    column first among equals) until the rest fits.
    """

    header: str
    kind: Kind = Kind.TEXT
    drop: int = 0


#: A shortened text column keeps at least this many characters (or its header's).
_TEXT_FLOOR = 10
_GAP = 2


def _table_width() -> int | None:
    """The width to fit: `COLUMNS` when set, a terminal's width, none into a pipe or file."""
    if os.environ.get("COLUMNS") or sys.stdout.isatty():
        return shutil.get_terminal_size().columns
    return None


def _print_wrapped(text: str, label: str) -> None:
    """`label` then `text`, wrapped to the width under the label (nothing is cut)."""
    width = _table_width()
    if width is None or len(label) + len(text) <= width or len(label) >= width - 10:
        print(f"{label}{text}")
        return
    indent = " " * len(label)
    print(textwrap.fill(text, width, initial_indent=label, subsequent_indent=indent))


def _layout(
    columns: Sequence[Column], rows: Sequence[Sequence[str]], width: int | None
) -> tuple[list[int], dict[int, int]]:
    """The columns kept (in order) and their widths: text shortened first, then columns dropped."""
    natural = [max([len(c.header), *(len(r[i]) for r in rows)]) for i, c in enumerate(columns)]
    kept = list(range(len(columns)))
    while True:
        widths = {i: natural[i] for i in kept}
        if width is None:
            return kept, widths
        excess = sum(widths.values()) + _GAP * (len(kept) - 1) - width
        floors = {
            i: min(natural[i], max(len(columns[i].header), _TEXT_FLOOR))
            for i in kept
            if columns[i].kind is Kind.TEXT
        }
        while excess > 0:
            room = [i for i in floors if widths[i] > floors[i]]
            if not room:
                break
            widest = max(room, key=lambda i: (widths[i] - floors[i], i))
            widths[widest] -= 1
            excess -= 1
        droppable = [i for i in kept if columns[i].drop]
        if excess <= 0 or not droppable:
            return kept, widths
        kept.remove(max(droppable, key=lambda i: (columns[i].drop, i)))


def _print_table(
    columns: Sequence[Column], rows: Sequence[Sequence[str]], empty: str | None = None
) -> None:
    """Columns padded to their widest cell and fitted to the width; no rows: `empty`, if given.

    To fit, free-text cells are shortened with an ellipsis (statuses, timestamps, ids and
    counters never are), then whole columns are left out by priority, named once below.
    """
    if not rows and empty is not None:
        print(empty)
        return
    width = _table_width()
    kept, widths = _layout(columns, rows, width)

    def fit(text: str, size: int) -> str:
        return text if len(text) <= size else text[: max(size - 1, 0)] + "\u2026"

    for line in ([c.header for c in columns], *rows):
        print((" " * _GAP).join(fit(line[i], widths[i]).ljust(widths[i]) for i in kept).rstrip())
    left_out = [c.header for i, c in enumerate(columns) if i not in widths]
    if left_out:
        note = f"columns left out: {', '.join(left_out)} (widen the terminal or use --json)"
        print(textwrap.fill(note, width) if width else note)


class _Item(Protocol):
    def as_json(self) -> dict[str, Any]: ...


Item = TypeVar("Item", bound=_Item)


def _list(
    args: argparse.Namespace,
    fetch: Callable[[JobExplorer, PageSize, Cursor | None], Page[Item]],
    columns: Sequence[Column],
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
    _print_table(columns, [as_row(item) for item in page.items], empty)
    if next_cursor is not None:
        print(f"next page: --after {next_cursor}")
    return 0


def _parameters(item: JobInstanceProjection | JobExecutionProjection) -> str:
    return ", ".join(f"{p.name}={p.shown_value()}" for p in item.parameters) or "-"


def _parameter_filter(args: argparse.Namespace) -> ParameterFilter | None:
    return None if args.param is None else ParameterFilter.parse(args.param)


def _execution_row(item: JobExecutionProjection) -> list[str]:
    return [
        str(item.id),
        str(item.instance_id),
        item.job_name,
        _parameters(item),
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


ID, STATUS, TIME, NUMBER, TEXT = Kind.ID, Kind.STATUS, Kind.TIME, Kind.NUMBER, Kind.TEXT

#: Left out first: the parameters, the owner flag and counters, then the instance and job, the
#: start, the exit code, the end; the id, status and update never.
_EXECUTION_COLUMNS = (
    Column("EXECUTION", ID),
    Column("INSTANCE", ID, 8),
    Column("JOB", TEXT, 7),
    Column("PARAMETERS", TEXT, 12),
    Column("ATTEMPT", NUMBER, 2),
    Column("STATUS", STATUS),
    Column("EXIT", STATUS, 4),
    Column("READ", NUMBER, 6),
    Column("WRITTEN", NUMBER, 9),
    Column("COMMITS", NUMBER, 10),
    Column("STARTED", TIME, 5),
    Column("ENDED", TIME, 3),
    Column("UPDATED", TIME, 1),
    Column("OWNER", TEXT, 11),
)


def _jobs(args: argparse.Namespace) -> int:
    return _list(
        args,
        lambda explorer, size, after: explorer.job_names(size, after),
        (
            Column("JOB", TEXT),
            Column("LATEST EXECUTION", ID, 2),
            Column("STATUS", STATUS),
            Column("UPDATED", TIME, 1),
        ),
        lambda item: [
            item.job_name,
            "-" if item.latest_execution_id is None else str(item.latest_execution_id),
            "-" if item.latest_status is None else item.latest_status.value,
            _instant(item.latest_updated_at),
        ],
        "no jobs",
    )


def _instances(args: argparse.Namespace) -> int:
    def fetch(
        explorer: JobExplorer, size: PageSize, after: Cursor | None
    ) -> Page[JobInstanceProjection]:
        page = explorer.instances(args.job, size, after, _parameter_filter(args))
        # An empty first page is a job name no instance has (a typo), not an empty job.
        if not page.items and after is None and not explorer.job_exists(args.job):
            raise JobNotFound(job_name=args.job)
        return page

    return _list(
        args,
        fetch,
        (
            Column("INSTANCE", ID),
            Column("JOB", TEXT, 4),
            Column("PARAMETERS", TEXT),
            Column("CREATED", TIME, 1),
            Column("STATE", STATUS),
            Column("PURGED AT", TIME, 2),
            Column("HOLD", TEXT),
        ),
        lambda item: [
            str(item.id),
            item.job_name,
            _parameters(item),
            _instant(item.created_at),
            _state(item.tombstone),
            _instant(None if item.tombstone is None else item.tombstone.purged_at),
            "-" if item.hold is None else f"{item.hold.reason} by {item.hold.actor}",
        ],
        "no instances",
    )


def _state(tombstone: InstanceTombstone | None) -> str:
    """`-` for a live instance; a tombstone as PURGED with the final status of its history."""
    return "-" if tombstone is None else f"PURGED ({tombstone.final_status.value})"


def _executions(args: argparse.Namespace) -> int:
    if (args.instance is None) == (args.param is None):
        raise CommandArgumentInvalid(
            argument="INSTANCE", expected="either given or replaced by --param"
        )
    parameters = _parameter_filter(args)
    return _list(
        args,
        lambda explorer, size, after: (
            explorer.executions(args.instance, size, after)
            if parameters is None
            else explorer.executions_with_parameters(parameters, size, after)
        ),
        _EXECUTION_COLUMNS,
        _execution_row,
        "no executions",
    )


_RUNNING_COLUMNS = (
    Column("EXECUTION", ID),
    Column("JOB", TEXT),
    Column("ATTEMPT", NUMBER, 5),
    Column("STATUS", STATUS),
    Column("STEP", TEXT, 2),
    Column("READ", NUMBER, 4),
    Column("WRITTEN", NUMBER),
    Column("CHUNKS", NUMBER, 3),
    Column("ITEMS/S", NUMBER, 1),
    Column("LEASE LEFT", NUMBER),
    Column("OWNER", TEXT, 7),
    Column("STARTED", TIME, 6),
)


def _running_row(item: RunningExecution) -> list[str]:
    rate = item.items_per_second
    return [
        str(item.id),
        item.job_name,
        str(item.attempt),
        item.status.value + (" (stop requested)" if item.stop_requested_at else ""),
        item.step_name or "-",
        str(item.read),
        str(item.written),
        str(item.commits),
        "-" if rate is None else f"{rate:,.0f}",
        f"{item.lease_left.total_seconds():.1f}s",
        item.owner_host or "-",
        _instant(item.started_at),
    ]


def _running(args: argparse.Namespace) -> int:
    """The executions with a live lease, read once (the server's clock decides "live")."""
    with _explorer(args) as explorer:
        items = explorer.running_executions(PageSize(args.limit), args.after)
    more = len(items) == args.limit
    if args.json:
        document = {
            "items": [
                {
                    **item.as_json(),
                    "lease_left_seconds": item.lease_left.total_seconds(),
                    "items_per_second": item.items_per_second,
                }
                for item in items
            ],
            "next": str(items[-1].id) if more else None,
        }
        print(json.dumps(document, ensure_ascii=False))
        return 0
    _print_table(_RUNNING_COLUMNS, [_running_row(item) for item in items], "nothing is running")
    if more:
        print(f"more may be running: --after {items[-1].id}")
    return 0


def _skips(args: argparse.Namespace) -> int:
    return _list(
        args,
        lambda explorer, size, after: explorer.skips(args.execution, size, after),
        (
            Column("SKIP", ID),
            Column("STEP", TEXT),
            Column("POSITION", NUMBER),
            Column("KEY", TEXT),
            Column("SQLSTATE", STATUS),
            Column("CONSTRAINT", TEXT, 3),
            Column("TABLE", TEXT, 2),
            Column("COLUMN", TEXT, 1),
            Column("RECORDED", TIME, 4),
        ),
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
        return explorer.unresolved_executions(older_than, size, after, _parameter_filter(args))

    return _list(args, fetch, _EXECUTION_COLUMNS, _execution_row, "no unresolved executions")


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
        "parameters": _parameters(execution),
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
        "owner": (execution.owner_host or "recorded")
        if execution.owner_recorded
        else "none recorded",
        "definition": f"{_shown(execution.definition.revision)} (manifest format "
        f"{execution.definition.manifest_format})",
        "context": f"{_shown(execution.context.schema_id)} v{execution.context.schema_version}, "
        f"{execution.context.encoded_len} bytes",
    }
    names = max(len(name) for name in fields)
    for name, value in fields.items():
        _print_wrapped(value, f"{name.ljust(names)}  ")
    print()
    _print_table(
        (
            Column("STEP", ID),
            Column("NAME", TEXT),
            Column("STATUS", STATUS),
            Column("EXIT", STATUS, 3),
            Column("READ", NUMBER, 4),
            Column("WRITTEN", NUMBER, 5),
            Column("SKIPS", NUMBER, 9),
            Column("COMMITS", NUMBER, 6),
            Column("ROLLBACKS", NUMBER, 7),
            Column("CHECKPOINT", TEXT, 8),
            Column("FAILURE", STATUS, 2),
        ),
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
            _print_wrapped(str(reasons[step.id]), f"step {step.id} failed: ")
    print()
    _print_table(
        (
            Column("DECISION", ID),
            Column("FROM", STATUS, 3),
            Column("TO", STATUS),
            Column("REASON", TEXT),
            Column("BY", TEXT, 2),
            Column("DECIDED", TIME, 1),
        ),
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
            (
                Column("REQUEST", ID),
                Column("ACTION", STATUS),
                Column("OUTCOME", STATUS),
                Column("ACTOR", TEXT, 2),
                Column("REQUESTED", TIME, 1),
            ),
            [
                [str(r.id), r.action.value, r.outcome.value, str(r.actor), _instant(r.requested_at)]
                for r in requests
            ],
        )
    return 0
