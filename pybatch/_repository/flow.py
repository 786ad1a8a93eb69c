"""Flow steps, start limits and flow decisions over queries/flow.sql."""

from __future__ import annotations

import attrs

from pybatch import errors as e
from pybatch._codecs import _primitives as p
from pybatch._codecs.flow import decode_flow_decision, encode_flow_decision_request
from pybatch._codecs.steps import decode_step_execution
from pybatch._repository import _capability, steps
from pybatch._statements import Row
from pybatch.values import flow
from pybatch.values.ids import IdentifierKind, check_identifier
from pybatch.values.names import NodeId, StepName
from pybatch.values.ownership import OwnerToken
from pybatch.values.records import StepExecution


def _started(row: Row | None) -> tuple[bool, StepExecution]:
    """(skipped, the step) of start_flow_step, or its refusal raised."""
    outcome, values = _capability.decided(row, "started", "created", "skipped")
    return outcome == "skipped", decode_step_execution(values)


#: The only transitions that may have no source step.
_SOURCELESS_KINDS = (flow.FlowTransitionKind.DECIDER, flow.FlowTransitionKind.SPLIT_AGGREGATE)


class Flow(_capability.Capability):
    def create_step(
        self,
        job_execution_id: int,
        step_name: StepName,
        node_id: NodeId,
        start_limit: flow.StartLimit | None = None,
    ) -> StepExecution:
        """Create a node's step (STARTING), checking its start limit, with the node's newest state.

        The instance row lock serializes starts across attempts and processes, so the count
        and the insert never interleave. Raises, in this order: JobExecutionNotFound,
        DuplicateStep, StartLimitExceeded.
        """
        check_identifier(IdentifierKind.JOB_EXECUTION, job_execution_id)
        limit = start_limit or flow.StartLimit.unrestricted()
        return self.start_step(job_execution_id, None, step_name, node_id, limit)[1]

    def start_step(
        self,
        job_execution_id: int,
        owner: OwnerToken | None,
        step_name: StepName,
        node_id: NodeId,
        start_limit: flow.StartLimit,
    ) -> tuple[bool, StepExecution]:
        """Start a node's step as `owner`: (True, its COMPLETED step) to skip, else (False, new).

        One statement, committed alone: the new step is STARTED. Without `owner` it is one
        operation of the unit of work (`create_step`). Raises ExecutionOwnershipLost, then
        DuplicateStep, then StartLimitExceeded.
        """
        params = {
            "job_execution_id": job_execution_id,
            "owner_token": None if owner is None else owner.value,
            "step_name": step_name.value,
            "node_id": node_id.value,
            "start_limit": start_limit.value,
            "now": self._uow.clock.now(),
        }
        duplicate = steps.duplicate_step_overrides(job_execution_id, step_name, node_id.value)
        statement = self._uow.statements.start_flow_step
        if owner is not None:
            return self._uow.commit_statement(
                statement, params, _started, overrides=duplicate, wait_for_flush=False
            )
        with self._operation(overrides=duplicate) as (_q, conn):
            return _started(statement.one(conn, **params))

    def latest_step(self, instance_id: int, node_id: NodeId) -> flow.FlowStepState | None:
        """The newest step of a node in an instance with its stored context, or None."""
        with self._operation() as (q, conn):
            _capability.require_job_instance(q, conn, instance_id)
            step_id = q.find_latest_flow_step_execution.scalar(
                conn, job_instance_id=instance_id, node_id=node_id.value
            )
            if step_id is None:
                return None
            step = decode_step_execution(
                p.returned(q.get_step_execution.one(conn, step_execution_id=step_id))
            )
            return flow.FlowStepState(node_id, step, step.context)

    def append_decision(self, request: flow.FlowDecisionRequest) -> flow.FlowDecision:
        """Append a decision checked against the execution's manifest.

        Raises JobExecutionNotFound; FlowStateCorrupt (fingerprint, manifest edge, source step
        or reused decision does not fit); ConcurrentModification (not the next sequence, or
        the node already decided: flow_decision_sequence_unique and _source_unique settle races).
        """
        with self._operation() as (q, conn):
            execution_id = request.job_execution_id
            plan = q.get_job_execution_flow_plan.one(conn, job_execution_id=execution_id)
            if plan is None:
                raise e.JobExecutionNotFound(id=execution_id)
            try:
                digest = p.decode_digest(plan["manifest_digest"], column="manifest_digest")
                manifest = p.decode_json_object(plan["manifest"], column="manifest")
            except p.DecodeError:
                raise e.FlowStateCorrupt() from None
            if digest != request.plan_fingerprint or not flow.decision_matches_manifest(
                manifest, request
            ):
                raise e.FlowStateCorrupt()
            node = request.source_node_id.value
            if request.source_step_execution_id is not None:
                source_matches = q.flow_source_step_matches.scalar(
                    conn,
                    job_execution_id=execution_id,
                    source_step_execution_id=request.source_step_execution_id,
                    node_id=node,
                )
                if source_matches is not True:
                    raise e.FlowStateCorrupt()
            elif request.kind not in _SOURCELESS_KINDS:
                raise e.FlowStateCorrupt()
            params = encode_flow_decision_request(request)
            if request.reused_decision_id is not None:
                reused_matches = q.flow_reused_decision_matches.scalar(
                    conn,
                    job_execution_id=execution_id,
                    reused_decision_id=request.reused_decision_id,
                    node_id=node,
                    plan_fingerprint=request.plan_fingerprint,
                    input_digest=request.input_digest,
                    observed_outcome=request.observed_outcome.value,
                    target_node_id=params["target_node_id"],
                    terminal_kind=params["terminal_kind"],
                )
                if reused_matches is not True:
                    raise e.FlowStateCorrupt()
            if (row := q.insert_flow_decision.one(conn, **params)) is None:
                raise e.ConcurrentModification()
            decision_id = p.decode_int64(row["id"], column="id", minimum=1)
            return flow.FlowDecision(id=decision_id, **attrs.asdict(request, recurse=False))

    def find_reusable_decision(
        self,
        instance_id: int,
        node_id: NodeId,
        plan_fingerprint: bytes,
        input_digest: bytes,
        kind: flow.FlowTransitionKind,
    ) -> flow.FlowDecision | None:
        """The latest decision of `node_id` on the same plan and input (JobInstanceNotFound)."""
        with self._operation() as (q, conn):
            _capability.require_job_instance(q, conn, instance_id)
            row = q.find_reusable_flow_decision.one(
                conn,
                job_instance_id=instance_id,
                node_id=node_id.value,
                plan_fingerprint=bytes(plan_fingerprint),
                input_digest=bytes(input_digest),
                transition_kind=kind.value,
            )
            return None if row is None else decode_flow_decision(row)

    def decisions(self, job_execution_id: int) -> list[flow.FlowDecision]:
        """The decisions of an execution in sequence order (JobExecutionNotFound without it)."""
        with self._operation() as (q, conn):
            _capability.job_execution_row(q, conn, job_execution_id)
            rows = q.list_flow_decisions.many(conn, job_execution_id=job_execution_id)
            return [decode_flow_decision(row) for row in rows]
