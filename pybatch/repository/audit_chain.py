"""The audit hash chain (queries/audit_chain.sql); see pybatch/values/audit.py for the format.

Every operator request, recovery decision and retention action is linked when it is
appended, in the same transaction, so a record and its link commit together or not at all.
"""

from __future__ import annotations

import attrs

from pybatch._statements import Connection, Statements
from pybatch.codecs._primitives import (
    DecodeError,
    decode_digest,
    decode_int64,
    decode_optional_int64,
    decode_text,
)
from pybatch.errors import Unavailable
from pybatch.values.audit import AuditRecordKind

__all__ = [
    "AuditLinkCheck",
    "audit_chain_head",
    "audit_links_after",
    "link_audit_record",
    "unlinked_audit_record",
]


@attrs.frozen
class AuditLinkCheck:
    """One link as stored, the digest it should have, and its record's current content."""

    seq: int
    record_kind: str
    record_id: int
    content_digest: bytes
    previous_digest: bytes
    link_digest: bytes
    expected_link_digest: bytes
    #: None when the record is gone.
    record_content_digest: bytes | None
    #: The retention action whose purge deleted the record, if one did.
    purged_by: int | None


def link_audit_record(
    q: Statements, conn: Connection, kind: AuditRecordKind, record_id: int
) -> int:
    """Append the link of a record just written in this transaction; return its sequence number.

    Raises:
        Unavailable: the record is not visible (a bug: nothing is linked, the head is unchanged
            once the caller's savepoint rolls back).

    Statements: audit_chain.sql append_audit_link, set_audit_chain_head.
    """
    row = q.append_audit_link.one(conn, record_kind=kind.value, record_id=record_id)
    if row is None:
        raise Unavailable()
    seq = decode_int64(row["seq"], column="seq", minimum=1)
    link = decode_digest(row["link_digest"], column="link_digest")
    if q.set_audit_chain_head.affected(conn, seq=seq, link_digest=link) != 1:
        raise Unavailable()
    return seq


def audit_chain_head(q: Statements, conn: Connection) -> tuple[int, bytes]:
    """The newest link's (seq, digest).

    Statements: audit_chain.sql read_audit_chain_head.
    """
    row = q.read_audit_chain_head.one(conn)
    if row is None:
        raise DecodeError("audit_chain_head")
    return (
        decode_int64(row["seq"], column="seq", minimum=0),
        decode_digest(row["link_digest"], column="link_digest"),
    )


def audit_links_after(
    q: Statements, conn: Connection, after_seq: int, limit: int
) -> list[AuditLinkCheck]:
    """A page of links with their expected digests and their records' current content.

    Statements: audit_chain.sql list_audit_links.
    """
    links = []
    for row in q.list_audit_links.many(conn, after_seq=after_seq, limit=limit):
        current = row["record_content_digest"]
        links.append(
            AuditLinkCheck(
                seq=decode_int64(row["seq"], column="seq", minimum=1),
                record_kind=decode_text(row["record_kind"], column="record_kind"),
                record_id=decode_int64(row["record_id"], column="record_id", minimum=1),
                content_digest=decode_digest(row["content_digest"], column="content_digest"),
                previous_digest=decode_digest(row["previous_digest"], column="previous_digest"),
                link_digest=decode_digest(row["link_digest"], column="link_digest"),
                expected_link_digest=decode_digest(
                    row["expected_link_digest"], column="expected_link_digest"
                ),
                record_content_digest=None
                if current is None
                else decode_digest(current, column="record_content_digest"),
                purged_by=decode_optional_int64(row["purged_by"], column="purged_by", minimum=1),
            )
        )
    return links


def unlinked_audit_record(q: Statements, conn: Connection) -> tuple[str, int] | None:
    """An audit record without a link (inserted behind pybatch's back), or None.

    Statements: audit_chain.sql find_unlinked_audit_record.
    """
    row = q.find_unlinked_audit_record.one(conn)
    if row is None:
        return None
    return (
        decode_text(row["record_kind"], column="record_kind"),
        decode_int64(row["record_id"], column="record_id", minimum=1),
    )
