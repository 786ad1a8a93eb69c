"""Records and the instance selection."""

from __future__ import annotations

import pickle
from datetime import UTC, datetime, timedelta

import pytest

from pybatch import errors
from pybatch.values.counts import ExecutionCounts
from pybatch.values.definitions import DefinitionIdentity, DefinitionUpgrade
from pybatch.values.ids import (
    DefinitionId,
    FailureId,
    JobExecutionId,
    JobInstanceId,
    StepExecutionId,
)
from pybatch.values.lifecycle import ExecutionMetadata, ExecutionTimestamps, LifecycleTransition
from pybatch.values.names import (
    DefinitionRevision,
    DefinitionUpgradeKey,
    ExitCode,
    JobName,
    NodeId,
    StateSchemaId,
    StepName,
)
from pybatch.values.parameters import JobInstanceKey, JobParameter, JobParameters, ParameterValue
from pybatch.values.records import (
    Created,
    Existing,
    JobExecution,
    JobInstance,
    JobInstanceSelection,
    StepExecution,
)
from pybatch.values.state import Checkpoint, ExecutionContext
from pybatch.values.status import BatchStatus, FailureCategory, FailureSummary

T0 = datetime(2026, 5, 1, tzinfo=UTC)
#: The metadata of a new execution or step: STARTING, exit UNKNOWN, zero counters.
STARTING = ExecutionMetadata(
    status=BatchStatus.STARTING, exit_status=ExitCode("UNKNOWN"), timestamps=ExecutionTimestamps(T0)
)


def instance() -> JobInstance:
    parameters = JobParameters.of({"day": 20260501})
    key = JobInstanceKey(JobName("load"), parameters)
    return JobInstance(
        id=JobInstanceId(1),
        job_name=JobName("load"),
        instance_key=key.digest(),
        created_at=T0,
        parameters=key.parameters,
    )


def test_job_instance_checks_its_key() -> None:
    record = instance()
    assert record.key.digest() == record.instance_key
    with pytest.raises(ValueError, match="instance_key"):
        JobInstance(
            id=JobInstanceId(1),
            job_name=JobName("other"),
            instance_key=record.instance_key,
            created_at=T0,
            parameters=record.parameters,
        )
    with pytest.raises(ValueError, match="identifying"):
        JobInstance(
            id=JobInstanceId(1),
            job_name=JobName("load"),
            instance_key=record.instance_key,
            created_at=T0,
            parameters=JobParameters.of(
                {"n": JobParameter(ParameterValue.i64(1), identifying=False)}
            ),
        )
    with pytest.raises(errors.ZeroIdentifier):
        JobInstance(
            id=JobInstanceId(0),
            job_name=record.job_name,
            instance_key=record.instance_key,
            created_at=T0,
            parameters=record.parameters,
        )
    assert "20260501" not in repr(record)


def test_new_job_execution_shape() -> None:
    execution = JobExecution(
        id=JobExecutionId(7),
        job_instance_id=JobInstanceId(1),
        attempt=1,
        definition_id=DefinitionId(3),
        metadata=STARTING,
        version=0,
        updated_at=T0,
    )
    assert execution.created_at == T0
    assert execution.metadata.counts == ExecutionCounts()
    assert execution.restart_of_execution_id is None
    with pytest.raises(ValueError, match="attempt"):
        JobExecution(
            id=JobExecutionId(7),
            job_instance_id=JobInstanceId(1),
            attempt=0,
            definition_id=DefinitionId(3),
            metadata=STARTING,
            version=0,
            updated_at=T0,
        )
    with pytest.raises(errors.InvalidTimestampOrder):
        JobExecution(
            id=JobExecutionId(7),
            job_instance_id=JobInstanceId(1),
            attempt=1,
            definition_id=DefinitionId(3),
            metadata=STARTING,
            version=0,
            updated_at=T0 - timedelta(microseconds=1),
        )
    with pytest.raises(errors.VersionOutOfRange):
        JobExecution(
            id=JobExecutionId(7),
            job_instance_id=JobInstanceId(1),
            attempt=1,
            definition_id=DefinitionId(3),
            metadata=STARTING,
            version=-1,
            updated_at=T0,
        )


def test_new_step_execution_defaults_to_empty_state() -> None:
    step = StepExecution(
        id=StepExecutionId(9),
        job_execution_id=JobExecutionId(7),
        step_name=StepName("extract"),
        logical_id=NodeId("extract"),
        metadata=STARTING,
        version=0,
        updated_at=T0,
    )
    assert step.checkpoint == Checkpoint.empty()
    assert step.context == ExecutionContext.empty()
    assert step.fault_counts.read_retry == 0


def test_selection() -> None:
    record = instance()
    assert isinstance(Created(record), JobInstanceSelection)
    assert not isinstance(Existing(record), Created)
    assert Existing(record).instance is record
    created: JobInstanceSelection = Created(record)
    assert created != Existing(record)


def test_values_pickle_across_processes() -> None:
    legacy = DefinitionIdentity.LEGACY
    other = DefinitionIdentity.from_manifest(JobName("j"), DefinitionRevision("r"), {"format": 1})
    values: list[object] = [
        instance(),
        JobParameters.of({"a": 1, "b": "x"}),
        legacy,
        Checkpoint(StateSchemaId("s"), 2, {"a": [1.5, 1e16]}),
        STARTING,
        LifecycleTransition.failed(T0, FailureSummary(FailureCategory.TIMEOUT, FailureId(1))),
        DefinitionUpgrade(DefinitionUpgradeKey("k"), legacy, other, {StepName("a"): StepName("b")}),
    ]
    for value in values:
        assert pickle.loads(pickle.dumps(value)) == value
