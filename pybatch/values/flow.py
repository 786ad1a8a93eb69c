"""Start limits, flow targets, decisions and manifest matching (docs/etl-guide.md, Flows)."""

from __future__ import annotations

import datetime as _dt
import enum
import re
from collections.abc import Mapping
from typing import Any

import attrs

from pybatch.errors import ManifestInvalid, ZeroStartLimit
from pybatch.values.ids import IdentifierKind, aware_utc, digest, is_, maybe
from pybatch.values.names import ExitCode, NodeId
from pybatch.values.records import StepExecution
from pybatch.values.state import ExecutionContext

_U32_MAX = 4_294_967_295
#: Flow-graph bounds of a format 2 or 3 manifest, checked when a definition is registered.
MAX_FLOW_NODES = 1024
MAX_FLOW_TRANSITIONS = 4096
MAX_OUTGOING_TRANSITIONS = 64
MAX_EXIT_PATTERN_BYTES = 64


def _check_limit(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    if type(value) is not int or value > _U32_MAX or value < 0:
        raise ValueError("a start limit is 1..4294967295")
    if value == 0:
        raise ZeroStartLimit()


@attrs.frozen
class StartLimit:
    """How many times a node may start in one instance, history included."""

    value: int = attrs.field(validator=_check_limit)

    @classmethod
    def unrestricted(cls) -> StartLimit:
        """The default, no limit in practice: 4294967295 starts."""
        return cls(_U32_MAX)


class TerminalKind(enum.Enum):
    """How a flow ends; the value is the durable code, in lower case the manifest's `end`."""

    COMPLETE = "COMPLETE"
    FAIL = "FAIL"
    STOP = "STOP"


class FlowTransitionKind(enum.Enum):
    """Why a decision was taken; the value is the durable code (all five are storable)."""

    STEP_EXIT = "STEP_EXIT"
    DECIDER = "DECIDER"
    COMPLETED_STEP_REUSE = "COMPLETED_STEP_REUSE"
    SPLIT_AGGREGATE = "SPLIT_AGGREGATE"
    NESTED_JOB_EXIT = "NESTED_JOB_EXIT"


@attrs.frozen
class FlowTarget:
    """Where a flow goes next: a node, or a terminal state (exactly one)."""

    node: NodeId | None = attrs.field(default=None, validator=maybe(NodeId))
    terminal: TerminalKind | None = attrs.field(default=None, validator=maybe(TerminalKind))

    def __attrs_post_init__(self) -> None:
        if (self.node is None) == (self.terminal is None):
            raise ValueError("a flow target is exactly one of a node or a terminal kind")

    @classmethod
    def to_node(cls, node: NodeId | str) -> FlowTarget:
        """Continue with `node`."""
        return cls(node=node if isinstance(node, NodeId) else NodeId(node))

    @classmethod
    def end(cls, kind: TerminalKind) -> FlowTarget:
        """End the flow in `kind`."""
        return cls(terminal=kind)


@attrs.frozen(kw_only=True)
class FlowDecisionRequest:
    """A decision to append: which node decided what, on which evidence."""

    job_execution_id: int = attrs.field(validator=IdentifierKind.JOB_EXECUTION.validator)
    sequence: int = attrs.field(validator=IdentifierKind.FLOW_DECISION_SEQUENCE.validator)
    source_node_id: NodeId = attrs.field(validator=is_(NodeId))
    source_step_execution_id: int | None = attrs.field(
        default=None, validator=IdentifierKind.STEP_EXECUTION.optional
    )
    kind: FlowTransitionKind = attrs.field(validator=is_(FlowTransitionKind))
    observed_outcome: ExitCode = attrs.field(validator=is_(ExitCode))
    target: FlowTarget = attrs.field(validator=is_(FlowTarget))
    plan_fingerprint: bytes = attrs.field(validator=digest)
    input_digest: bytes = attrs.field(validator=digest)
    reused_decision_id: int | None = attrs.field(
        default=None, validator=IdentifierKind.FLOW_DECISION.optional
    )
    decided_at: _dt.datetime = attrs.field(converter=aware_utc)


@attrs.frozen(kw_only=True)
class FlowDecision(FlowDecisionRequest):
    """A recorded decision: the request plus its identity id."""

    id: int = attrs.field(validator=IdentifierKind.FLOW_DECISION.validator)


@attrs.frozen
class FlowStepState:
    """The newest step of a node in an instance with its stored execution context."""

    node_id: NodeId
    step_execution: StepExecution
    context: ExecutionContext


def exit_pattern_matches(pattern: str, outcome: str) -> bool:
    """Whether an exit pattern matches: `*` any run of characters, `?` exactly one."""
    parts = (".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.fullmatch("".join(parts), outcome, flags=re.DOTALL) is not None


_NODE_KINDS: Mapping[FlowTransitionKind, frozenset[str]] = {
    FlowTransitionKind.DECIDER: frozenset({"decision"}),
    FlowTransitionKind.SPLIT_AGGREGATE: frozenset({"join"}),
    FlowTransitionKind.STEP_EXIT: frozenset({"step", "partitioned_step"}),
    FlowTransitionKind.COMPLETED_STEP_REUSE: frozenset({"step", "partitioned_step"}),
}


def _manifest_target(transition: Mapping[str, Any]) -> FlowTarget | None:
    node, end = transition.get("to"), transition.get("end")
    if isinstance(node, str) and end is None:
        try:
            return FlowTarget.to_node(node)
        except Exception:  # an invalid node token selects nothing
            return None
    if end in ("complete", "fail", "stop") and node is None:
        return FlowTarget.end(TerminalKind(end.upper()))
    return None


def check_flow_graph_bounds(manifest: Mapping[str, Any]) -> None:
    """Refuse a flow manifest beyond the MAX_* bounds, which would register and route nothing.

    The ManifestInvalid reason names counts and positions, never node ids or patterns.
    """
    if manifest.get("format") not in (2, 3):
        return
    nodes, transitions = manifest.get("nodes"), manifest.get("transitions")
    if isinstance(nodes, list) and len(nodes) > MAX_FLOW_NODES:
        raise ManifestInvalid(
            reason=f"the flow graph has {len(nodes)} nodes; at most {MAX_FLOW_NODES}"
        )
    if not isinstance(transitions, list):
        return
    if len(transitions) > MAX_FLOW_TRANSITIONS:
        raise ManifestInvalid(
            reason=f"the flow graph has {len(transitions)} transitions; "
            f"at most {MAX_FLOW_TRANSITIONS}"
        )
    outgoing: dict[str, int] = {}
    for position, transition in enumerate(transitions):
        if not isinstance(transition, dict):
            continue
        pattern = transition.get("pattern")
        size = len(pattern.encode("utf-8", "surrogatepass")) if isinstance(pattern, str) else 0
        if size > MAX_EXIT_PATTERN_BYTES:
            raise ManifestInvalid(
                reason=f"the exit pattern of transition {position} is longer than "
                f"{MAX_EXIT_PATTERN_BYTES} bytes"
            )
        source = transition.get("source")
        if isinstance(source, str):
            outgoing[source] = outgoing.get(source, 0) + 1
            if outgoing[source] > MAX_OUTGOING_TRANSITIONS:
                raise ManifestInvalid(
                    reason=f"transition {position} is past the {MAX_OUTGOING_TRANSITIONS} "
                    "transitions one node may have"
                )


def select_flow_target(
    manifest: Mapping[str, Any], node: NodeId, kind: FlowTransitionKind, outcome: ExitCode
) -> FlowTarget | None:
    """The target of the first transition leaving `node` that matches `outcome`, else None."""
    if manifest.get("format") not in (2, 3):
        return None
    allowed = _NODE_KINDS.get(kind)
    nodes, transitions = manifest.get("nodes"), manifest.get("transitions")
    if allowed is None or not isinstance(nodes, list) or not isinstance(transitions, list):
        return None
    source = node.value
    if not any(
        isinstance(entry, dict) and entry.get("id") == source and entry.get("kind") in allowed
        for entry in nodes
    ):
        return None
    for transition in transitions:
        if not isinstance(transition, dict) or transition.get("source") != source:
            continue
        pattern = transition.get("pattern")
        if not isinstance(pattern, str) or len(pattern.encode()) > MAX_EXIT_PATTERN_BYTES:
            return None
        if exit_pattern_matches(pattern, outcome.value):
            return _manifest_target(transition)
    return None


def decision_matches_manifest(manifest: Mapping[str, Any], request: FlowDecisionRequest) -> bool:
    """Whether the manifest's first matching transition leads where the request says."""
    return request.target == select_flow_target(
        manifest, request.source_node_id, request.kind, request.observed_outcome
    )
