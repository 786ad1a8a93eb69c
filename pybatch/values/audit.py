"""The tamper-evident audit chain: record kinds and what a verification found.

Link n of the chain holds the SHA-256 of its record's canonical content (the
`pybatch.audit_record_content` view: a JSON array of the record kind and its columns,
bytea as hex, instants as UTC ISO 8601 with microseconds) and
`link_digest = SHA-256(previous link digest || seq (8 bytes, big-endian) || kind (UTF-8)
|| record id (8 bytes, big-endian) || content digest)`, the first link's previous digest
being 32 zero bytes.
"""

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
