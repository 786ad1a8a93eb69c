"""Verify the tamper-evident audit chain (`pybatch audit verify`): name its first break.

After the links: a purge marking more links than it deleted records, and records with no link.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from pybatch._repository import audit_chain
from pybatch.values.audit import GENESIS_DIGEST, AuditVerification

if TYPE_CHECKING:
    from pybatch._job_repository import JobRepository

PAGE = 1000  # Links read per page.


def verify_audit_chain(
    repository: JobRepository,
    *,
    page: int = PAGE,
    progress: Callable[[int, int], None] | None = None,
) -> AuditVerification:
    """Walk the whole chain, past the head too, and name the first broken link (read-only)."""
    q = repository.statements

    def head() -> tuple[int, bytes]:
        with repository.read_transaction() as conn:
            return audit_chain.audit_chain_head(q, conn)

    def links_after(seq: int) -> list[audit_chain.AuditLinkCheck]:
        with repository.read_transaction() as conn:
            return audit_chain.audit_links_after(q, conn, seq, page)

    head_seq, head_digest = head()
    previous, seq = GENESIS_DIGEST, 0
    while True:
        links = links_after(seq)
        if not links and seq < head_seq:
            # The head read at the start may have been behind links appended since; the
            # head is read again before the chain is called short.
            head_seq, head_digest = head()
            links = links_after(seq)
        if not links:
            break
        for link in links:
            number = link.seq
            if number > head_seq:
                # A link and the head advance together; re-read the head before calling
                # this link one written around the chain.
                head_seq, head_digest = head()
            if number != seq + 1:
                return AuditVerification(
                    links=seq, broken_at=seq + 1, reason="the link is missing (deleted)"
                )
            if (broken := _broken_link(link, previous, head_seq)) is not None:
                return AuditVerification(links=seq, broken_at=number, reason=broken)
            previous, seq = link.link_digest, number
        if progress is not None:
            progress(seq, max(seq, head_seq))
    if seq != head_seq or previous != head_digest:
        return AuditVerification(
            links=seq,
            broken_at=seq + 1,
            reason=f"the chain ends at link {seq} but its head is link {head_seq} "
            "(links removed or the head rewritten)",
        )
    with repository.read_transaction() as conn:
        overdrawn = audit_chain.overdrawn_audit_purge(q, conn)
        unlinked = audit_chain.unlinked_audit_record(q, conn)
    if overdrawn is not None:
        action, kind, marked, deleted = overdrawn
        return AuditVerification(
            links=seq,
            reason=f"RETENTION_ACTION {action} marks {marked} {kind} links purged but its "
            f"purge deleted {deleted} (purge marks forged)",
        )
    if unlinked is not None:
        return AuditVerification(
            links=seq,
            reason=f"{unlinked[0]} {unlinked[1]} has no link (written outside pybatch, or "
            "recovered while the chain refused links)",
        )
    return AuditVerification(links=seq)


def _broken_link(link: audit_chain.AuditLinkCheck, previous: bytes, head_seq: int) -> str | None:
    """Why `link`, read right after the link whose digest is `previous`, breaks the chain."""
    number, kind, record_id = link.seq, link.record_kind, link.record_id
    if number > head_seq:
        return (
            f"it lies past the head (link {head_seq}): written around the chain, "
            "or the head was rewound"
        )
    if link.previous_digest != previous:
        return "it does not follow the previous link (reordered or rewritten)"
    if link.link_digest != link.expected_link_digest:
        return "its digest does not match its fields"
    current = link.record_content_digest
    if link.purged_by is not None:
        purge = f"RETENTION_ACTION {link.purged_by}"
        if current is not None:
            return f"{kind} {record_id} is marked purged by {purge} but still exists"
        if link.purge_action != "APPLY_PURGE":
            return f"{kind} {record_id} was deleted, and its purge mark names {purge}, no purge"
        if link.purge_seq is None or link.purge_seq <= number:
            return (
                f"{kind} {record_id} was deleted, and its purge mark names {purge}, "
                "which was not recorded after it"
            )
        return None
    if current is None:
        return f"{kind} {record_id} was deleted, and no purge recorded it"
    if current != link.content_digest:
        return f"{kind} {record_id} was changed"
    return None
