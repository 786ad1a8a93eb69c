"""Value constructors: any text or number is either a valid value or the contract's typed error.

Every constructor below takes arbitrary input of its declared Python type; the only
exceptions that may come out are pybatch errors, and a value that is built is valid by every
rule (so re-validating its own text builds an equal value).
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pybatch.errors import (
    CounterOutOfRange,
    DomainError,
    ParameterValueOutOfRange,
    PyBatchError,
    StateError,
)
from pybatch.values import names
from pybatch.values.counts import ExecutionCounts
from pybatch.values.names import UNICODE_WHITE_SPACE
from pybatch.values.parameters import JobParameter, JobParameters, ParameterValue
from pybatch.values.state import Checkpoint, ExecutionContext, StateLimits
from tests.properties.strategies import anything, json_objects

TEXT_VALUES = [
    names.JobName,
    names.StepName,
    names.ParameterName,
    names.ExitCode,
    names.NodeId,
    names.DefinitionRevision,
    names.DefinitionUpgradeKey,
    names.ClassifierRevision,
    names.StateSchemaId,
    names.ActorRef,
    names.ReasonCode,
    names.OperationId,
]

any_text = st.one_of(
    st.text(),
    st.text(st.characters(codec="utf-8"), min_size=100, max_size=140),
    st.text(st.sampled_from([*sorted(UNICODE_WHITE_SPACE), "a", "\x00", "\x1f", "é"])),
)


@pytest.mark.parametrize("cls", TEXT_VALUES, ids=lambda cls: cls.__name__)
@given(value=any_text)
def test_text_values_are_built_or_refused_with_a_pybatch_error(cls: Any, value: str) -> None:
    try:
        built = cls(value)
    except PyBatchError:
        return
    assert built.value == value
    assert cls(built.value) == built
    data = value.encode("utf-8")  # a built value is always storable text
    assert data and b"\x00" not in data


@given(st.text())
def test_string_parameter_values_are_built_or_refused_typed(value: str) -> None:
    try:
        built = ParameterValue.string(value)
    except DomainError:
        return
    assert built.value == value
    assert "\x00" not in value
    value.encode("utf-8")


@given(st.integers(min_value=-(2**70), max_value=2**70))
def test_integer_parameter_values_hold_exactly_their_range(value: int) -> None:
    for build, low, high in (
        (ParameterValue.i64, -(2**63), 2**63 - 1),
        (ParameterValue.u64, 0, 2**64 - 1),
    ):
        if low <= value <= high:
            assert build(value).value == value
        else:
            with pytest.raises(ParameterValueOutOfRange):
                build(value)


@given(st.integers(min_value=-(2**65), max_value=2**65))
def test_counters_hold_exactly_zero_to_int64_max(value: int) -> None:
    if 0 <= value <= 2**63 - 1:
        assert ExecutionCounts(read=value).read == value
    else:
        with pytest.raises(CounterOutOfRange):
            ExecutionCounts(read=value)


@pytest.mark.parametrize("cls", [Checkpoint, ExecutionContext])
@given(payload=json_objects)
def test_state_payloads_round_trip_through_their_encoding(cls: Any, payload: Any) -> None:
    schema = names.StateSchemaId("app.state.v1")
    try:
        state = cls(schema, 1, payload)
    except StateError:
        return
    assert cls(schema, 1, state.payload) == state


@pytest.mark.parametrize("cls", [Checkpoint, ExecutionContext])
@given(payload=anything)
def test_any_state_payload_is_built_or_refused_with_a_state_error(cls: Any, payload: Any) -> None:
    try:
        cls(names.StateSchemaId("app.state.v1"), 1, payload, limits=StateLimits())
    except StateError:
        pass


@given(
    st.dictionaries(
        st.text(min_size=1, max_size=10),
        st.one_of(st.text(max_size=20), st.integers(), st.booleans()),
        max_size=6,
    )
)
def test_parameter_maps_are_built_or_refused_typed(raw: dict[str, Any]) -> None:
    try:
        pairs = [(name, JobParameter(_value(value))) for name, value in raw.items()]
        parameters = JobParameters.from_pairs(pairs)
    except PyBatchError:
        return
    assert len(parameters) == len(raw)


def _value(value: Any) -> ParameterValue:
    if isinstance(value, bool):
        return ParameterValue.boolean(value)
    if isinstance(value, int):
        return ParameterValue.i64(value)
    return ParameterValue.string(value)
