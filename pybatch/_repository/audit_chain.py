"""The audit hash chain (queries/audit_chain.sql); see pybatch/values/audit.py for the format.

Every operator request, recovery decision and retention action is linked when it is
appended, in the same transaction, so a record and its link commit together or not at all.
"""

from __future__ import annotations

import logging

import attrs
import psycopg

from pybatch import _sqlstate
from pybatch._codecs._primitives import DecodeError, digest_at, int64_at, optional_int64_at, text_at
from pybatch._statements import Connection, Statements
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


def _append_link(q: Statements, conn: Connection, kind: AuditRecordKind, record_id: int) -> int:
    # One database function appends the link and advances the head; the chain's triggers
    # refuse a link that would not follow the head (IntegrityViolation, mapped by the caller).
    row = q.append_audit_link.one(conn, record_kind=kind.value, record_id=record_id)
    if row is None:  # the record is not visible: a bug, nothing is linked
        raise Unavailable()
    digest_at(row, "link_digest")
    return int64_at(row, "seq")


def link_audit_record(
    q: Statements,
    conn: Connection,
    kind: AuditRecordKind,
    record_id: int,
    *,
    tolerate_chain_errors: bool = False,
) -> int | None:
    """Link a record just written in this transaction; return the link's sequence number.

    With `tolerate_chain_errors` (the automatic recovery of a dead run, which must never wait
    on the chain's health) the append runs under its own savepoint: a refusal by the chain, a
    link written around pybatch or a timeout on the head rolls back only the link, the record
    stays unlinked (an error line names it, `pybatch audit verify` reports it) and None is
    returned. A lost connection or a RetryableConflict still propagates.
    """
    if not tolerate_chain_errors:
        return _append_link(q, conn, kind, record_id)
    mapped: PyBatchError | None = None
    try:
        with conn.transaction():
            return _append_link(q, conn, kind, record_id)
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
    if (row := q.read_audit_chain_head.one(conn)) is None:
        raise DecodeError("audit_chain_head")
    return int64_at(row, "seq", 0), digest_at(row, "link_digest")


def audit_links_after(
    q: Statements, conn: Connection, after_seq: int, limit: int
) -> list[AuditLinkCheck]:
    """A page of links with their expected digests and their records' current content."""
    return [
        AuditLinkCheck(
            seq=int64_at(row, "seq"),
            record_kind=text_at(row, "record_kind"),
            record_id=int64_at(row, "record_id"),
            content_digest=digest_at(row, "content_digest"),
            previous_digest=digest_at(row, "previous_digest"),
            link_digest=digest_at(row, "link_digest"),
            expected_link_digest=digest_at(row, "expected_link_digest"),
            record_content_digest=None
            if row["record_content_digest"] is None
            else digest_at(row, "record_content_digest"),
            purged_by=optional_int64_at(row, "purged_by"),
            purge_action=None if row["purge_action"] is None else text_at(row, "purge_action"),
            purge_seq=optional_int64_at(row, "purge_seq"),
        )
        for row in q.list_audit_links.many(conn, after_seq=after_seq, limit=limit)
    ]


def unlinked_audit_record(q: Statements, conn: Connection) -> tuple[str, int] | None:
    """An audit record without a link (inserted behind pybatch's back), or None."""
    row = q.find_unlinked_audit_record.one(conn)
    return None if row is None else (text_at(row, "record_kind"), int64_at(row, "record_id"))


def overdrawn_audit_purge(q: Statements, conn: Connection) -> tuple[int, str, int, int] | None:
    """A purge that marked more links of a kind than it deleted: (id, kind, marked, deleted)."""
    if (row := q.find_overdrawn_audit_purge.one(conn)) is None:
        return None
    return (
        int64_at(row, "retention_action_id"),
        text_at(row, "record_kind"),
        int64_at(row, "marked", 0),
        int64_at(row, "deleted", 0),
    )
