"""The audit hash chain (queries/audit_chain.sql); see pybatch/values/audit.py for the format.

Every operator request, recovery decision and retention action is linked when it is
appended, in the same transaction, so a record and its link commit together or not at all.
"""

from __future__ import annotations

from typing import Any

import psycopg

from pybatch._statements import Statements
from pybatch.codecs._primitives import DecodeError
from pybatch.errors import Unavailable
from pybatch.values.audit import AuditRecordKind

__all__ = ["audit_chain_head", "audit_links_after", "link_audit_record", "unlinked_audit_record"]

Connection = psycopg.Connection[Any]


def link_audit_record(
    q: Statements, conn: Connection, kind: AuditRecordKind, record_id: int
) -> int:
    """Append the link of a record just written in this transaction; return its sequence number.

    Raises:
        Unavailable: the record is not visible (a bug: nothing is linked, the head is unchanged
            once the caller's savepoint rolls back).

    Statements: audit_chain.sql append_audit_link, set_audit_chain_head.
    """
    row = q.append_audit_link(conn, record_kind=kind.value, record_id=record_id)
    if row is None:
        raise Unavailable()
    seq, link = row["seq"], row["link_digest"]
    if type(seq) is not int or seq < 1:
        raise DecodeError("seq")
    if q.set_audit_chain_head(conn, seq=seq, link_digest=bytes(link)) != 1:
        raise Unavailable()
    return seq


def audit_chain_head(q: Statements, conn: Connection) -> tuple[int, bytes]:
    """The newest link's (seq, digest).

    Statements: audit_chain.sql read_audit_chain_head.
    """
    row = q.read_audit_chain_head(conn)
    if row is None:
        raise DecodeError("audit_chain_head")
    return int(row["seq"]), bytes(row["link_digest"])


def audit_links_after(
    q: Statements, conn: Connection, after_seq: int, limit: int
) -> list[dict[str, Any]]:
    """A page of links with their expected digests and their records' current content.

    Statements: audit_chain.sql list_audit_links.
    """
    return list(q.list_audit_links(conn, after_seq=after_seq, limit=limit))


def unlinked_audit_record(q: Statements, conn: Connection) -> tuple[str, int] | None:
    """An audit record without a link (inserted behind pybatch's back), or None.

    Statements: audit_chain.sql find_unlinked_audit_record.
    """
    row = q.find_unlinked_audit_record(conn)
    return None if row is None else (str(row["record_kind"]), int(row["record_id"]))
