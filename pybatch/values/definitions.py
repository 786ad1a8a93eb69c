"""Definition identities (SHA-256 of canonical manifest bytes) and directed upgrade edges.

Manifest bytes are checked on every construction (a canonical JSON object, no floats, 64 KiB);
the format (1..3) is checked at registration (`ensure_definition`).
"""

from __future__ import annotations

import json
import types
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar, cast

import attrs

from pybatch import errors as e
from pybatch.values._canonical import canonical_json, reject_constant, sha256
from pybatch.values.ids import is_, maybe
from pybatch.values.names import DefinitionRevision, DefinitionUpgradeKey, JobName, StepName

MANIFEST_MAX_BYTES = 65_536  # Byte bound of a canonical manifest.
MANIFEST_FORMAT_ONE_STEP = 1  # Manifest format of a one-step tasklet or chunk definition.
#: Revision of launches without a definition. The older name stays: every stored default
#: definition's fingerprint covers it (`pybatch show` prints "pybatch default definition").
LEGACY_REVISION = "__m1_repository_port_v1"
#: Canonical manifest bytes of the legacy definition (durable).
LEGACY_MANIFEST = b'{"format":1,"repository_port":"m1","revision":"__m1_repository_port_v1"}'

_U16_MAX = 2**16 - 1


def _contains_float(document: object) -> bool:
    """Whether a document holds a float anywhere; too deep to walk counts as invalid."""
    try:
        return any(isinstance(value, float) for value in _walk(document))
    except RecursionError:
        raise e.ManifestInvalid(reason="nesting too deep") from None


def _parse_canonical_manifest(data: bytes) -> dict[str, Any]:
    """Parse canonical manifest bytes, refusing anything the manifest reader refuses."""
    if len(data) > MANIFEST_MAX_BYTES:
        raise e.ManifestTooLarge(max_bytes=MANIFEST_MAX_BYTES)
    try:
        document = json.loads(data, parse_constant=reject_constant)
    except (ValueError, RecursionError):
        raise e.ManifestInvalid(reason="not valid JSON") from None
    if not isinstance(document, dict):
        raise e.ManifestInvalid(reason="not a JSON object")
    if _contains_float(document):
        raise e.ManifestInvalid(reason="contains a floating-point number")
    if canonical_json(document) != data:
        raise e.ManifestInvalid(reason="not canonically encoded")
    return document


@attrs.frozen(repr=False)
class DefinitionIdentity:
    """The restart-relevant identity of a job definition; `digest` is derived, all else compared."""

    job_name: JobName | None = attrs.field(validator=maybe(JobName))
    revision: DefinitionRevision = attrs.field(validator=is_(DefinitionRevision))
    manifest_format: int
    canonical_manifest: bytes
    _digest: bytes = attrs.field(init=False, eq=False, repr=False)

    LEGACY: ClassVar[DefinitionIdentity]  # The definition of launches without one.

    def __attrs_post_init__(self) -> None:
        if type(self.manifest_format) is not int or not 0 <= self.manifest_format <= _U16_MAX:
            raise e.ManifestInvalid(reason="manifest format is not a u16")
        if type(self.canonical_manifest) is not bytes:
            raise TypeError("canonical_manifest is bytes")
        _parse_canonical_manifest(self.canonical_manifest)
        object.__setattr__(self, "_digest", sha256(self.canonical_manifest))

    @classmethod
    def from_manifest(
        cls, job_name: JobName | None, revision: DefinitionRevision, manifest: Mapping[str, Any]
    ) -> DefinitionIdentity:
        """Canonicalise `manifest`; a missing or non-u16 `format` member is format 0 (refused)."""
        if not isinstance(manifest, Mapping):
            raise e.ManifestInvalid(reason="not a JSON object")
        # Before canonicalising: canonical JSON writes 1e16 as an integer, hiding the float.
        if _contains_float(manifest):
            raise e.ManifestInvalid(reason="contains a floating-point number")
        try:
            data = canonical_json(manifest)
        except e.JsonNotEncodable as error:
            raise e.ManifestInvalid(reason=error.reason) from None
        format = _parse_canonical_manifest(data).get("format")
        if type(format) is not int or not 0 <= format <= _U16_MAX:
            format = 0
        return cls(job_name, revision, format, data)

    @property
    def digest(self) -> bytes:
        """SHA-256 of `canonical_manifest` (the stored `manifest_digest`)."""
        return self._digest

    def manifest(self) -> dict[str, Any]:
        """A fresh parsed copy of the manifest (what the `manifest` jsonb column stores)."""
        return cast("dict[str, Any]", json.loads(self.canonical_manifest))

    def __repr__(self) -> str:
        job_name = None if self.job_name is None else self.job_name.value
        return (
            f"DefinitionIdentity(job_name={job_name!r}, revision={self.revision.value!r}, "
            f"manifest_format={self.manifest_format}, digest_prefix={self._digest[:4].hex()!r}, "
            "canonical_manifest='<redacted>')"
        )


def _walk(value: object) -> Iterable[object]:
    """Every nested value of a Mapping/sequence document (tuples included)."""
    if isinstance(value, Mapping):
        value = list(value.values())
    if isinstance(value, list | tuple):
        for child in value:
            yield child
            yield from _walk(child)


DefinitionIdentity.LEGACY = DefinitionIdentity(
    None, DefinitionRevision(LEGACY_REVISION), MANIFEST_FORMAT_ONE_STEP, LEGACY_MANIFEST
)


@attrs.frozen(repr=False)
class DefinitionUpgrade:
    """A directed, non-transitive compatibility edge; state bytes carry over unchanged.

    `step_mapping` (source step -> target step) is kept read-only, in source-name byte order.
    """

    key: DefinitionUpgradeKey = attrs.field(validator=is_(DefinitionUpgradeKey))
    from_definition: DefinitionIdentity = attrs.field(validator=is_(DefinitionIdentity))
    to_definition: DefinitionIdentity = attrs.field(validator=is_(DefinitionIdentity))
    step_mapping: Mapping[StepName, StepName] = attrs.field(hash=False)

    def __attrs_post_init__(self) -> None:
        """Refuse, in order: a self-edge, a target step named twice, an empty mapping."""
        if not isinstance(self.step_mapping, Mapping):
            raise TypeError("step_mapping is a Mapping[StepName, StepName]")
        if self.from_definition.digest == self.to_definition.digest:
            raise e.UpgradeSelfEdge()
        pairs = list(self.step_mapping.items())
        if not all(isinstance(step, StepName) for pair in pairs for step in pair):
            raise TypeError("step mapping entries are StepName pairs")
        if len({target for _, target in pairs}) != len(pairs):
            raise e.DuplicateTargetStep()
        if not pairs:
            raise e.EmptyStepMapping()
        pairs.sort(key=lambda pair: pair[0].value.encode())
        object.__setattr__(self, "step_mapping", types.MappingProxyType(dict(pairs)))

    def __reduce__(self) -> tuple[object, ...]:  # a mappingproxy does not pickle; its dict does
        mapping = dict(self.step_mapping)
        return (DefinitionUpgrade, (self.key, self.from_definition, self.to_definition, mapping))

    def __repr__(self) -> str:
        return (
            f"DefinitionUpgrade(key={self.key.value!r}, "
            f"from_digest_prefix={self.from_definition.digest[:4].hex()!r}, "
            f"to_digest_prefix={self.to_definition.digest[:4].hex()!r}, "
            f"step_count={len(self.step_mapping)})"
        )
