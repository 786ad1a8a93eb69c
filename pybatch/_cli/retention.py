"""`pybatch hold`, `release` and `purge` (docs/operators.md)."""

from __future__ import annotations

import argparse
import datetime as _dt
import sys

from pybatch._cli._arguments import duration_type
from pybatch._cli._connection import Commands, add_command, connect, positive_id, progress
from pybatch._cli.operator import add_request_arguments, request_identity
from pybatch._services.retention import PurgeProgress, RetentionOutcome, RetentionService
from pybatch.values.names import JobName, ReasonCode
from pybatch.values.retention import (
    PurgeBatchBound,
    PurgeCounts,
    PurgePlanRequest,
    TerminalStatusSet,
)
from pybatch.values.status import BatchStatus

#: The tables a purge deletes from, in the order its counts are printed.
_TABLES = (
    "flow_decisions recovery_decisions operator_requests step_partitions step_executions "
    "job_executions job_instances"
).split()


_instance_id = positive_id("instance id")


def register(commands: Commands) -> None:
    for name, help_text, reason in (
        ("hold", "keep a job instance out of every purge", None),
        ("release", "release the hold of a job instance", "RELEASED"),
    ):
        parser = add_command(commands, name, _hold, help=help_text)
        add_request_arguments(parser)
        parser.add_argument("instance_id", type=_instance_id, metavar="INSTANCE")
        if reason is None:
            parser.add_argument(
                "--reason", required=True, help="reason code [A-Z0-9_], e.g. LEGAL_HOLD"
            )
        else:
            parser.add_argument("--reason", default=reason, help=f"reason code (default {reason})")

    purge = add_command(
        commands,
        "purge",
        _purge,
        help="delete finished histories of a job, whole instances at a time",
    )
    add_request_arguments(purge)
    purge.add_argument("--job", required=True, help="the job name")
    purge.add_argument(
        "--status",
        action="append",
        required=True,
        choices=["COMPLETED", "FAILED", "STOPPED", "ABANDONED"],
        help="status of the latest attempt to purge (repeatable)",
    )
    purge.add_argument(
        "--older-than",
        type=duration_type("--older-than"),
        required=True,
        help="minimum age, at least 1h (e.g. 90d)",
    )
    purge.add_argument("--batch", type=int, default=1000, help="executions per batch (1-1000)")
    purge.add_argument(
        "--forget-instances",
        action="store_true",
        help="delete the instance rows too (erasure) instead of leaving tombstones",
    )
    purge.add_argument("--reason", default="RETENTION", help="reason code (default RETENTION)")
    purge.add_argument("--dry-run", action="store_true", help="print what would go; change nothing")


def _hold(args: argparse.Namespace) -> int:
    """`hold` or `release` (the command's name is the service's method)."""
    reason = ReasonCode(args.reason)  # bad input is refused before anything else
    operation_id, actor = request_identity(args)
    with connect(args) as repository:
        act = getattr(RetentionService(repository), args.command)
        outcome: RetentionOutcome = act(operation_id, actor, args.instance_id, reason)
    print(outcome.describe())
    return 0


def _request(args: argparse.Namespace, statuses: list[BatchStatus]) -> PurgePlanRequest:
    return PurgePlanRequest(
        job_name=JobName(args.job),
        statuses=TerminalStatusSet.of(statuses),
        minimum_age=args.older_than,
        batch=PurgeBatchBound(args.batch),
        forget_instances=args.forget_instances,
    )


def _counts_line(counts: PurgeCounts) -> str:
    values = counts.as_dict()
    return "  ".join(f"{table} {values[table]:,}" for table in _TABLES)


def _purge(args: argparse.Namespace) -> int:
    statuses = [BatchStatus(status) for status in dict.fromkeys(args.status)]
    request = _request(args, statuses)  # bad input is refused before anything else
    reason = ReasonCode(args.reason)
    with connect(args) as repository:
        service = RetentionService(repository)
        if args.dry_run:
            print(f"dry run: nothing is deleted; job {args.job}, older than {args.older_than}")
            total = PurgeCounts()
            for status in statuses:
                counts = service.forecast(_request(args, [status]))
                total = total + counts
                print(f"{status.value:<10} {_counts_line(counts)}")
            print(f"{'total':<10} {_counts_line(total)}")
            return 0
        operation_id, actor = request_identity(args)
        purge = service.purge(request, operation_id.value, actor, reason)  # checks the id
        expected = service.forecast(request).job_executions
        batches: list[PurgeProgress] = []
        started = _dt.datetime.now(_dt.UTC)
        for batch in purge:
            batches.append(batch)
            done = batch.total.job_executions
            filled = 30 if not expected else min(30, 30 * done // expected)
            outcome = batch.outcome
            progress(
                f"\r[{'#' * filled}{'.' * (30 - filled)}] {done:,}/{expected:,} executions",
                f"batch {batch.batch}: {outcome.outcome} {_counts_line(outcome.counts)}",
            )
        if sys.stderr.isatty():  # end the progress line
            print(file=sys.stderr)
        elapsed = (_dt.datetime.now(_dt.UTC) - started).total_seconds()
        summary = service.summarize(operation_id.value, batches)
        print(f"{summary.describe()}, {elapsed:.1f} s")
        print(f"deleted    {_counts_line(summary.total)}")
        return 0
