"""Codec of flow_decision rows: a row the domain refuses is FlowStateCorrupt, so no flow goes on."""

from __future__ import annotations

from pybatch._codecs import _primitives as p
from pybatch.errors import FlowStateCorrupt, PyBatchError
from pybatch.values import flow
from pybatch.values.names import ExitCode, NodeId

FLOW_DECISION_COLUMNS = tuple(
    """id job_execution_id source_step_execution_id reused_decision_id sequence source_node_id
    observed_outcome target_node_id transition_kind terminal_kind plan_fingerprint input_digest
    decided_at""".split()
)


def _target(row: p.Row) -> flow.FlowTarget:
    node, terminal = row["target_node_id"], row["terminal_kind"]
    if terminal is None:
        return flow.FlowTarget.to_node(NodeId(p.decode_text(node, column="target_node_id")))
    if node is not None:
        raise p.DecodeError("target_node_id")
    return flow.FlowTarget.end(p.decode_enum(flow.TerminalKind, terminal, column="terminal_kind"))


def decode_flow_decision(row: p.Row) -> flow.FlowDecision:
    """Decode one flow_decision row; any column the domain refuses is FlowStateCorrupt."""
    try:
        return flow.FlowDecision(
            id=p.int64_at(row, "id"),
            job_execution_id=p.int64_at(row, "job_execution_id"),
            sequence=p.int64_at(row, "sequence"),
            source_node_id=NodeId(p.text_at(row, "source_node_id")),
            source_step_execution_id=p.optional_int64_at(row, "source_step_execution_id"),
            kind=p.enum_at(flow.FlowTransitionKind, row, "transition_kind"),
            observed_outcome=ExitCode(p.text_at(row, "observed_outcome")),
            target=_target(row),
            plan_fingerprint=p.digest_at(row, "plan_fingerprint"),
            input_digest=p.digest_at(row, "input_digest"),
            reused_decision_id=p.optional_int64_at(row, "reused_decision_id"),
            decided_at=p.aware_at(row, "decided_at"),
        )
    except (p.DecodeError, PyBatchError, ValueError, TypeError):
        raise FlowStateCorrupt() from None


def encode_flow_decision_request(request: flow.FlowDecisionRequest) -> dict[str, object]:
    """The insert parameters of a decision request (queries/flow.sql insert_flow_decision)."""
    target = request.target
    return {
        "job_execution_id": request.job_execution_id,
        "source_step_execution_id": request.source_step_execution_id,
        "reused_decision_id": request.reused_decision_id,
        "sequence": request.sequence,
        "node_id": request.source_node_id.value,
        "observed_outcome": request.observed_outcome.value,
        "target_node_id": None if target.node is None else target.node.value,
        "transition_kind": request.kind.value,
        "terminal_kind": None if target.terminal is None else target.terminal.value,
        "plan_fingerprint": request.plan_fingerprint,
        "input_digest": request.input_digest,
        "decided_at": request.decided_at,
    }
