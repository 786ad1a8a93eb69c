"""Job parameters, instance keys and digests (A3-A7)."""

from __future__ import annotations

import hashlib
import struct

import pytest

from pybatch import errors
from pybatch.values.names import JobName, ParameterName
from pybatch.values.parameters import (
    JobInstanceKey,
    JobParameter,
    JobParameters,
    ParameterInput,
    ParameterValue,
    ParameterValueKind,
)

GOLDEN_BYTES = bytes.fromhex(
    "01"
    "0000000a"
    "676f6c64656e5f6a6f62"
    "00000006"
    "616374697665"
    "04"
    "01"
    "00000005"
    "636f756e74"
    "02"
    "fffffffffffffffe"
    "00000005"
    "6c696d6974"
    "03"
    "8000000000000000"
    "00000006"
    "726567696f6e"
    "01"
    "00000006"
    "ec849cec9ab8"
)
GOLDEN_DIGEST = "71f12db9e3887de2cf92e93bb63fd4e9e7c536df8fa202212445d18bf2e43604"


def golden_key() -> JobInstanceKey:
    parameters = JobParameters.of(
        {
            "region": "서울",
            "limit": ParameterValue.u64(2**63),
            "count": -2,
            "active": True,
            "run_note": JobParameter(ParameterValue.string("ignored"), identifying=False),
        }
    )
    return JobInstanceKey(JobName("golden_job"), parameters)


def test_the_golden_vector_gives_its_digest_input_bytes_and_digest() -> None:
    """Scenario A7."""
    key = golden_key()
    assert len(GOLDEN_BYTES) == 84
    assert key.digest_input() == GOLDEN_BYTES
    assert key.digest().hex() == GOLDEN_DIGEST
    assert hashlib.sha256(GOLDEN_BYTES).hexdigest() == GOLDEN_DIGEST


def test_a_string_parameter_is_bounded_at_65536_bytes() -> None:
    """Scenario A3."""
    assert ParameterValue.string("x" * 65_536).kind is ParameterValueKind.STRING
    with pytest.raises(errors.ParameterStringTooLong) as error:
        ParameterValue.string("x" * 65_537)
    assert error.value.max_bytes == 65_536
    with pytest.raises(errors.ParameterStringTooLong):
        ParameterValue.string("é" * 32_769)  # 65,538 bytes in 32,769 characters


def test_integer_ranges_and_kind_strictness() -> None:
    assert ParameterValue.i64(-(2**63)).value == -(2**63)
    assert ParameterValue.u64(2**64 - 1).value == 2**64 - 1
    with pytest.raises(errors.ParameterValueOutOfRange) as error:
        ParameterValue.i64(2**63)
    assert error.value.kind == "i64"
    with pytest.raises(errors.ParameterValueOutOfRange):
        ParameterValue.u64(-1)
    with pytest.raises(TypeError):
        ParameterValue.i64(True)
    with pytest.raises(TypeError):
        ParameterValue.boolean(1)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        ParameterValue.string(b"x")  # type: ignore[arg-type]
    assert ParameterValue.boolean(True) != ParameterValue.i64(1)


def test_a_duplicate_parameter_name_is_refused_and_keeps_the_first_value() -> None:
    """Scenario A4."""
    first = JobParameters.of({"a": 1})
    with pytest.raises(errors.DuplicateParameter):
        JobParameters.from_pairs([*first.items(), ("a", JobParameter(ParameterValue.i64(2)))])
    assert first["a"].value == ParameterValue.i64(1)
    with pytest.raises(errors.DuplicateParameter):
        JobParameters.of({"a": 1, ParameterName("a"): 2})
    assert len(first) == 1


def test_non_identifying_parameters_do_not_change_the_key() -> None:
    """Scenario A5."""
    base: dict[str, ParameterInput] = {"region": "eu", "day": 20260101}
    one = JobParameters.of(
        {**base, "run_id": JobParameter(ParameterValue.string("r1"), identifying=False)}
    )
    two = JobParameters.of(
        {**base, "run_id": JobParameter(ParameterValue.string("r2"), identifying=False)}
    )
    key_one, key_two = JobInstanceKey(JobName("j"), one), JobInstanceKey(JobName("j"), two)
    assert key_one == key_two
    assert key_one.digest() == key_two.digest()
    assert len(key_one.parameters) == 2
    assert one.flow_input_digest() != two.flow_input_digest()  # flow input covers all


