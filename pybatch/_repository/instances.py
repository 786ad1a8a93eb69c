"""Job instances (docs/contract.md, Job instances) over queries/instances.sql."""

from __future__ import annotations

from pybatch._codecs.instances import decode_job_instance, encode_job_instance_key
from pybatch._repository._capability import Capability
from pybatch.errors import ConcurrentModification
from pybatch.values.ids import IdentifierKind, check_identifier
from pybatch.values.parameters import JobInstanceKey
from pybatch.values.records import Created, Existing, JobInstance, JobInstanceSelection


class Instances(Capability):
    def select_or_create(self, key: JobInstanceKey) -> JobInstanceSelection:
        """Return the instance of `key`, creating it when absent.

        Race: job_instance_identity_unique settles creators of one key; the loser's insert does
        nothing and its read-back (a new READ COMMITTED statement) sees the winner's row.
        """
        with self._operation() as (q, conn):
            columns = encode_job_instance_key(key)
            row = q.insert_job_instance_if_absent.one(conn, **columns, now=self._uow.clock.now())
            if row is not None:
                return Created(instance=decode_job_instance(row))
            row = q.find_job_instance_by_key.one(
                conn, job_name=columns["job_name"], instance_key=columns["instance_key"]
            )
            if row is None:
                raise ConcurrentModification()
            return Existing(instance=decode_job_instance(row))

    def find(self, key: JobInstanceKey) -> JobInstance | None:
        """The instance of `key`, or None."""
        with self._operation() as (q, conn):
            row = q.find_job_instance_by_key.one(
                conn, job_name=key.job_name.value, instance_key=key.digest()
            )
            return None if row is None else decode_job_instance(row)

    def get(self, instance_id: int) -> JobInstance | None:
        """The instance with this id, or None."""
        with self._operation() as (q, conn):
            check_identifier(IdentifierKind.JOB_INSTANCE, instance_id)
            row = q.get_job_instance.one(conn, job_instance_id=instance_id)
            return None if row is None else decode_job_instance(row)
