"""This package as it ran against an older schema, for the upgrade tests' runs before upgrading.

The current code writes what the current schema has; a run launched before the upgrade must
write only what its schema had. `older_package(monkeypatch, version)` accepts that schema
version and swaps each statement whose columns came later for the text it had then, and,
before migration 0014 (a run's transitions as functions of the schema), the transitions a
run made then: several statements each, written out here where the package no longer has
them, and a failure reason only where the schema has its columns (0009).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest
from psycopg.types.json import Jsonb

import pybatch._job_repository as repository_module
from pybatch._codecs.instances import encode_identifying_parameters
from pybatch._repository import steps
from pybatch._repository.definitions import ensure_definition
from pybatch._repository.executions import Executions
from pybatch._repository.flow import Flow
from pybatch._repository.ownership import Launch, Ownership
from pybatch._repository.steps import Steps
from pybatch._statements import Connection, Statements
from pybatch.errors import ExecutionAlreadyActive, StepExecutionNotFound
from pybatch.values.definitions import DefinitionIdentity
from pybatch.values.flow import StartLimit
from pybatch.values.ids import FailureId
from pybatch.values.lifecycle import LifecycleTransition
from pybatch.values.names import NodeId, StepName
from pybatch.values.ownership import ExecutionLease, OwnerToken
from pybatch.values.parameters import JobInstanceKey
from pybatch.values.records import JobExecution, StepExecution
from pybatch.values.status import BatchStatus, FailureCategory, FailureReason, FailureSummary
from tests.support import owners

S = BatchStatus

#: Migration 0012 adds job_execution.owner_host, which the claim of every launch writes.
OWNER_HOST = 12
#: Migration 0014 makes a launch, a step's start and end and a run's end functions.
TRANSITIONS = 14

_LOCK_INSTANCE = "SELECT last_attempt FROM pybatch.job_instance WHERE id = %s FOR UPDATE"
_LATEST = (
    "SELECT id, status FROM pybatch.job_execution WHERE job_instance_id = %s"
    " ORDER BY attempt DESC LIMIT 1"
)
_INSERT_EXECUTION = (
    "INSERT INTO pybatch.job_execution (job_instance_id, definition_id, restart_of_execution_id,"
    " attempt, status, exit_code, parameters, context_format, context_schema,"
    " context_schema_version, context_payload, created_at, updated_at, version)"
    " VALUES (%(instance)s, %(definition)s, %(restart_of)s, %(attempt)s, 'STARTING', 'UNKNOWN',"
    " %(parameters)s, 1, 'oxide_batch.empty.v1', 1, '{}', %(now)s, %(now)s, 0) RETURNING id"
)
#: A new step, with the durable state of the node's newest step when there is one.
_COPIED = (
    "read_count, processed_count, write_count, filter_count, commit_count, rollback_count,"
    " checkpoint_format, checkpoint_schema, checkpoint_schema_version, checkpoint_payload,"
    " context_format, context_schema, context_schema_version, context_payload,"
    " read_retry_count, process_retry_count, write_retry_count, read_skip_count,"
    " process_skip_count, write_skip_count, no_rollback_count, fault_state_format,"
    " fault_state_schema, fault_state_schema_version, fault_state_payload, fault_state_checksum"
)
_COPY_STEP = (
    "INSERT INTO pybatch.step_execution (job_execution_id, step_name, step_logical_id, status,"
    f" exit_code, created_at, updated_at, version, {_COPIED})"
    " SELECT %(execution)s, %(name)s, %(node)s, 'STARTING', 'UNKNOWN', %(now)s, %(now)s, 0,"
    f" {_COPIED} FROM pybatch.step_execution WHERE id = %(source)s RETURNING id"
)
_FRESH_STEP = (
    "INSERT INTO pybatch.step_execution (job_execution_id, step_name, step_logical_id, status,"
    " exit_code, checkpoint_format, checkpoint_schema, checkpoint_schema_version,"
    " checkpoint_payload, context_format, context_schema, context_schema_version,"
    " context_payload, created_at, updated_at, version)"
    " VALUES (%(execution)s, %(name)s, %(node)s, 'STARTING', 'UNKNOWN', 1,"
    " 'oxide_batch.empty.v1', 1, '{}', 1, 'oxide_batch.empty.v1', 1, '{}', %(now)s, %(now)s, 0)"
    " RETURNING id"
)
#: The end of an ending execution's open steps, before migration 0014's function.
_END_STEPS = (
    "UPDATE pybatch.step_execution SET status = %(status)s::text, exit_code = %(status)s::text,"
    " failure_category = %(category)s::text,"
    " failure_id = CASE WHEN %(category)s::text IS NOT NULL THEN id END,"
    " ended_at = greatest(updated_at, started_at, created_at, %(at)s),"
    " updated_at = greatest(updated_at, started_at, created_at, %(at)s), version = version + 1"
    " WHERE job_execution_id = %(id)s AND status IN ('STARTING', 'STARTED', 'STOPPING')"
)
_EXIT = (
    "UPDATE pybatch.{table} SET exit_code = %(exit)s, version = version + 1,"
    " updated_at = GREATEST(updated_at, %(now)s) WHERE id = %(id)s"
)
_REASON = (
    "UPDATE pybatch.{table} SET failure_error_class = %(error_class)s,"
    " failure_message = %(message)s, failure_sqlstate = %(sqlstate)s,"
    " failure_constraint = %(constraint)s, failure_table = %(table)s,"
    " failure_column = %(column)s, version = version + 1"
    " WHERE id = %(id)s AND status = 'FAILED'"
)


@contextlib.contextmanager
def older_package(monkeypatch: pytest.MonkeyPatch, version: int) -> Iterator[None]:
    """Inside: repositories accept schema `version` and write only the columns it has."""
    with monkeypatch.context() as patch:
        patch.setattr(repository_module, "supported_schema_version", lambda: version)
        if version < OWNER_HOST:
            # The claim as the package before migration 0012 ran it: no owner host.
            claim = owners.CLAIM.replace(" owner_host = %(owner_host)s,", "")
            assert "owner_host" not in claim
            patch.setattr(owners, "CLAIM", claim)
        if version < TRANSITIONS:
            _transitions_before_0014(patch, version)
        yield


def _transitions_before_0014(patch: pytest.MonkeyPatch, version: int) -> None:
    """A run's transitions as the package before 0014 made them, on schema `version`."""

    def create(
        self: Executions,
        instance_id: int,
        definition: DefinitionIdentity = DefinitionIdentity.LEGACY,
    ) -> JobExecution:
        uow: Any = self._uow
        instance = uow.instances.get(instance_id)
        with uow.operation() as conn:
            locked = conn.execute(_LOCK_INSTANCE, (instance_id,)).fetchone()
            latest = conn.execute(_LATEST, (instance_id,)).fetchone()
            if latest is not None and S(latest[1]).is_unresolved:
                raise ExecutionAlreadyActive(
                    instance_id=instance_id, execution_id=latest[0], status=latest[1]
                )
            known = ensure_definition(
                uow.statements, conn, uow.clock, instance.job_name, definition
            )
            attempt = locked[0] + 1
            conn.execute(
                "UPDATE pybatch.job_instance SET last_attempt = %s WHERE id = %s",
                (attempt, instance_id),
            )
            new = {"instance": instance_id, "definition": known, "attempt": attempt}
            new |= {"restart_of": None if latest is None else latest[0], "now": uow.clock.now()}
            new["parameters"] = Jsonb(encode_identifying_parameters(instance.key))
            row = conn.execute(_INSERT_EXECUTION, new).fetchone()
        created: JobExecution = uow.executions.get(row[0])
        return created

    def launch(
        self: Ownership,
        key: JobInstanceKey,
        definition: DefinitionIdentity,
        owner: OwnerToken,
        lease: ExecutionLease,
        definition_id: int | None = None,
    ) -> Launch:
        uow: Any = self._uow
        instance = uow.instances.select_or_create(key).instance
        try:
            execution = uow.executions.create(instance.id, definition)
        except ExecutionAlreadyActive as active:
            return (None, *uow.ownership.lock(active.execution_id))
        at = max(uow.clock.now(), execution.created_at)
        owners.claim(uow, execution.id, execution.version, owner, at, lease)
        started = uow.executions.transition(execution.id, 0, LifecycleTransition.new(S.STARTED, at))
        return instance, started, None

    def create_step(
        self: Flow,
        job_execution_id: int,
        step_name: StepName,
        node_id: NodeId,
        start_limit: StartLimit | None = None,
    ) -> StepExecution:
        uow: Any = self._uow
        instance_id = uow.executions.get(job_execution_id).job_instance_id
        with uow.operation() as conn:
            conn.execute(_LOCK_INSTANCE, (instance_id,))
            latest = self.latest_step(instance_id, node_id)
            new = {"execution": job_execution_id, "name": step_name.value, "node": node_id.value}
            new |= {"source": None if latest is None else latest.step_execution.id}
            insert = _FRESH_STEP if latest is None else _COPY_STEP
            row = conn.execute(insert, {**new, "now": uow.clock.now()}).fetchone()
        created: StepExecution = uow.steps.get(row[0])
        return created

    def start_step(
        self: Flow,
        job_execution_id: int,
        owner: OwnerToken,
        step_name: StepName,
        node_id: NodeId,
        start_limit: StartLimit,
    ) -> tuple[bool, StepExecution]:
        uow: Any = self._uow
        execution = uow.ownership.verify_owner(job_execution_id, owner)
        latest = self.latest_step(execution.job_instance_id, node_id)
        if latest is not None and latest.step_execution.status is S.COMPLETED:
            return True, latest.step_execution
        step = self.create_step(job_execution_id, step_name, node_id, start_limit)
        at = max(uow.clock.now(), step.created_at)
        started: StepExecution = uow.steps.transition(
            step.id, step.version, LifecycleTransition.new(S.STARTED, at)
        )
        return False, started

    def end_step(
        self: Steps,
        job_execution_id: int,
        owner: OwnerToken,
        step_id: int,
        status: BatchStatus,
        reason: FailureReason | None = None,
    ) -> StepExecution:
        self._uow.ownership.verify_owner(job_execution_id, owner)  # type: ignore[attr-defined]
        current = self.get(step_id)
        if current is None:
            raise StepExecutionNotFound(id=step_id)
        ended: StepExecution = _ended(self, current, status, reason, version)
        return ended

    def end_execution(
        self: Executions,
        execution_id: int,
        owner: OwnerToken,
        status: BatchStatus,
        reason: FailureReason | None = None,
    ) -> JobExecution:
        current = self._uow.ownership.verify_owner(execution_id, owner)  # type: ignore[attr-defined]
        ended_as = S.STOPPED if current.status is S.STOPPING else status
        ended: JobExecution = _ended(self, current, ended_as, reason, version)
        return ended

    def end_unfinished_steps(
        q: Statements,
        conn: Connection,
        job_execution_id: int,
        execution_status: BatchStatus,
        ended_at: datetime,
        category: FailureCategory = FailureCategory.CANCELLED,
    ) -> int:
        stopped = execution_status is S.STOPPED
        ending: dict[str, object] = {"status": S.STOPPED.value if stopped else S.FAILED.value}
        ending |= {"at": ended_at, "category": None if stopped else category.value}
        ending["id"] = job_execution_id
        return conn.execute(_END_STEPS, ending).rowcount

    patch.setattr(steps, "end_unfinished_steps", end_unfinished_steps)
    patch.setattr(Executions, "create", create)
    patch.setattr(Flow, "create_step", create_step)
    patch.setattr(Ownership, "launch", launch)
    patch.setattr(Flow, "start_step", start_step)
    patch.setattr(Steps, "end", end_step)
    patch.setattr(Executions, "end", end_execution)


def _ended(
    records: Any, current: Any, status: BatchStatus, reason: FailureReason | None, version: int
) -> Any:
    """The older package's ending: transition, reason (schema 9 on), exit status."""
    at = max(records._uow.clock.now(), current.updated_at)
    if status is S.FAILED:
        failure = FailureSummary(FailureCategory.USER_COMPONENT, FailureId(current.id))
        change = LifecycleTransition.failed(at, failure)
    else:
        change = LifecycleTransition.new(status, at)
    records.transition(current.id, current.version, change)
    table = "step_execution" if isinstance(records, Steps) else "job_execution"
    if status is S.FAILED and reason is not None and version >= 9:
        with records._uow.operation() as conn:
            conn.execute(
                _REASON.format(table=table),
                {
                    "id": current.id,
                    "error_class": reason.error_class,
                    "message": reason.message,
                    "sqlstate": reason.sqlstate,
                    "constraint": reason.constraint,
                    "table": reason.table,
                    "column": reason.column,
                },
            )
    with records._uow.operation() as conn:
        conn.execute(_EXIT.format(table=table), {"id": current.id, "exit": status.value, "now": at})
    return records.get(current.id)
