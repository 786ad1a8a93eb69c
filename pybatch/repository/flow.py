"""Flow steps and start limits (behaviour.md 4.7) over queries/flow.sql."""

from __future__ import annotations

from typing import Any

import psycopg

from pybatch._statements import Statements
from pybatch.clock import Clock
from pybatch.codecs.executions import decode_step_execution
from pybatch.errors import (
    DuplicateStep,
    JobExecutionNotFound,
    JobInstanceNotFound,
    StartLimitExceeded,
)
from pybatch.repository.steps import insert_step_execution
from pybatch.values.flow import StartLimit
from pybatch.values.ids import IdentifierKind, check_identifier
from pybatch.values.names import NodeId, StepName
from pybatch.values.records import StepExecution

__all__ = ["create_flow_step_execution", "latest_flow_step"]

Connection = psycopg.Connection[Any]


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
    execution = q.get_job_execution(conn, job_execution_id=job_execution_id)
    if execution is None:
        raise JobExecutionNotFound(id=job_execution_id)
    instance_id = execution["job_instance_id"]
    q.lock_job_instance(conn, job_instance_id=instance_id)
    names = {"job_execution_id": job_execution_id, "step_name": step_name.value}
    if q.find_conflicting_step_execution(conn, **names, node_id=node_id.value) is not None:
        raise DuplicateStep(
            job_execution_id=job_execution_id, step_name=step_name.value, node_id=node_id.value
        )
    node = {"job_instance_id": instance_id, "node_id": node_id.value}
    starts = q.count_flow_node_starts(conn, **node)
    if starts >= start_limit.value:
        raise StartLimitExceeded(
            instance_id=instance_id, node_id=node_id.value, limit=start_limit.value
        )
    source_id = q.find_latest_flow_step_execution(conn, **node)
    step_id = insert_step_execution(
        q, conn, job_execution_id, step_name, node_id.value, source_id, clock.now()
    )
    return decode_step_execution(q.get_step_execution(conn, step_execution_id=step_id))


def latest_flow_step(
    q: Statements, conn: Connection, instance_id: int, node_id: NodeId
) -> StepExecution | None:
    """The newest step of a node in an instance with its stored context, or None (rule 8).

    Statements: instances.sql get_job_instance; flow.sql find_latest_flow_step_execution;
    steps.sql get_step_execution.
    """
    check_identifier(IdentifierKind.JOB_INSTANCE, instance_id)
    if q.get_job_instance(conn, job_instance_id=instance_id) is None:
        raise JobInstanceNotFound(id=instance_id)
    step_id = q.find_latest_flow_step_execution(
        conn, job_instance_id=instance_id, node_id=node_id.value
    )
    if step_id is None:
        return None
    return decode_step_execution(q.get_step_execution(conn, step_execution_id=step_id))
