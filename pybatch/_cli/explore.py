"""Reads: `pybatch jobs | instances | executions | show | skips | running | unresolved`."""

from __future__ import annotations

import argparse
import datetime as _dt
import enum
import json
import os
import shutil
import sys
import textwrap
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from pybatch import errors as e
from pybatch._cli._arguments import duration_type
from pybatch._cli._connection import Commands, Handler, add_command, open_explorer, positive_id
from pybatch._explorer import JobExplorer, all_pages
from pybatch._explorer import shown_instant as _instant
from pybatch.values import explorer as v
from pybatch.values.definitions import LEGACY_REVISION
from pybatch.values.state import EMPTY_STATE_SCHEMA


def _page_size(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"an integer from 1 to {v.MAX_PAGE_SIZE}") from None


_identifier = positive_id("integer id")
_EXECUTION: dict[str, Any] = {"type": _identifier, "help": "the job execution id"}


def register(commands: Commands) -> None:

    def command(
        name: str, handler: Handler, help_text: str, *, paged: bool = True, filtered: bool = False
    ) -> argparse.ArgumentParser:
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
                default=v.DEFAULT_PAGE_SIZE,
                help=f"rows per page, 1 to {v.MAX_PAGE_SIZE} ({v.DEFAULT_PAGE_SIZE})",
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
    help_text = (
        "list the attempts of an instance, or with --param those of every instance (of any "
        "job) with those parameters, newest first"
    )
    command("executions", _executions, help_text, filtered=True).add_argument(
        "instance", type=_identifier, nargs="?", help="the job instance id (or give --param)"
    )
    help_text = (
        "show one execution: steps, counters, checkpoints, failure, stop and owner evidence, "
        "recovery decisions"
    )
    command("show", _show, help_text, paged=False).add_argument("execution", **_EXECUTION)
    help_text = "list the executions running now: their step, progress, rate and lease"
    running = command("running", _running, help_text, paged=False)
    running.add_argument(
        "--limit",
        type=_page_size,
        default=v.MAX_PAGE_SIZE,
        help=f"at most this many, 1 to {v.MAX_PAGE_SIZE} ({v.MAX_PAGE_SIZE})",
    )
    running.add_argument(
        "--after", type=_identifier, metavar="EXECUTION", help="only executions after this id"
    )
    help_text = (
        "list the items an execution's steps skipped (StepRun.load): position, key, SQLSTATE "
        "and the constraint, table and column the server named"
    )
    command("skips", _skips, help_text).add_argument("execution", **_EXECUTION)
    help_text = "list STARTING, STARTED, STOPPING or UNKNOWN executions left unattended"
    command("unresolved", _unresolved, help_text, filtered=True).add_argument(
        "--older-than",
        type=duration_type("--older-than", unit_required=False),
        default=None,
        metavar="DURATION",
        help="not updated for this long on the database clock: 90s, 10m, 2h, 1d (at least 60s;"
        " default: the stale threshold, PYBATCH_STALE_THRESHOLD_MS, 15m unless set)",
    )


#: Legacy stored names as `show` prints them; stored values (digest inputs) and --json keep them.
_SHOWN_NAMES = {LEGACY_REVISION: "pybatch default definition", EMPTY_STATE_SCHEMA.value: "empty"}


def _envelope(state: v.StateEnvelopeDescriptor) -> str:
    """A checkpoint or context as an operator reads it: its schema, version and stored size."""
    schema = _SHOWN_NAMES.get(state.schema_id, state.schema_id)
    return f"{schema} v{state.schema_version}, {state.encoded_len} bytes"


#: What a column holds. Only free text (names, reasons, messages) is shortened to fit; ids,
#: statuses and codes (a cut `COMPL\u2026` reads as nothing), timestamps and counters never are.
ID, STATUS, TIME, NUMBER, TEXT = "id", "status", "time", "number", "text"


class Column(NamedTuple):
    """A table column: its header, what its cells show, their kind, and when it is left out.

    `cell` is the item's attribute (a dotted path; nothing on the way shows `-`) or a function
    of the item. `drop` 0: always shown; otherwise columns are left out highest `drop` first
    (the last column first among equals) until the rest fits.
    """

    header: str
    cell: str | Callable[[Any], object]
    kind: str = TEXT
    drop: int = 0


