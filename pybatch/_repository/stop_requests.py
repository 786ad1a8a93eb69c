"""Durable stop requests (docs/contract.md, Stop requests), queries/stop_requests.sql.

A stop request is a record on the execution, not a transition: the owning runner sees it
through `observe_execution_control` at its next chunk boundary or lease renewal, and it is
the runner that moves the execution to STOPPING and then STOPPED.
"""

from __future__ import annotations

import datetime as _dt

import attrs

from pybatch._repository import _lifecycle, executions
from pybatch._repository._capability import Capability
from pybatch.errors import StaleVersion
from pybatch.values.ids import IdentifierKind, aware_utc, check_identifier
from pybatch.values.names import ActorRef
from pybatch.values.records import JobExecution


class StopRequests(Capability):
    def request(
        self, execution_id: int, expected_version: int, actor: ActorRef, requested_at: _dt.datetime
    ) -> JobExecution:
        """Record (or overwrite) a stop request, version unchanged (NotFound, StaleVersion)."""
        with self._operation() as (q, conn):
            check_identifier(IdentifierKind.JOB_EXECUTION, execution_id)
            _lifecycle.check_expected_version(expected_version)
            requested_at = aware_utc(requested_at)
            current = _lifecycle.lock(executions.ROWS, q, conn, execution_id)
            if current.version != expected_version:
                raise StaleVersion(expected=expected_version, actual=current.version)
            changed = q.update_job_execution_stop_request.affected(
                conn,
                job_execution_id=execution_id,
                expected_version=expected_version,
                actor_ref=actor.value,
                requested_at=requested_at,
            )
            if changed != 1:
                raise StaleVersion(expected=expected_version, actual=current.version)
            return attrs.evolve(current, updated_at=max(current.updated_at, requested_at))
