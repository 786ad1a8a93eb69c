"""Definition identities and upgrade edges (A17, A20)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest

from pybatch import errors
from pybatch.values.definitions import (
    LEGACY_MANIFEST,
    DefinitionIdentity,
    DefinitionUpgrade,
)
from pybatch.values.names import DefinitionRevision, DefinitionUpgradeKey, JobName, StepName

LEGACY_DIGEST = "1b6a802e60d288646da5fadc6835b3cdf990b322ef1e6b25f2c00000f8a6034e"


def definition(manifest: dict[str, Any], revision: str = "r1") -> DefinitionIdentity:
    return DefinitionIdentity.from_manifest(JobName("load"), DefinitionRevision(revision), manifest)


def test_the_legacy_definition_has_its_fixed_manifest_and_digest() -> None:
    """Scenario A20."""
    legacy = DefinitionIdentity.legacy()
    assert legacy.job_name is None
    assert legacy.revision == DefinitionRevision("__m1_repository_port_v1")
    assert legacy.manifest_format == 1
    assert legacy.canonical_manifest == LEGACY_MANIFEST
    assert legacy.digest.hex() == LEGACY_DIGEST
    assert legacy.manifest() == {
        "format": 1,
        "repository_port": "m1",
        "revision": "__m1_repository_port_v1",
    }
    rebuilt = DefinitionIdentity.from_manifest(
        None, DefinitionRevision("__m1_repository_port_v1"), legacy.manifest()
    )
    assert rebuilt == legacy


def test_from_manifest_canonicalises_and_takes_the_format_member() -> None:
    identity = definition(
        {"steps": ["b", "a"], "format": 2, "job": "load", "ü": {"z": 1, "a": None}}
    )
    assert identity.canonical_manifest == (
        '{"format":2,"job":"load","steps":["b","a"],"ü":{"a":null,"z":1}}'.encode()
    )
    assert identity.manifest_format == 2
    assert definition({"no_format": True}).manifest_format == 0
    assert definition({"format": "1"}).manifest_format == 0
    assert definition({"format": 70_000}).manifest_format == 0


def test_manifest_refusals() -> None:
    cases: list[tuple[dict[Any, Any], str]] = [
        ({"x": 1.0}, "contains a floating-point number"),
        ({"x": [1, {"y": 1e16}]}, "contains a floating-point number"),
        ({"x": float("nan")}, "contains a floating-point number"),
        ({1: "x"}, "object key is not a string"),
        ({"x": {1, 2}}, "value is not JSON"),
    ]
    for manifest, reason in cases:
        with pytest.raises(errors.ManifestInvalid) as error:
            definition(manifest)
        assert error.value.reason == reason
    with pytest.raises(errors.ManifestInvalid):
        DefinitionIdentity.from_manifest(None, DefinitionRevision("r"), ["x"])  # type: ignore[arg-type]


def test_manifest_size_bound() -> None:
    overhead = len(b'{"x":""}')
    assert len(definition({"x": "a" * (65_536 - overhead)}).canonical_manifest) == 65_536
    with pytest.raises(errors.ManifestTooLarge) as error:
        definition({"x": "a" * (65_537 - overhead)})
    assert error.value.max_bytes == 65_536


def test_direct_construction_validates_canonical_bytes() -> None:
    revision = DefinitionRevision("r")
    built = DefinitionIdentity(None, revision, 1, b'{"a":1}')
    assert built.digest == hashlib.sha256(b'{"a":1}').digest()
    assert built.manifest() == {"a": 1}
    for data in [b'{"b":1,"a":2}', b'{"a": 1}', b'{"a":1.5}', b"[1]", b"nope", b'{"a":NaN}']:
        with pytest.raises(errors.ManifestInvalid):
            DefinitionIdentity(None, revision, 1, data)
    with pytest.raises(errors.ManifestTooLarge):
        DefinitionIdentity(None, revision, 1, json.dumps({"x": "a" * 65_536}).encode())


def test_repr_shows_only_a_digest_prefix() -> None:
    text = repr(DefinitionIdentity.legacy())
    assert text == (
        "DefinitionIdentity(job_name=None, revision='__m1_repository_port_v1', "
        "manifest_format=1, digest_prefix='1b6a802e', canonical_manifest='<redacted>')"
    )
    assert '"m1"' not in text and 'repository_port":' not in text


def test_an_upgrade_refuses_self_edges_and_empty_or_duplicate_mappings_and_is_frozen() -> None:
    """Scenario A17."""
    key = DefinitionUpgradeKey("v1-to-v2")
    v1, v2 = definition({"format": 1, "v": 1}), definition({"format": 1, "v": 2}, "r2")
    a, b, c = StepName("a"), StepName("b"), StepName("c")
    with pytest.raises(errors.UpgradeSelfEdge):
        DefinitionUpgrade(key, v1, definition({"format": 1, "v": 1}, "other-revision"), {a: b})
    with pytest.raises(errors.EmptyStepMapping):
        DefinitionUpgrade(key, v1, v2, {})
    with pytest.raises(errors.DuplicateSourceStep):
        DefinitionUpgrade.from_pairs(key, v1, v2, [(a, b), (a, c)])
    with pytest.raises(errors.DuplicateTargetStep):
        DefinitionUpgrade(key, v1, v2, {a: c, b: c})
    with pytest.raises(errors.UpgradeSelfEdge):  # the self-edge is checked first
        DefinitionUpgrade(key, v1, v1, {})
    upgrade = DefinitionUpgrade(key, v1, v2, {b: c, a: a})
    assert list(upgrade.step_mapping.items()) == [(a, a), (b, c)]
    assert upgrade == DefinitionUpgrade.from_pairs(key, v1, v2, [(a, a), (b, c)])
    assert hash(upgrade) == hash(DefinitionUpgrade(key, v1, v2, {a: a, b: c}))
    with pytest.raises(TypeError):
        upgrade.step_mapping[c] = c  # type: ignore[index]
