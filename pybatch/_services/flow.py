"""The flow decision point of a running job: record, in one unit of work, where the flow goes.

On a restart, a step completed earlier, or a decider that decided on the same plan and input,
reuses the recorded decision instead of deciding again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import attrs

from pybatch.errors import FlowStateCorrupt
from pybatch.values import flow
from pybatch.values.names import ExitCode, NodeId
from pybatch.values.records import StepExecution

if TYPE_CHECKING:
    from pybatch._job_repository import JobRepository
    from pybatch._unit_of_work import UnitOfWork
    from pybatch.values.definitions import DefinitionIdentity

K = flow.FlowTransitionKind


@attrs.frozen
class FlowPoint:
    """Where one job execution records its flow decisions."""

    repository: JobRepository
    instance_id: int
    execution_id: int
    definition: DefinitionIdentity
    input_digest: bytes

    def after_step(self, step: StepExecution, *, reused: bool) -> flow.FlowDecision:
        """Record the transition out of `step`'s node; `reused`: it completed in an earlier run."""
        node, outcome = step.logical_id, step.metadata.exit_status

        def work(uow: UnitOfWork) -> flow.FlowDecision:
            recorded = self._recorded(uow, node)
            if recorded is None and reused:
                recorded = self._reuse(uow, node, K.STEP_EXIT, K.COMPLETED_STEP_REUSE, step.id)
            if recorded is not None:
                return recorded
            target = self._select(node, K.STEP_EXIT, outcome)
            return self._append(uow, node, K.STEP_EXIT, outcome, target, source_step=step.id)

        return self.repository.run_in_unit_of_work(work)

    def decide(self, node: NodeId, decider: Callable[[], str]) -> flow.FlowDecision:
        """Run `decider` and record where it leads, unless it decided on this plan and input."""

        def reusable(uow: UnitOfWork) -> flow.FlowDecision | None:
            return self._recorded(uow, node) or self._reuse(uow, node, K.DECIDER, K.DECIDER, None)

        if (found := self.repository.run_in_unit_of_work(reusable)) is not None:
            return found
        outcome = ExitCode(decider())
        target = self._select(node, K.DECIDER, outcome)
        return self.repository.run_in_unit_of_work(
            lambda uow: self._append(uow, node, K.DECIDER, outcome, target)
        )

    def _reuse(
        self,
        uow: UnitOfWork,
        node: NodeId,
        found_as: K,
        kind: K,
        source_step: int | None,
    ) -> flow.FlowDecision | None:
        """Record again, as `kind`, the latest `found_as` decision on this plan and input."""
        earlier = uow.flow.find_reusable_decision(
            self.instance_id, node, self.definition.digest, self.input_digest, found_as
        )
        if earlier is None:
            return None
        outcome, target = earlier.observed_outcome, earlier.target
        return self._append(
            uow, node, kind, outcome, target, source_step=source_step, reused=earlier.id
        )

    def _recorded(self, uow: UnitOfWork, node: NodeId) -> flow.FlowDecision | None:
        decisions = uow.flow.decisions(self.execution_id)
        return next((d for d in decisions if d.source_node_id == node), None)

    def _select(self, node: NodeId, kind: K, outcome: ExitCode) -> flow.FlowTarget:
        if target := flow.select_flow_target(self.definition.manifest(), node, kind, outcome):
            return target
        raise FlowStateCorrupt()

    def _append(
        self,
        uow: UnitOfWork,
        node: NodeId,
        kind: K,
        outcome: ExitCode,
        target: flow.FlowTarget,
        *,
        source_step: int | None = None,
        reused: int | None = None,
    ) -> flow.FlowDecision:
        """Append the execution's next decision: from `node` to `target` on `outcome`."""
        request = flow.FlowDecisionRequest(
            job_execution_id=self.execution_id,
            sequence=len(uow.flow.decisions(self.execution_id)) + 1,
            source_node_id=node,
            source_step_execution_id=source_step,
            kind=kind,
            observed_outcome=outcome,
            target=target,
            plan_fingerprint=self.definition.digest,
            input_digest=self.input_digest,
            reused_decision_id=reused,
            decided_at=uow.clock.now(),
        )
        return uow.flow.append_decision(request)
