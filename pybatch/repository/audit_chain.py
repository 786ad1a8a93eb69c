"""The audit hash chain (queries/audit_chain.sql); see pybatch/values/audit.py for the format.

Every operator request, recovery decision and retention action is linked when it is
appended, in the same transaction, so a record and its link commit together or not at all.
"""

from __future__ import annotations

import logging

import attrs
import psycopg

from pybatch import _sqlstate
from pybatch._statements import Connection, Statements
from pybatch.codecs._primitives import (
    DecodeError,
    decode_digest,
    decode_int64,
    decode_optional_int64,
    decode_text,
)
from pybatch.errors import PyBatchError, RetryableConflict, Unavailable
from pybatch.values.audit import AuditRecordKind

logger = logging.getLogger("pybatch.audit")


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
    #: That retention action's action (APPLY_PURGE for a real purge), None without one.
    purge_action: str | None = None
    #: The sequence number of that retention action's own link, None without one.
    purge_seq: int | None = None


def link_audit_record(
    q: Statements,
    conn: Connection,
    kind: AuditRecordKind,
    record_id: int,
    *,
    tolerate_chain_errors: bool = False,
) -> int | None:
    """Append the link of a record just written in this transaction; return its sequence number.

    With `tolerate_chain_errors`, a chain that refuses the link leaves the record unlinked
    (`try_link_audit_record`, which returns None then).

    The database function appends the link and advances the head in one statement; the
    chain's triggers refuse a link that would not follow the head (migration 0007).

    Raises:
        Unavailable: the record is not visible (a bug: nothing is linked, the head is unchanged).
        IntegrityViolation: the chain refused the link (it is damaged: `pybatch audit verify`
            names where); raised by the caller's operation when it maps the driver error.
    """
    if tolerate_chain_errors:
        return try_link_audit_record(q, conn, kind, record_id)
    row = q.append_audit_link.one(conn, record_kind=kind.value, record_id=record_id)
    if row is None:
        raise Unavailable()
    decode_digest(row["link_digest"], column="link_digest")
    return decode_int64(row["seq"], column="seq", minimum=1)


def try_link_audit_record(
    q: Statements, conn: Connection, kind: AuditRecordKind, record_id: int
) -> int | None:
    """Link a record like `link_audit_record`, but leave it unlinked if the chain refuses.

    For the writes that must never wait on the chain's health (the automatic recovery of a
    dead run): the append runs under its own savepoint, so a refusal by the chain's triggers,
    a collision with a link written around pybatch, or a lock or statement timeout on the head
    rolls back only the link. The record stays, unlinked, which `pybatch audit verify`
    reports; an error line names it. Returns the link's sequence number, or None.

    Raises:
        Unavailable: the connection itself failed.
        RetryableConflict: a deadlock or serialization failure (the unit of work retries).
    """
    mapped: PyBatchError | None = None
    try:
        with conn.transaction():
            return link_audit_record(q, conn, kind, record_id)
    except psycopg.Error as error:
        if conn.broken:
            raise
        mapped = _sqlstate.translate(error)
    except PyBatchError as error:
        mapped = error
    if isinstance(mapped, RetryableConflict):
        raise mapped  # a deadlock or serialization failure: the unit of work runs again
    logger.error(
        "pybatch: the audit chain refused the link of %s %s (%s); the record is kept unlinked, "
        "and `pybatch audit verify` reports the chain broken until it is repaired",
        kind.value,
        record_id,
        "unknown" if mapped is None else mapped.__class__.__name__,
    )
    return None


def audit_chain_head(q: Statements, conn: Connection) -> tuple[int, bytes]:
    """The newest link's (seq, digest)."""
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
    """A page of links with their expected digests and their records' current content."""
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
                purge_action=None
                if row["purge_action"] is None
                else decode_text(row["purge_action"], column="purge_action"),
                purge_seq=decode_optional_int64(row["purge_seq"], column="purge_seq", minimum=1),
            )
        )
    return links


def unlinked_audit_record(q: Statements, conn: Connection) -> tuple[str, int] | None:
    """An audit record without a link (inserted behind pybatch's back), or None."""
    row = q.find_unlinked_audit_record.one(conn)
    if row is None:
        return None
    return (
        decode_text(row["record_kind"], column="record_kind"),
        decode_int64(row["record_id"], column="record_id", minimum=1),
    )


def overdrawn_audit_purge(q: Statements, conn: Connection) -> tuple[int, str, int, int] | None:
    """A retention action marking more links of a kind purged than it deleted, or None.

    Returns (retention action id, record kind, links marked, records deleted).
    """
    row = q.find_overdrawn_audit_purge.one(conn)
    if row is None:
        return None
    return (
        decode_int64(row["retention_action_id"], column="retention_action_id", minimum=1),
        decode_text(row["record_kind"], column="record_kind"),
        decode_int64(row["marked"], column="marked", minimum=0),
        decode_int64(row["deleted"], column="deleted", minimum=0),
    )