def test_the_value_kind_is_part_of_the_instance_identity() -> None:
    """Scenario A6."""
    unsigned = JobInstanceKey(JobName("j"), JobParameters.of({"n": ParameterValue.u64(1)}))
    signed = JobInstanceKey(JobName("j"), JobParameters.of({"n": ParameterValue.i64(1)}))
    boolean = JobInstanceKey(JobName("j"), JobParameters.of({"n": True}))
    assert len({unsigned.digest(), signed.digest(), boolean.digest()}) == 3
    assert unsigned != signed


def test_of_maps_python_types() -> None:
    parameters = JobParameters.of({"s": "x", "i": 5, "b": False}, identifying=False)
    assert parameters["s"].kind is ParameterValueKind.STRING
    assert parameters["i"].kind is ParameterValueKind.I64
    assert parameters["b"].kind is ParameterValueKind.BOOL
    assert parameters.identifying_count == 0
    assert not parameters["i"].identifying
    with pytest.raises(TypeError):
        JobParameters.of({"f": 1.5})  # type: ignore[dict-item]


def test_order_is_utf8_byte_order() -> None:
    parameters = JobParameters.of({"é": 1, "z": 2, "A": 3, "a": 4, "\uff41": 5})
    names = [name.value for name in parameters]
    assert names == sorted(names, key=lambda n: n.encode("utf-8"))
    assert names == ["A", "a", "z", "é", "\uff41"]
    with pytest.raises(ValueError, match="strictly ordered"):
        JobParameters(tuple(reversed(parameters.items())))


def test_reprs_are_redacted() -> None:
    key = golden_key()
    parameters = JobParameters.of({"secret": "hunter2", "n": 3})
    assert repr(ParameterValue.string("hunter2")) == "String(<redacted>)"
    assert str(ParameterValue.string("hunter2")) == "<redacted>"
    assert repr(ParameterValue.u64(3)) == "U64(<redacted>)"
    assert repr(parameters["secret"]) == (
        "JobParameter(kind=String, role=Identifying, value=<redacted>)"
    )
    assert repr(parameters) == "JobParameters(parameter_count=2, identifying_count=2, ..)"
    assert repr(key) == "JobInstanceKey(job_name='golden_job', identifying_parameter_count=4, ..)"
    for text in (repr(parameters), repr(key), repr(parameters["secret"])):
        assert "hunter2" not in text and "secret" not in text and "서울" not in text
    with pytest.raises(KeyError) as missing:
        parameters["missing_name"]
    assert "missing_name" not in str(missing.value)


def _field(data: bytes) -> bytes:
    return struct.pack(">Q", len(data)) + data


def test_flow_input_digest_layout() -> None:
    parameters = JobParameters.of(
        {
            "b": True,
            "i": -5,
            "s": "서",
            "u": ParameterValue.u64(7),
            "x": JobParameter(ParameterValue.boolean(False), identifying=False),
        }
    )
    expected = hashlib.sha256(b"oxide-batch.flow-parameters.v1\x00")
    expected.update(_field(b"b") + b"\x01" + b"\x04\x01")
    expected.update(_field(b"i") + b"\x01" + b"\x02" + struct.pack(">q", -5))
    expected.update(_field(b"s") + b"\x01" + b"\x01" + _field("서".encode()))
    expected.update(_field(b"u") + b"\x01" + b"\x03" + struct.pack(">Q", 7))
    expected.update(_field(b"x") + b"\x00" + b"\x04\x00")
    assert parameters.flow_input_digest() == expected.digest()
    assert (
        JobParameters().flow_input_digest()
        == hashlib.sha256(b"oxide-batch.flow-parameters.v1\x00").digest()
    )
