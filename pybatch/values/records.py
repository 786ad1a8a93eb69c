"""Job instance, execution and step records the repository returns (job executions count zero)."""

from __future__ import annotations

import datetime as _dt
from typing import Any

import attrs

from pybatch.errors import InvalidTimestampOrder
from pybatch.values import ids
from pybatch.values.counts import StepFaultCounts
from pybatch.values.ids import IdentifierKind, aware_utc, is_, version
from pybatch.values.lifecycle import ExecutionMetadata
from pybatch.values.names import JobName, NodeId, StepName
from pybatch.values.parameters import JobInstanceKey, JobParameters
from pybatch.values.state import Checkpoint, ExecutionContext
from pybatch.values.status import BatchStatus

_INT32_MAX = 2**31 - 1


def _attempt(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if type(value) is not int or not 1 <= value <= _INT32_MAX:
        raise ValueError("attempt is 1-based and fits an integer column")


@attrs.frozen(kw_only=True, repr=False)
class JobInstance:
    """A logical job instance; `instance_key` is `key.digest()` of its identifying parameters."""

    id: ids.JobInstanceId = attrs.field(validator=IdentifierKind.JOB_INSTANCE.validator)
    job_name: JobName = attrs.field(validator=is_(JobName))
    instance_key: bytes
    created_at: _dt.datetime = attrs.field(converter=aware_utc)
    parameters: JobParameters = attrs.field(validator=is_(JobParameters))

    def __attrs_post_init__(self) -> None:
        if self.parameters.identifying_count != len(self.parameters):
            raise ValueError("an instance holds identifying parameters only")
        if self.instance_key != self.key.digest():
            raise ValueError("instance_key does not match the job name and parameters")

    @property
    def key(self) -> JobInstanceKey:
        """The instance key (job name and identifying parameters)."""
        return JobInstanceKey(self.job_name, self.parameters)

    def __repr__(self) -> str:
        return (
            f"JobInstance(id={self.id}, job_name={self.job_name.value!r}, "
            f"identifying_parameter_count={len(self.parameters)}, "
            f"created_at={self.created_at.isoformat()!r})"
        )


class _Attempt:
    """What job and step executions share: lifecycle metadata and the last write's instant."""

    __slots__ = ()
    metadata: ExecutionMetadata
    updated_at: _dt.datetime

    def __attrs_post_init__(self) -> None:
        if self.updated_at < self.metadata.timestamps.created_at:
            raise InvalidTimestampOrder()

    @property
    def created_at(self) -> _dt.datetime:
        """When the execution or step was created (repository clock)."""
        return self.metadata.timestamps.created_at

    @property
    def status(self) -> BatchStatus:
        """Shortcut to `metadata.status`."""
        return self.metadata.status


@attrs.frozen(kw_only=True)
class JobExecution(_Attempt):
    """One launch or restart attempt of a job instance (docs/contract.md, Values)."""

    id: ids.JobExecutionId = attrs.field(validator=IdentifierKind.JOB_EXECUTION.validator)
    job_instance_id: ids.JobInstanceId = attrs.field(
        validator=IdentifierKind.JOB_INSTANCE.validator
    )
    attempt: int = attrs.field(validator=_attempt)
    definition_id: ids.DefinitionId = attrs.field(validator=IdentifierKind.DEFINITION.validator)
    metadata: ExecutionMetadata = attrs.field(validator=is_(ExecutionMetadata))
    version: int = attrs.field(validator=version)
    updated_at: _dt.datetime = attrs.field(converter=aware_utc)
    restart_of_execution_id: ids.JobExecutionId | None = attrs.field(
        default=None, validator=IdentifierKind.JOB_EXECUTION.optional
    )
    upgrade_from_definition_id: ids.DefinitionId | None = attrs.field(
        default=None, validator=IdentifierKind.DEFINITION.optional
    )


@attrs.frozen(kw_only=True)
class StepExecution(_Attempt):
    """One attempt of a named step, with its durable chunk state."""

    id: ids.StepExecutionId = attrs.field(validator=IdentifierKind.STEP_EXECUTION.validator)
    job_execution_id: ids.JobExecutionId = attrs.field(
        validator=IdentifierKind.JOB_EXECUTION.validator
    )
    step_name: StepName = attrs.field(validator=is_(StepName))
    logical_id: NodeId = attrs.field(validator=is_(NodeId))
    metadata: ExecutionMetadata = attrs.field(validator=is_(ExecutionMetadata))
    version: int = attrs.field(validator=version)
    updated_at: _dt.datetime = attrs.field(converter=aware_utc)
    checkpoint: Checkpoint = attrs.field(factory=Checkpoint.empty, validator=is_(Checkpoint))
    context: ExecutionContext = attrs.field(
        factory=ExecutionContext.empty, validator=is_(ExecutionContext)
    )
    fault_counts: StepFaultCounts = attrs.field(
        factory=StepFaultCounts, validator=is_(StepFaultCounts)
    )


@attrs.frozen
class JobInstanceSelection:
    """The result of `select_or_create_job_instance`: `Created` or `Existing`."""

    instance: JobInstance = attrs.field(validator=is_(JobInstance))


@attrs.frozen
class Created(JobInstanceSelection):
    """The instance did not exist and was created by this call."""


@attrs.frozen
class Existing(JobInstanceSelection):
    """The instance already existed."""
