"""Flow steps and start limits (behaviour.md 4.7) over queries/flow.sql."""

from __future__ import annotations

from pybatch._statements import Connection, Statements
from pybatch.clock import Clock
from pybatch.codecs._primitives import decode_int64, decode_optional_int64, returned
from pybatch.codecs.executions import decode_job_execution
from pybatch.codecs.steps import decode_step_execution
from pybatch.errors import (
    DuplicateStep,
    JobExecutionNotFound,
    JobInstanceNotFound,
    StartLimitExceeded,
)
from pybatch.repository import instances
from pybatch.repository.steps import insert_step_execution
from pybatch.values.flow import StartLimit
from pybatch.values.ids import IdentifierKind, check_identifier
from pybatch.values.names import NodeId, StepName
from pybatch.values.records import StepExecution

__all__ = ["create_flow_step_execution", "latest_flow_step"]


def create_flow_step_execution(
    q: Statements,
    conn: Connection,
    clock: Clock,
    job_execution_id: int,
    step_name: StepName,
    node_id: NodeId,
    start_limit: StartLimit,
) -> StepExecution:
    """Start a node: check its start limit and copy the newest state of the node (4.7).

    The instance row lock serializes concurrent starts across attempts and processes, so
    the count and the insert cannot interleave with another start of the node.

    Raises:
        JobExecutionNotFound: no such job execution.
        DuplicateStep: the name or node is taken in this execution.
        StartLimitExceeded: the node already started `start_limit` times in the instance.

    Statements: executions.sql get_job_execution; instances.sql lock_job_instance; steps.sql
    find_conflicting_step_execution, insert_step_execution(_from_source), get_step_execution;
    flow.sql count_flow_node_starts, find_latest_flow_step_execution.
    """
    check_identifier(IdentifierKind.JOB_EXECUTION, job_execution_id)
    row = q.get_job_execution.one(conn, job_execution_id=job_execution_id)
    if row is None:
        raise JobExecutionNotFound(id=job_execution_id)
    # No step begins under a corrupt execution (6.3).
    instance_id = decode_job_execution(row).job_instance_id
    instances.lock_job_instance(q, conn, instance_id)
    names = {"job_execution_id": job_execution_id, "step_name": step_name.value}
    if q.find_conflicting_step_execution.one(conn, **names, node_id=node_id.value) is not None:
        raise DuplicateStep(
            job_execution_id=job_execution_id, step_name=step_name.value, node_id=node_id.value
        )
    node = {"job_instance_id": instance_id, "node_id": node_id.value}
    starts = decode_int64(q.count_flow_node_starts.scalar(conn, **node), column="starts", minimum=0)
    if starts >= start_limit.value:
        raise StartLimitExceeded(
            instance_id=instance_id, node_id=node_id.value, limit=start_limit.value
        )
    source_id = decode_optional_int64(
        q.find_latest_flow_step_execution.scalar(conn, **node), column="id", minimum=1
    )
    step_id = insert_step_execution(
        q, conn, job_execution_id, step_name, node_id.value, source_id, clock.now()
    )
    return decode_step_execution(
        returned(q.get_step_execution.one(conn, step_execution_id=step_id))
    )


def latest_flow_step(
    q: Statements, conn: Connection, instance_id: int, node_id: NodeId
) -> StepExecution | None:
    """The newest step of a node in an instance with its stored context, or None (rule 8).

    Statements: instances.sql get_job_instance; flow.sql find_latest_flow_step_execution;
    steps.sql get_step_execution.
    """
    check_identifier(IdentifierKind.JOB_INSTANCE, instance_id)
    if q.get_job_instance.one(conn, job_instance_id=instance_id) is None:
        raise JobInstanceNotFound(id=instance_id)
    step_id = q.find_latest_flow_step_execution.scalar(
        conn, job_instance_id=instance_id, node_id=node_id.value
    )
    if step_id is None:
        return None
    return decode_step_execution(
        returned(q.get_step_execution.one(conn, step_execution_id=step_id))
    )
