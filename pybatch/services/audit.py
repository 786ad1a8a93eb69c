"""Verify the tamper-evident audit chain (`pybatch audit verify`).

Walks the links in sequence order from the head read at the start, in pages, and reports
the first broken link: a gap (a link deleted), a link that does not follow its predecessor
(reordered or rewritten), a link whose digest does not match its fields, a record whose
content changed or that was deleted without a purge recording it, a chain that ends before
its head (links truncated), and finally any audit record that has no link at all.

Statements: audit_chain.sql read_audit_chain_head, list_audit_links, find_unlinked_audit_record
(through pybatch/repository/audit_chain.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from pybatch.repository import audit_chain
from pybatch.values.audit import GENESIS_DIGEST, AuditVerification

if TYPE_CHECKING:
    from pybatch.job_repository import JobRepository

__all__ = ["verify_audit_chain"]

#: Links read per page.
PAGE = 1000


def verify_audit_chain(
    repository: JobRepository,
    *,
    page: int = PAGE,
    progress: Callable[[int, int], None] | None = None,
) -> AuditVerification:
    """Walk the chain and name the first broken link (read-only)."""
    q = repository.statements
    with repository.read_transaction() as conn:
        head_seq, head_digest = audit_chain.audit_chain_head(q, conn)
    previous, seq = GENESIS_DIGEST, 0
    while seq < head_seq:
        with repository.read_transaction() as conn:
            links = audit_chain.audit_links_after(q, conn, seq, page)
        if not links:
            break
        for link in links:
            number = link.seq
            if number > head_seq:
                break
            if number != seq + 1:
                return AuditVerification(
                    links=seq, broken_at=seq + 1, reason="the link is missing (deleted)"
                )
            kind, record_id = link.record_kind, link.record_id
            if link.previous_digest != previous:
                return AuditVerification(
                    links=seq,
                    broken_at=number,
                    reason="it does not follow the previous link (reordered or rewritten)",
                )
            if link.link_digest != link.expected_link_digest:
                return AuditVerification(
                    links=seq, broken_at=number, reason="its digest does not match its fields"
                )
            current = link.record_content_digest
            if current is None and link.purged_by is None:
                return AuditVerification(
                    links=seq,
                    broken_at=number,
                    reason=f"{kind} {record_id} was deleted, and no purge recorded it",
                )
            if current is not None and current != link.content_digest:
                return AuditVerification(
                    links=seq, broken_at=number, reason=f"{kind} {record_id} was changed"
                )
            previous, seq = link.link_digest, number
        if progress is not None:
            progress(seq, head_seq)
    if seq != head_seq or previous != head_digest:
        return AuditVerification(
            links=seq,
            broken_at=seq + 1,
            reason=f"the chain ends at link {seq} but its head is link {head_seq} "
            "(links removed or the head rewritten)",
        )
    with repository.read_transaction() as conn:
        unlinked = audit_chain.unlinked_audit_record(q, conn)
    if unlinked is not None:
        return AuditVerification(
            links=seq, reason=f"{unlinked[0]} {unlinked[1]} has no link (written outside pybatch)"
        )
    return AuditVerification(links=seq)
