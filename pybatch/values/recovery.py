"""Recovery requests of orphaned or ambiguous executions (behaviour.md 2.1, 2.20)."""

from __future__ import annotations

import enum
import unicodedata

import attrs

from pybatch.errors import (
    RecoveryEvidenceDigestInvalid,
    RecoveryRequestControlCharacter,
    RecoveryRequestEmpty,
    RecoveryRequestSurroundingWhitespace,
    RecoveryRequestTooLong,
)
from pybatch.values.ids import check_version
from pybatch.values.names import UNICODE_WHITE_SPACE
from pybatch.values.status import BatchStatus, FailureSummary

__all__ = ["RecoveryDisposition", "RecoveryRequest"]


class RecoveryDisposition(enum.Enum):
    """What recovery makes of the execution."""

    #: FAILED: the instance can be restarted.
    MARK_FAILED = "FAILED"
    #: ABANDONED: the instance never runs again.
    ABANDON = "ABANDONED"

    @property
    def status(self) -> BatchStatus:
        """The resulting status."""
        return BatchStatus(self.value)


def _check_text(field: str, value: str, max_bytes: int) -> None:
    """Validation order of behaviour.md 2.1: empty, too long, whitespace, control."""
    if type(value) is not str:
        raise TypeError(f"{field} is a str")
    if not value:
        raise RecoveryRequestEmpty(field=field)
    if len(value.encode("utf-8")) > max_bytes:
        raise RecoveryRequestTooLong(field=field, max_bytes=max_bytes)
    if value[0] in UNICODE_WHITE_SPACE or value[-1] in UNICODE_WHITE_SPACE:
        raise RecoveryRequestSurroundingWhitespace(field=field)
    if any(unicodedata.category(character) == "Cc" for character in value):
        raise RecoveryRequestControlCharacter(field=field)


@attrs.frozen(kw_only=True, repr=False)
class RecoveryRequest:
    """An operator's audited decision about an unresolved execution at a known version."""

    expected_version: int
    disposition: RecoveryDisposition
    reason_code: str
    operator_reference: str
    evidence_digest: bytes
    failure: FailureSummary | None = None

    def __attrs_post_init__(self) -> None:
        check_version(self.expected_version)
        _check_text("reason code", self.reason_code, 64)
        _check_text("operator reference", self.operator_reference, 128)
        if type(self.evidence_digest) is not bytes or len(self.evidence_digest) != 32:
            raise RecoveryEvidenceDigestInvalid()
        if (self.disposition is RecoveryDisposition.MARK_FAILED) != (self.failure is not None):
            raise ValueError("MARK_FAILED carries a failure summary; ABANDON carries none")

    @classmethod
    def mark_failed(
        cls,
        expected_version: int,
        reason_code: str,
        operator_reference: str,
        evidence_digest: bytes,
        failure: FailureSummary,
    ) -> RecoveryRequest:
        """Make the execution FAILED (restartable) with `failure`."""
        return cls(
            expected_version=expected_version,
            disposition=RecoveryDisposition.MARK_FAILED,
            reason_code=reason_code,
            operator_reference=operator_reference,
            evidence_digest=evidence_digest,
            failure=failure,
        )

    @classmethod
    def abandon(
        cls,
        expected_version: int,
        reason_code: str,
        operator_reference: str,
        evidence_digest: bytes,
    ) -> RecoveryRequest:
        """Make the execution ABANDONED (never restartable); a prior failure is cleared."""
        return cls(
            expected_version=expected_version,
            disposition=RecoveryDisposition.ABANDON,
            reason_code=reason_code,
            operator_reference=operator_reference,
            evidence_digest=evidence_digest,
        )

    def __repr__(self) -> str:
        return (
            f"RecoveryRequest(expected_version={self.expected_version}, "
            f"disposition={self.disposition.name}, reason_code={self.reason_code!r}, "
            f'operator_reference={self.operator_reference!r}, evidence_digest="<redacted>")'
        )
