"""`pybatch stop`, `recover` and `audit verify`; re-running with an `--operation-id` replays."""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import re
import sys
import time
import uuid

import attrs

from pybatch._cli._arguments import duration_type
from pybatch._cli._connection import Commands, add_command, connect, positive_id, progress
from pybatch._services.audit import verify_audit_chain
from pybatch._services.operator import (
    UNKNOWN_EFFECT,
    OperatorOutcome,
    OperatorService,
    operator_evidence,
)
from pybatch.errors import JobExecutionNotFound
from pybatch.values.ids import FailureId
from pybatch.values.names import ActorRef, OperationId, ReasonCode
from pybatch.values.operator import OperatorRejectionCode
from pybatch.values.recovery import RecoveryRequest
from pybatch.values.status import BatchStatus, FailureCategory, FailureSummary

#: How often `stop --wait` polls the execution.
WAIT_POLL_S = 0.5
Code = OperatorRejectionCode

_execution_id = positive_id("execution id")


def add_request_arguments(parser: argparse.ArgumentParser) -> None:
    """--operation-id and --actor, shared by every mutating command."""
    parser.add_argument(
        "--operation-id",
        help="idempotency key; re-running with the same id replays (generated when absent)",
    )
    parser.add_argument("--actor", default=None, help="who asks, for the audit (default cli:$USER)")


def request_identity(args: argparse.Namespace) -> tuple[OperationId, ActorRef]:
    """The operation id (printed when generated) and the actor of a mutating command."""
    if args.operation_id is None:
        operation_id = OperationId(f"cli:{uuid.uuid4()}")
        print(f"operation id: {operation_id.value}", file=sys.stderr)
    else:
        operation_id = OperationId(args.operation_id)
    user = re.sub(r"[^A-Za-z0-9._:@-]", "_", os.environ.get("USER", "") or "operator")
    return operation_id, ActorRef(args.actor or f"cli:{user}"[:128])


def register(commands: Commands) -> None:
    stop = add_command(commands, "stop", _stop, help="ask a running job execution to stop")
    add_request_arguments(stop)
    stop.add_argument("execution_id", type=_execution_id, metavar="EXECUTION_ID")
    stop.add_argument("--wait", action="store_true", help="return once the run has ended")
    stop.add_argument(
        "--timeout",
        type=duration_type("--timeout"),
        default=_dt.timedelta(minutes=10),
        help="for --wait",
    )

    recover = add_command(
        commands, "recover", _recover, help="resolve an orphaned or ambiguous execution, audited"
    )
    add_request_arguments(recover)
    recover.add_argument("execution_id", type=_execution_id, metavar="EXECUTION_ID")
    mode = recover.add_mutually_exclusive_group(required=True)
    mode.add_argument("--mark-failed", action="store_true", help="FAILED: the job may restart")
    mode.add_argument("--abandon", action="store_true", help="ABANDONED: it never runs again")
    recover.add_argument(
        "--reason",
        required=True,
        help=f"reason code [A-Z0-9_]; an UNKNOWN execution is marked failed only with "
        f"{UNKNOWN_EFFECT}",
    )
    recover.add_argument(
        "--force",
        action="store_true",
        help="recover even though the run's lease is fresh (its owner looks alive): the owner "
        "is fenced first, so nothing it still runs can commit",
    )

    audit = commands.add_parser("audit", help="the tamper-evident audit chain")
    audit_commands = audit.add_subparsers(dest="audit_command", required=True, metavar="COMMAND")
    verify = add_command(
        audit_commands,
        "verify",
        _audit_verify,
        help="walk the chain; name the first broken link (exit 1)",
    )
    verify.add_argument("--json", action="store_true", help="the result as one JSON object")


def _report(outcome: OperatorOutcome) -> int:
    """Print the outcome's line; the exit code of a rejection (4 for a missing target)."""
    print(outcome.describe())
    if (rejection := outcome.rejection) is None:
        return 0
    return 4 if rejection.code in (Code.EXECUTION_NOT_FOUND, Code.INSTANCE_NOT_FOUND) else 1


def _stop(args: argparse.Namespace) -> int:
    operation_id, actor = request_identity(args)
    with connect(args) as repository:
        outcome = OperatorService(repository).stop(operation_id, actor, args.execution_id)
        code = _report(outcome)
        if code or not args.wait:
            return code
        deadline = time.monotonic() + args.timeout.total_seconds()
        while True:
            with repository.begin() as uow:
                execution = uow.executions.get(args.execution_id)
            if execution is None:
                raise JobExecutionNotFound(id=args.execution_id)
            if not execution.status.is_unresolved:
                if sys.stderr.isatty():  # end the progress line
                    print(file=sys.stderr)
                print(f"execution {execution.id} ended {execution.status.value}")
                return 0
            if time.monotonic() > deadline:
                print(
                    f"execution {execution.id} is still {execution.status.value} after "
                    f"{args.timeout}; the stop request stays recorded",
                    file=sys.stderr,
                )
                return 1
            progress(".", f"waiting: execution {execution.id} is {execution.status.value}")
            time.sleep(WAIT_POLL_S)


def _recover(args: argparse.Namespace) -> int:
    reason = ReasonCode(args.reason)  # bad input is refused before anything else
    operation_id, actor = request_identity(args)
    with connect(args) as repository:
        with repository.begin() as uow:
            current = uow.executions.get(args.execution_id)
        if current is None:
            raise JobExecutionNotFound(id=args.execution_id)
        failure = None
        if args.mark_failed:  # without a failure the execution is abandoned
            failure = FailureSummary(FailureCategory.STALE_RECOVERED, FailureId(current.id))
        evidence = operator_evidence(current)
        request = RecoveryRequest(current.version, reason.value, actor.value, evidence, failure)
        outcome = OperatorService(repository).recover(
            operation_id,
            actor,
            args.execution_id,
            request,
            unknown_commit=current.status is BatchStatus.UNKNOWN,
            force=args.force,
        )
        code = _report(outcome)
        rejection = outcome.rejection
        if rejection is not None and rejection.code is Code.EXECUTION_ALREADY_ACTIVE:
            print(
                "pybatch: its lease is fresh, so its owner looks alive; wait for the lease to run "
                "out, or pass --force to fence the owner and recover it now",
                file=sys.stderr,
            )
        return code


def _audit_verify(args: argparse.Namespace) -> int:
    def verified(done: int, total: int) -> None:
        progress(f"\rverified {done:,} of {total:,} links", f"verified {done} of {total} links")

    with connect(args) as repository:
        result = verify_audit_chain(repository, progress=verified)
    if sys.stderr.isatty():  # end the progress line
        print(file=sys.stderr)
    if args.json:
        print(json.dumps({**attrs.asdict(result), "intact": result.intact}, sort_keys=True))
    else:
        print(result.describe())
    return 0 if result.intact else 1