def _text(item: object, cell: str | Callable[[Any], object]) -> str:
    """A cell: `-` for nothing, yes or no, instants to the second, codes as stored, else str."""
    if callable(cell):
        value = cell(item)
    else:
        value = item
        for name in cell.split("."):
            value = None if value is None else getattr(value, name)
    if value is None or isinstance(value, _dt.datetime):
        return _instant(value)
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value.value) if isinstance(value, enum.Enum) else str(value)


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
    print(textwrap.fill(text, width, initial_indent=label, subsequent_indent=" " * len(label)))


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
            if columns[i].kind == TEXT
        }
        while excess > 0 and (room := [i for i in floors if widths[i] > floors[i]]):
            widths[max(room, key=lambda i: (widths[i] - floors[i], i))] -= 1  # the widest
            excess -= 1
        droppable = [i for i in kept if columns[i].drop]
        if excess <= 0 or not droppable:
            return kept, widths
        kept.remove(max(droppable, key=lambda i: (columns[i].drop, i)))


def _print_table(columns: Sequence[Column], items: Sequence[Any], empty: str | None = None) -> None:
    """A row per item fitted to the width (see `Column`); no rows: `empty`, if given."""
    if not items and empty is not None:
        print(empty)
        return
    rows = [[_text(item, column.cell) for column in columns] for item in items]
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


def _print_list(
    args: argparse.Namespace,
    columns: Sequence[Column],
    items: Sequence[Any],
    after: str | None,
    empty: str,
    more: str = "next page",
    as_json: Callable[[Any], dict[str, Any]] = lambda item: item.as_json(),
) -> int:
    """A list as a table and what to pass `--after` for more, or with --json one document."""
    if args.json:
        document = {"items": [as_json(item) for item in items], "next": after}
        print(json.dumps(document, ensure_ascii=False))
    else:
        _print_table(columns, items, empty)
        if after is not None:
            print(f"{more}: --after {after}")
    return 0


def _list(
    args: argparse.Namespace,
    columns: Sequence[Column],
    empty: str,
    read: Callable[..., v.Page[Any]],
    *arguments: object,
) -> int:
    """Print the page `read(explorer, *arguments, page_size=, after=)` returns."""
    size = v.PageSize(args.limit)
    after = None if args.after is None else v.Cursor.from_hex(args.after)
    with open_explorer(args) as explorer:
        page = read(explorer, *arguments, page_size=size, after=after)
    next_cursor = None if page.next_cursor is None else str(page.next_cursor)
    return _print_list(args, columns, page.items, next_cursor, empty)


def _parameters(item: v.JobInstanceProjection | v.JobExecutionProjection) -> str:
    return ", ".join(f"{p.name}={p.shown_value()}" for p in item.parameters) or "-"


def _rate(items_per_second: float | None) -> str | None:
    return None if items_per_second is None else f"{items_per_second:,.0f}"


def _parameter_filter(args: argparse.Namespace) -> v.ParameterFilter | None:
    return None if args.param is None else v.ParameterFilter.parse(args.param)


