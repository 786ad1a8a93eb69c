"""Definitions and upgrade edges over queries/definitions.sql."""

from __future__ import annotations

from functools import partial

from pybatch import errors as e
from pybatch._clock import Clock
from pybatch._codecs import _primitives as p
from pybatch._codecs._jsonb import to_jsonb
from pybatch._repository._capability import Capability
from pybatch._statements import Connection, Statements
from pybatch.values.definitions import DefinitionIdentity, DefinitionUpgrade
from pybatch.values.flow import check_flow_graph_bounds
from pybatch.values.names import JobName


def ensure_definition(
    q: Statements, conn: Connection, clock: Clock, job_name: JobName, definition: DefinitionIdentity
) -> int:
    """Return the id of `definition` for `job_name`, registering it when new.

    Raises, in this order: DefinitionJobMismatch, UnsupportedManifestVersion (outside 1..3),
    DefinitionDrift (the revision has another digest), ManifestInvalid (a new flow manifest
    beyond the flow-graph bounds).
    """
    if definition.job_name is not None and definition.job_name != job_name:
        raise e.DefinitionJobMismatch(expected=job_name.value, actual=definition.job_name.value)
    if not 1 <= definition.manifest_format <= 3:
        raise e.UnsupportedManifestVersion(format=definition.manifest_format)
    try:
        manifest = definition.manifest()
    except ValueError:
        raise e.Unavailable() from None
    if not isinstance(manifest, dict):
        raise e.Unavailable()
    names = {"job_name": job_name.value, "definition_revision": definition.revision.value}
    # The revision is checked first and on its own, so a drifted revision whose new digest
    # already exists under another revision is still reported as DefinitionDrift.
    if (known := _definition_for_revision(q, conn, names, definition)) is not None:
        return known
    # Only a definition about to be registered: one stored before the bounds were enforced
    # keeps resolving, so its instances can still restart.
    check_flow_graph_bounds(manifest)
    inserted = q.insert_job_definition_if_absent.one(
        conn,
        **names,
        manifest_format=definition.manifest_format,
        manifest_digest=definition.digest,
        manifest=to_jsonb(manifest),
        now=clock.now(),
    )
    if inserted is not None:
        return p.decode_int64(inserted["id"], column="id", minimum=1)
    # A concurrent registration won one of the two unique constraints: read back which.
    if (known := _definition_for_revision(q, conn, names, definition)) is not None:
        return known
    by_digest = q.find_job_definition_by_digest.one(
        conn, job_name=job_name.value, manifest_digest=definition.digest
    )
    if by_digest is None:
        raise e.ConcurrentModification()
    return p.decode_int64(by_digest["id"], column="id", minimum=1)


def _definition_for_revision(
    q: Statements, conn: Connection, names: dict[str, str], definition: DefinitionIdentity
) -> int | None:
    if (row := q.find_job_definition_by_revision.one(conn, **names)) is None:
        return None
    if p.decode_digest(row["manifest_digest"], column="manifest_digest") != definition.digest:
        raise e.DefinitionDrift(job_name=names["job_name"], revision=names["definition_revision"])
    return p.decode_int64(row["id"], column="id", minimum=1)


class Definitions(Capability):
    def register(self, job_name: JobName, definition: DefinitionIdentity) -> int:
        """The id of `definition` for `job_name`, registered when new (`ensure_definition`)."""
        with self._operation() as (q, conn):
            return ensure_definition(q, conn, self._uow.clock, job_name, definition)

    def register_upgrade(self, job_name: JobName, upgrade: DefinitionUpgrade) -> None:
        """Register a direct upgrade edge, idempotent for equal content.

        Raises `ensure_definition`'s errors, then DefinitionUpgradeConflict (other content, or
        the key is taken).
        """
        conflict = partial(e.DefinitionUpgradeConflict, job_name=job_name.value)
        overrides = {"definition_upgrade_target_key_unique": conflict}
        with self._operation(overrides=overrides) as (q, conn):
            clock = self._uow.clock
            from_id = ensure_definition(q, conn, clock, job_name, upgrade.from_definition)
            to_id = ensure_definition(q, conn, clock, job_name, upgrade.to_definition)
            mapping = {old.value: new.value for old, new in upgrade.step_mapping.items()}
            edge = {"from_definition_id": from_id, "to_definition_id": to_id}
            inserted = q.insert_definition_upgrade_if_absent.one(
                conn,
                **edge,
                upgrade_key=upgrade.key.value,
                step_mapping=to_jsonb(mapping),
                now=clock.now(),
            )
            if inserted is not None:
                return
            existing = q.find_definition_upgrade.one(conn, **edge)
            stored = (
                None if existing is None else (existing["upgrade_key"], existing["step_mapping"])
            )
            if stored != (upgrade.key.value, mapping):
                raise conflict()
