"""Audit record kinds and what verifying the chain found (docs/architecture.md, The audit chain)."""

from __future__ import annotations

import attrs

from pybatch.values.ids import Code

GENESIS_DIGEST = bytes(32)  # The "previous digest" of the first link.


class AuditRecordKind(Code):
    """Which table an audit record lives in."""

    OPERATOR_REQUEST = "OPERATOR_REQUEST"
    RECOVERY_DECISION = "RECOVERY_DECISION"
    RETENTION_ACTION = "RETENTION_ACTION"


@attrs.frozen(kw_only=True)
class AuditVerification:
    """What walking the chain found: intact, or the first broken link and why."""

    links: int
    broken_at: int | None = None
    reason: str | None = None

    @property
    def intact(self) -> bool:
        """True when every link and every record checked out."""
        return self.broken_at is None and self.reason is None

    def describe(self) -> str:
        """One line for operators."""
        if self.intact:
            return f"audit chain intact: {self.links} links verified"
        where = "" if self.broken_at is None else f" at link {self.broken_at}"
        return f"audit chain broken{where}: {self.reason}"