#: Left out first: the parameters, the owner flag and counters, then the instance and job, the
#: start, the exit code, the end; the id, status and update never.
_EXECUTION_COLUMNS = (
    Column("EXECUTION", "id", ID),
    Column("INSTANCE", "instance_id", ID, 8),
    Column("JOB", "job_name", TEXT, 7),
    Column("PARAMETERS", _parameters, TEXT, 12),
    Column("ATTEMPT", "attempt", NUMBER, 2),
    Column("STATUS", "status", STATUS),
    Column("EXIT", "exit_code", STATUS, 4),
    Column("READ", "counts.read", NUMBER, 6),
    Column("WRITTEN", "counts.written", NUMBER, 9),
    Column("COMMITS", "counts.commits", NUMBER, 10),
    Column("STARTED", "started_at", TIME, 5),
    Column("ENDED", "ended_at", TIME, 3),
    Column("UPDATED", "updated_at", TIME, 1),
    Column("OWNER", "owner_recorded", TEXT, 11),
)
_JOB_COLUMNS = (
    Column("JOB", "job_name"),
    Column("LATEST EXECUTION", "latest_execution_id", ID, 2),
    Column("STATUS", "latest_status", STATUS),
    Column("UPDATED", "latest_updated_at", TIME, 1),
)
_INSTANCE_COLUMNS = (
    Column("INSTANCE", "id", ID),
    Column("JOB", "job_name", TEXT, 4),
    Column("PARAMETERS", _parameters),
    Column("CREATED", "created_at", TIME, 1),
    # A live instance: `-`; a purged history's tombstone: PURGED with its final status.
    Column("STATE", lambda i: i.tombstone and f"PURGED ({i.tombstone.final_status.value})", STATUS),
    Column("PURGED AT", "tombstone.purged_at", TIME, 2),
    Column("HOLD", lambda i: i.hold and f"{i.hold.reason} by {i.hold.actor}"),
)
_RUNNING_COLUMNS = (
    Column("EXECUTION", "id", ID),
    Column("JOB", "job_name"),
    Column("ATTEMPT", "attempt", NUMBER, 5),
    Column(
        "STATUS",
        lambda i: i.status.value + (" (stop requested)" if i.stop_requested_at else ""),
        STATUS,
    ),
    Column("STEP", "step_name", TEXT, 2),
    Column("READ", "read", NUMBER, 4),
    Column("WRITTEN", "written", NUMBER),
    Column("CHUNKS", "commits", NUMBER, 3),
    Column("ITEMS/S", lambda i: _rate(i.items_per_second), NUMBER, 1),
    Column("LEASE LEFT", lambda i: f"{i.lease_left.total_seconds():.1f}s", NUMBER),
    Column("OWNER", "owner_host", TEXT, 7),
    Column("STARTED", "started_at", TIME, 6),
)
_SKIP_COLUMNS = (
    Column("SKIP", "id", ID),
    Column("STEP", lambda i: f"{i.step_name} ({i.step_execution_id})"),
    Column("POSITION", "item_position", NUMBER),
    Column("KEY", "item_key"),
    Column("SQLSTATE", "sqlstate", STATUS),
    Column("CONSTRAINT", "constraint", TEXT, 3),
    Column("TABLE", "table", TEXT, 2),
    Column("COLUMN", "column", TEXT, 1),
    Column("RECORDED", "created_at", TIME, 4),
)
_DECISION_COLUMNS = (
    Column("DECISION", "id", ID),
    Column("FROM", "prior_status", STATUS, 3),
    Column("TO", "resulting_status", STATUS),
    Column("REASON", "reason_code"),
    Column("BY", "operator_reference", TEXT, 2),
    Column("DECIDED", "decided_at", TIME, 1),
)
_REQUEST_COLUMNS = (
    Column("REQUEST", "id", ID),
    Column("ACTION", "action", STATUS),
    Column("OUTCOME", "outcome", STATUS),
    Column("ACTOR", "actor", TEXT, 2),
    Column("REQUESTED", "requested_at", TIME, 1),
)


def _jobs(args: argparse.Namespace) -> int:
    return _list(args, _JOB_COLUMNS, "no jobs", JobExplorer.job_names)


def _instances(args: argparse.Namespace) -> int:
    def read(explorer: JobExplorer, **page: Any) -> v.Page[Any]:
        found = explorer.instances(args.job, parameters=_parameter_filter(args), **page)
        # An empty first page is a job name no instance has (a typo), not an empty job.
        if not found.items and page["after"] is None and not explorer.job_exists(args.job):
            raise e.JobNotFound(job_name=args.job)
        return found

    return _list(args, _INSTANCE_COLUMNS, "no instances", read)


def _executions(args: argparse.Namespace) -> int:
    if (args.instance is None) == (args.param is None):
        raise e.CommandArgumentInvalid(
            argument="INSTANCE", expected="either given or replaced by --param"
        )
    read = JobExplorer.executions if args.param is None else JobExplorer.executions_with_parameters
    of = args.instance if args.param is None else _parameter_filter(args)
    return _list(args, _EXECUTION_COLUMNS, "no executions", read, of)


def _unresolved(args: argparse.Namespace) -> int:
    def read(explorer: JobExplorer, **page: Any) -> v.Page[Any]:
        age = args.older_than
        if age is None:  # the configured stale threshold (validated: 1 min..24 h)
            age = explorer.repository.config.stale_threshold
        return explorer.unresolved_executions(age, parameters=_parameter_filter(args), **page)

    return _list(args, _EXECUTION_COLUMNS, "no unresolved executions", read)


def _skips(args: argparse.Namespace) -> int:
    return _list(args, _SKIP_COLUMNS, "no skipped items", JobExplorer.skips, args.execution)


def _running_json(item: v.RunningExecution) -> dict[str, Any]:
    return {
        **item.as_json(),
        "lease_left_seconds": item.lease_left.total_seconds(),
        "items_per_second": item.items_per_second,
    }


