"""Recovery requests of orphaned or ambiguous executions."""

from __future__ import annotations

import datetime
import enum

import attrs

from pybatch import _config as config
from pybatch import errors as e
from pybatch.values.ids import IdentifierKind, aware_utc, digest, version
from pybatch.values.names import first_violation
from pybatch.values.records import JobExecution
from pybatch.values.status import BatchStatus, FailureSummary


def _check_text(field: str, value: str, max_bytes: int) -> None:
    """The names' rules in their order (values/names.py), refused as the recovery's error."""
    if (violation := first_violation(value, max_bytes)) is None:
        return
    rule = violation[0]
    if rule is None:
        raise e.TextNotUtf8(kind=f"recovery {field}")
    bound = max_bytes if rule is e.TextRule.TOO_LONG else None
    raise e.RecoveryFieldInvalid(field=field, rule=rule, max_bytes=bound)


def _member_name(member: enum.Enum) -> str:
    return member.name


def _redacted(value: object) -> str:
    return '"<redacted>"'


@attrs.frozen
class RecoveryRequest:
    """An operator's audited decision about an unresolved execution at a known version.

    With a `failure` it marks the execution FAILED (the instance can restart); without one it
    abandons it (ABANDONED, never restarted) and clears any failure it had.
    """

    expected_version: int = attrs.field(validator=version)
    reason_code: str
    operator_reference: str
    evidence_digest: bytes = attrs.field(repr=_redacted)
    failure: FailureSummary | None = attrs.field(default=None, repr=False)

    def __attrs_post_init__(self) -> None:
        _check_text("reason code", self.reason_code, 64)
        _check_text("operator reference", self.operator_reference, 128)
        if type(self.evidence_digest) is not bytes or len(self.evidence_digest) != 32:
            raise e.RecoveryEvidenceDigestInvalid()

    @property
    def status(self) -> BatchStatus:
        """What the execution becomes: FAILED with a failure, else ABANDONED."""
        return BatchStatus.ABANDONED if self.failure is None else BatchStatus.FAILED


@attrs.frozen(kw_only=True)
class RecoveryDecision:
    """The audit row of one recovery: who decided what about which version, and when."""

    id: int = attrs.field(validator=IdentifierKind.RECOVERY_DECISION.validator)
    job_execution_id: int = attrs.field(validator=IdentifierKind.JOB_EXECUTION.validator)
    execution_version: int = attrs.field(validator=version)  # observed before the decision
    prior_status: BatchStatus = attrs.field(repr=_member_name)
    resulting_status: BatchStatus = attrs.field(repr=_member_name)
    reason_code: str
    operator_reference: str
    evidence_digest: bytes = attrs.field(repr=_redacted, validator=digest)
    decided_at: datetime.datetime = attrs.field(
        converter=aware_utc, repr=lambda at: repr(at.isoformat())
    )

    def __attrs_post_init__(self) -> None:
        if not self.prior_status.is_unresolved:
            raise ValueError("prior_status is an unresolved status")
        if self.resulting_status not in (BatchStatus.FAILED, BatchStatus.ABANDONED):
            raise ValueError("resulting_status is FAILED or ABANDONED")
        _check_text("reason code", self.reason_code, 64)
        _check_text("operator reference", self.operator_reference, 128)


@attrs.frozen
class RecoveryResult:
    """The recovered execution and its audit decision (docs/contract.md, Recovery vocabulary)."""

    execution: JobExecution
    decision: RecoveryDecision


class OwnerObservation(enum.Enum):
    """Who owns an execution, as seen by the process asking; the token is never shown."""

    ABSENT = "ABSENT"
    CURRENT_PROCESS = "CURRENT_PROCESS"
    OTHER_PROCESS = "OTHER_PROCESS"


class RecoveryMarkers(enum.IntFlag):
    """Evidence that recovering an execution may not be safe to do blindly."""

    NONE = 0
    UNKNOWN_COMMIT = 1
    COMPLETED_PARTITION = 2
    COMMITTED_FLOW_DECISION = 4
    AMBIGUOUS_EXTERNAL_EFFECT = 8


@attrs.frozen(kw_only=True)
class RecoveryStepEvidence:
    """The newest step of an execution: id, status and checkpoint (schema, version)."""

    id: int
    status: BatchStatus
    checkpoint_schema: str
    checkpoint_schema_version: int


@attrs.frozen(kw_only=True)
class RecoverySnapshot:
    """A value-redacted observation of one execution for a recovery decision."""

    execution_id: int
    status: BatchStatus
    attempt: int
    version: int
    owner: OwnerObservation
    updated_at: datetime.datetime
    server_time: datetime.datetime
    latest_step: RecoveryStepEvidence | None
    markers: RecoveryMarkers

    def is_stale(
        self,
        threshold: datetime.timedelta = config.DEFAULT_STALE_THRESHOLD,
        max_clock_skew: datetime.timedelta = config.DEFAULT_MAX_CLOCK_SKEW,
    ) -> bool:
        """Whether it is unresolved with no durable write for `threshold` (database clock).

        `updated_at` came from a client held within `max_clock_skew`, so the skew is added: a client
        slightly ahead never makes a live run look stale (bounds 1 min..24 h, 100 ms..60 s).
        """
        config.check_bounds(threshold, config.STALE_THRESHOLD_BOUNDS, e.StaleThresholdOutOfRange)
        config.check_bounds(max_clock_skew, config.CLOCK_SKEW_BOUNDS, e.ClockSkewBoundOutOfRange)
        if not self.status.is_unresolved:
            return False
        return self.server_time - self.updated_at > threshold + max_clock_skew
