"""Definition identities (SHA-256 of canonical manifest bytes) and directed upgrade edges.

Manifest bytes are checked on every construction (a canonical JSON object, no floats, 64 KiB);
the format (1..3) is checked at registration (`ensure_definition`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, ClassVar, cast

import attrs

from pybatch.errors import (
    DuplicateSourceStep,
    DuplicateTargetStep,
    EmptyStepMapping,
    JsonNotEncodable,
    ManifestInvalid,
    ManifestTooLarge,
    UpgradeSelfEdge,
)
from pybatch.values._canonical import canonical_json, reject_constant, sha256
from pybatch.values._fields import is_, maybe
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
        raise ManifestInvalid(reason="nesting too deep") from None


def _parse_canonical_manifest(data: bytes) -> dict[str, Any]:
    """Parse canonical manifest bytes, refusing anything the manifest reader refuses."""
    if len(data) > MANIFEST_MAX_BYTES:
        raise ManifestTooLarge(max_bytes=MANIFEST_MAX_BYTES)
    try:
        document = json.loads(data, parse_constant=reject_constant)
    except (ValueError, RecursionError):
        raise ManifestInvalid(reason="not valid JSON") from None
    if not isinstance(document, dict):
        raise ManifestInvalid(reason="not a JSON object")
    if _contains_float(document):
        raise ManifestInvalid(reason="contains a floating-point number")
    if canonical_json(document) != data:
        raise ManifestInvalid(reason="not canonically encoded")
    return document


def _format_member(document: Mapping[str, object]) -> int:
    """The `format` member as a u16, or 0 (missing format) when absent or not a u16."""
    value = document.get("format")
    return value if type(value) is int and 0 <= value <= _U16_MAX else 0


@attrs.frozen(repr=False)
class DefinitionIdentity:
    """The restart-relevant identity of a job definition; `digest` is derived, all else compared."""

    job_name: JobName | None = attrs.field(validator=maybe(JobName))
    revision: DefinitionRevision = attrs.field(validator=is_(DefinitionRevision))
    manifest_format: int
    canonical_manifest: bytes
    _digest: bytes = attrs.field(init=False, eq=False, repr=False)

    LEGACY: ClassVar[DefinitionIdentity]

    def __attrs_post_init__(self) -> None:
        if type(self.manifest_format) is not int or not 0 <= self.manifest_format <= _U16_MAX:
            raise ManifestInvalid(reason="manifest format is not a u16")
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
            raise ManifestInvalid(reason="not a JSON object")
        # Before canonicalising: canonical JSON writes 1e16 as an integer, hiding the float.
        if _contains_float(manifest):
            raise ManifestInvalid(reason="contains a floating-point number")
        try:
            data = canonical_json(manifest)
        except JsonNotEncodable as error:
            raise ManifestInvalid(reason=error.reason) from None
        document = _parse_canonical_manifest(data)
        return cls(job_name, revision, _format_member(document), data)

    @classmethod
    def legacy(cls) -> DefinitionIdentity:
        """The legacy definition of launches without a definition."""
        return cls.LEGACY

    @property
    def digest(self) -> bytes:
        """SHA-256 of `canonical_manifest` (the stored `manifest_digest`)."""
        return self._digest

    @property
    def manifest_digest(self) -> bytes:
        """Alias of `digest`, named like the column."""
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


class StepMapping(Mapping[StepName, StepName]):
    """An immutable, hashable, picklable source -> target step mapping, ordered by source name."""

    __slots__ = ("_items",)

    def __init__(self, items: Iterable[tuple[StepName, StepName]] = ()) -> None:
        """Keep `items` (already validated) in source-name byte order."""
        self._items = tuple(sorted(items, key=lambda item: item[0].value.encode("utf-8")))

    def __getitem__(self, source: StepName) -> StepName:
        for present, target in self._items:
            if present == source:
                return target
        raise KeyError(source)

    def __iter__(self) -> Iterator[StepName]:
        return (source for source, _ in self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return hash(self._items)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, StepMapping):
            return self._items == other._items
        return super().__eq__(other)

    def __reduce__(self) -> tuple[type[StepMapping], tuple[tuple[tuple[StepName, StepName], ...]]]:
        return (StepMapping, (self._items,))

    def __repr__(self) -> str:
        pairs = ", ".join(f"{source.value!r}: {target.value!r}" for source, target in self._items)
        return f"StepMapping({{{pairs}}})"


@attrs.frozen(repr=False)
class DefinitionUpgrade:
    """A directed, non-transitive compatibility edge; state bytes carry over unchanged."""

    key: DefinitionUpgradeKey = attrs.field(validator=is_(DefinitionUpgradeKey))
    from_definition: DefinitionIdentity = attrs.field(validator=is_(DefinitionIdentity))
    to_definition: DefinitionIdentity = attrs.field(validator=is_(DefinitionIdentity))
    step_mapping: Mapping[StepName, StepName]

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.step_mapping, Mapping):
            raise TypeError("step_mapping is a Mapping[StepName, StepName]")
        pairs = list(self.step_mapping.items())
        frozen = _validated_mapping(self.from_definition, self.to_definition, pairs)
        object.__setattr__(self, "step_mapping", frozen)

    @classmethod
    def from_pairs(
        cls,
        key: DefinitionUpgradeKey,
        from_definition: DefinitionIdentity,
        to_definition: DefinitionIdentity,
        pairs: Iterable[tuple[StepName, StepName]],
    ) -> DefinitionUpgrade:
        """Build from (source, target) pairs, detecting a source given twice."""
        frozen = _validated_mapping(from_definition, to_definition, list(pairs))
        return cls(key, from_definition, to_definition, frozen)

    def __repr__(self) -> str:
        return (
            f"DefinitionUpgrade(key={self.key.value!r}, "
            f"from_digest_prefix={self.from_definition.digest[:4].hex()!r}, "
            f"to_digest_prefix={self.to_definition.digest[:4].hex()!r}, "
            f"step_count={len(self.step_mapping)})"
        )


def _validated_mapping(
    from_definition: DefinitionIdentity,
    to_definition: DefinitionIdentity,
    pairs: list[tuple[StepName, StepName]],
) -> StepMapping:
    """The frozen mapping, refusing in order: a self-edge, a step named twice, an empty one."""
    if from_definition.digest == to_definition.digest:
        raise UpgradeSelfEdge()
    mapping: dict[StepName, StepName] = {}
    targets: set[StepName] = set()
    for source, target in pairs:
        if not isinstance(source, StepName) or not isinstance(target, StepName):
            raise TypeError("step mapping entries are StepName pairs")
        if source in mapping:
            raise DuplicateSourceStep()
        if target in targets:
            raise DuplicateTargetStep()
        mapping[source] = target
        targets.add(target)
    if not mapping:
        raise EmptyStepMapping()
    return StepMapping(mapping.items())
