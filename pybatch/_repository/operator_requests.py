"""Operator request audit and idempotency, queries/operator_requests.sql."""

from __future__ import annotations

from pybatch._codecs._primitives import decode_int64, returned
from pybatch._codecs.operator import decode_operator_record, encode_operator_record_draft
from pybatch._repository._capability import Capability
from pybatch._repository.audit_chain import link_audit_record
from pybatch.values.audit import AuditRecordKind
from pybatch.values.ids import OperatorRequestId
from pybatch.values.names import OperationId
from pybatch.values.operator import OperatorAction, OperatorRecord, OperatorRecordDraft


class OperatorRequests(Capability):
    def find(self, action: OperatorAction, operation_id: OperationId) -> OperatorRecord | None:
        """The recorded request of (action, operation id), or None: the service's replay probe.

        The key is the pair; the same operation id under another action is another request.
        """
        with self._operation() as (q, conn):
            row = q.find_operator_request.one(
                conn, action=action.value, operation_id=operation_id.value
            )
            return None if row is None else decode_operator_record(row)

    def append(
        self, draft: OperatorRecordDraft, *, tolerate_chain_errors: bool = False
    ) -> OperatorRecord:
        """Append the audit row of a request, in the unit of work of its effect.

        Race: operator_request_identity_unique makes a second append of one (action, operation
        id) wait for the first and fail (ConcurrentModification), so the service re-probes
        instead of applying the effect twice. IntegrityViolation: another constraint or the
        audit chain refused it (`tolerate_chain_errors`: see link_audit_record).
        """
        with self._operation() as (q, conn):
            row = q.insert_operator_request.one(conn, **encode_operator_record_draft(draft))
            request_id = decode_int64(returned(row)["id"], column="id", minimum=1)
            kind = AuditRecordKind.OPERATOR_REQUEST
            link_audit_record(
                q, conn, kind, request_id, tolerate_chain_errors=tolerate_chain_errors
            )
            return OperatorRecord.from_draft(OperatorRequestId(request_id), draft)
