"""Identifiers, versions and counters (A8)."""

from __future__ import annotations

import pytest

from pybatch import errors
from pybatch.values.ids import (
    INT64_MAX,
    UINT64_MAX,
    IdentifierKind,
    check_counter,
    check_identifier,
    check_version,
)

DISPLAY_NAMES = [
    "job instance",
    "job execution",
    "step execution",
    "flow decision",
    "flow decision sequence",
    "recovery decision",
    "operator request",
    "retention action",
    "step partition",
    "failure",
    "definition",
]


def test_identifier_kind_display_names() -> None:
    assert [kind.value for kind in IdentifierKind] == DISPLAY_NAMES
    assert str(IdentifierKind.JOB_INSTANCE) == "job instance"


@pytest.mark.parametrize("kind", list(IdentifierKind))
def test_every_identifier_kind_rejects_zero(kind: IdentifierKind) -> None:
    """Scenario A8."""
    with pytest.raises(errors.ZeroIdentifier) as error:
        check_identifier(kind, 0)
    assert error.value.kind == kind.value
    assert str(error.value) == f"{kind.value} identifier must be non-zero"


def test_identifier_ranges() -> None:
    kind = IdentifierKind.JOB_EXECUTION
    assert check_identifier(kind, 1) == 1
    assert check_identifier(kind, INT64_MAX) == INT64_MAX
    with pytest.raises(errors.IdentifierOutOfRange) as out:
        check_identifier(kind, INT64_MAX + 1)
    assert (out.value.kind, out.value.value) == ("job execution", INT64_MAX + 1)
    assert isinstance(out.value, errors.RepositoryError)
    assert check_identifier(kind, UINT64_MAX, storable=False) == UINT64_MAX
    with pytest.raises(errors.NegativeIdentifier):
        check_identifier(kind, -1)
    with pytest.raises(errors.NegativeIdentifier):
        check_identifier(kind, UINT64_MAX + 1, storable=False)


@pytest.mark.parametrize("value", [True, False, 1.0, "1"])
def test_bool_and_non_int_are_never_identifiers(value: object) -> None:
    with pytest.raises(TypeError):
        check_identifier(IdentifierKind.FAILURE, value)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        check_version(value)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        check_counter("read", value)  # type: ignore[arg-type]


def test_versions_and_counters() -> None:
    assert check_version(0) == 0
    assert check_version(INT64_MAX) == INT64_MAX
    with pytest.raises(errors.VersionOutOfRange):
        check_version(-1)
    with pytest.raises(errors.VersionOutOfRange):
        check_version(INT64_MAX + 1)
    assert check_counter("read", INT64_MAX) == INT64_MAX
    with pytest.raises(errors.CounterOutOfRange) as error:
        check_counter("written", -1)
    assert error.value.name == "written"