def _running(args: argparse.Namespace) -> int:
    """The executions with a live lease, read once (the server's clock decides "live")."""
    with open_explorer(args) as explorer:
        items = explorer.running_executions(v.PageSize(args.limit), args.after)
    after = str(items[-1].id) if len(items) == args.limit else None
    more = "more may be running"
    return _print_list(
        args, _RUNNING_COLUMNS, items, after, "nothing is running", more, _running_json
    )


def _show(args: argparse.Namespace) -> int:
    with open_explorer(args) as explorer:
        if (execution := explorer.execution(args.execution)) is None:
            raise e.JobExecutionNotFound(id=args.execution)
        latest = explorer.latest_attempt(execution.instance_id)
        steps, _ = all_pages(explorer.step_executions, execution.id)
        decisions, _ = all_pages(explorer.recovery_decisions, execution.id)
        requests, _ = all_pages(explorer.operator_requests, execution.id)
        reasons = explorer.failure_reasons(execution.id)
        skip_counts = explorer.skip_counts(execution.id)

    def reason(key: int | None) -> dict[str, Any] | None:
        return None if (found := reasons.get(key)) is None else found.as_json()

    if args.json:
        document = {
            "execution": {**execution.as_json(), "failure_reason": reason(None)},
            "latest_attempt": None if latest is None else latest.as_json(),
            "steps": [
                {
                    **step.as_json(),
                    "failure_reason": reason(step.id),
                    "skip_count": skip_counts.get(step.id, 0),
                }
                for step in steps
            ],
            "recovery_decisions": [v.recovery_decision_json(d) for d in decisions],
            "operator_requests": [v.operator_request_json(request) for request in requests],
        }
        print(json.dumps(document, ensure_ascii=False))
        return 0
    failure, definition = execution.failure, execution.definition
    if latest is None:
        restart_from = "-"
    elif latest.execution_id == execution.id:
        restart_from = "this attempt"
    else:
        restart_from = (
            f"attempt {latest.attempt}, execution {latest.execution_id} ({latest.status.value})"
        )
    fields = {
        "execution": str(execution.id),
        "job": f"{execution.job_name} (instance {execution.instance_id})",
        "parameters": _parameters(execution),
        "attempt": str(execution.attempt),
        "latest": restart_from,  # the attempt a restart of this instance starts from
        "status": f"{execution.status.value} (exit {execution.exit_code})",
        "version": str(execution.version),
        "created": _instant(execution.created_at),
        "started": _instant(execution.started_at),
        "ended": _instant(execution.ended_at),
        "updated": _instant(execution.updated_at),
        "counts": ", ".join(f"{name} {n}" for name, n in execution.counts.as_json().items()),
        "failure": f"{failure.category.value} (id {failure.failure_id})" if failure else "-",
        "reason": str(reasons[None]) if None in reasons else "-",
        "stop": "-"
        if execution.stop_requested_at is None
        else f"requested {_instant(execution.stop_requested_at)} by {execution.stop_requested_by}",
        "owner": (execution.owner_host or "recorded")
        if execution.owner_recorded
        else "none recorded",
        "definition": f"{_SHOWN_NAMES.get(definition.revision, definition.revision)} (manifest "
        f"format {definition.manifest_format})",
        "context": _envelope(execution.context),
    }
    names = max(len(name) for name in fields)
    for name, value in fields.items():
        _print_wrapped(value, f"{name.ljust(names)}  ")
    print()
    step_columns = (
        Column("STEP", "id", ID),
        Column("NAME", "step_name"),
        Column("STATUS", "status", STATUS),
        Column("EXIT", "exit_code", STATUS, 3),
        Column("READ", "counts.read", NUMBER, 4),
        Column("WRITTEN", "counts.written", NUMBER, 5),
        Column("SKIPS", lambda step: skip_counts.get(step.id, 0), NUMBER, 9),
        Column("COMMITS", "counts.commits", NUMBER, 6),
        Column("ROLLBACKS", "counts.rollbacks", NUMBER, 7),
        Column("CHECKPOINT", lambda step: _envelope(step.checkpoint), TEXT, 8),
        Column("FAILURE", "failure.category", STATUS, 2),
    )
    _print_table(step_columns, steps, "no steps")
    for step in steps:
        if step.id in reasons:
            _print_wrapped(str(reasons[step.id]), f"step {step.id} failed: ")
    print()
    _print_table(_DECISION_COLUMNS, decisions, "no recovery decisions")
    if requests:
        print()
        _print_table(_REQUEST_COLUMNS, requests)
    return 0
