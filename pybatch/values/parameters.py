"""Job parameters, instance keys and their durable digests; values are redacted in every repr.

The kind is part of identity: `U64(1)`, `I64(1)` and `Bool(True)` differ, and `bool` is never
accepted where an integer kind is meant (or vice versa).
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable, Iterator, Mapping
from typing import TypeAlias, overload

import attrs

from pybatch import errors as e
from pybatch.values.ids import INT64_MAX, UINT64_MAX, Code, is_
from pybatch.values.names import JobName, ParameterName

PARAMETER_STRING_MAX_BYTES = 65_536  # Byte bound of a string parameter value.

_I64_MIN = -(2**63)

#: Domain separation prefix of `JobParameters.flow_input_digest`, kept byte for byte.
_FLOW_INPUT_PREFIX = b"oxide-batch.flow-parameters.v1\x00"
#: Version byte of `JobInstanceKey.digest` (version 1, durable, never changed).
_INSTANCE_KEY_VERSION = b"\x01"


class ParameterValueKind(Code):
    """The kind of a parameter value; values are the type tags."""

    STRING = "STRING"
    I64 = "I64"
    U64 = "U64"
    BOOL = "BOOL"

    @property
    def json_tag(self) -> str:
        """The lower-case tag stored in identifying-parameter JSON (docs/tables.md 3.8)."""
        return self.value.lower()

    @property
    def display(self) -> str:
        """The kind's display name, used in reprs: String, I64, U64, Bool."""
        return self.value.capitalize()


@attrs.frozen(repr=False)
class ParameterValue:
    """One typed parameter value; build it with `string`, `i64`, `u64` or `boolean`."""

    kind: ParameterValueKind
    value: str | int | bool

    def __attrs_post_init__(self) -> None:
        kind, value = self.kind, self.value
        if kind is ParameterValueKind.STRING:
            if type(value) is not str:
                raise TypeError("a STRING parameter takes a str")
            try:
                size = len(value.encode("utf-8"))
            except UnicodeEncodeError:
                raise e.TextNotUtf8(kind="parameter value") from None
            if size > PARAMETER_STRING_MAX_BYTES:
                raise e.ParameterStringTooLong(max_bytes=PARAMETER_STRING_MAX_BYTES)
            if "\x00" in value:  # PostgreSQL text and jsonb cannot store U+0000
                raise e.TextContainsNul(kind="parameter value")
        elif kind is ParameterValueKind.BOOL:
            if type(value) is not bool:
                raise TypeError("a BOOL parameter takes a bool")
        elif kind is ParameterValueKind.I64 or kind is ParameterValueKind.U64:
            if type(value) is not int:
                raise TypeError(f"a {kind.value} parameter takes an int (bool is not accepted)")
            low, high = (_I64_MIN, INT64_MAX) if kind is ParameterValueKind.I64 else (0, UINT64_MAX)
            if not low <= value <= high:
                raise e.ParameterValueOutOfRange(kind=kind.json_tag)
        else:
            raise TypeError("unknown parameter kind")

    @classmethod
    def string(cls, value: str) -> ParameterValue:
        """A string value of at most 65,536 UTF-8 bytes."""
        return cls(ParameterValueKind.STRING, value)

    @classmethod
    def i64(cls, value: int) -> ParameterValue:
        """A signed 64-bit value, -2^63..2^63-1."""
        return cls(ParameterValueKind.I64, value)

    @classmethod
    def u64(cls, value: int) -> ParameterValue:
        """An unsigned 64-bit value, 0..2^64-1."""
        return cls(ParameterValueKind.U64, value)

    @classmethod
    def boolean(cls, value: bool) -> ParameterValue:  # noqa: FBT001 - the value itself is a bool
        """A boolean value."""
        return cls(ParameterValueKind.BOOL, value)

    def __repr__(self) -> str:
        return f"{self.kind.display}(<redacted>)"

    def __str__(self) -> str:
        return "<redacted>"

    def _digest_value(self, length_format: str) -> bytes:
        """The tag byte and value bytes shared by both digests; strings use `length_format`."""
        tag = bytes([list(ParameterValueKind).index(self.kind) + 1])  # String = 1 ... Bool = 4
        value = self.value
        # The constructor pins the Python type to the kind: str <-> STRING, bool <-> BOOL.
        if isinstance(value, str):
            data = value.encode("utf-8")
            return tag + struct.pack(length_format, len(data)) + data
        if isinstance(value, bool):
            return tag + (b"\x01" if value else b"\x00")
        if self.kind is ParameterValueKind.I64:
            return tag + struct.pack(">q", value)
        return tag + struct.pack(">Q", value)


@attrs.frozen(repr=False)
class JobParameter:
    """A parameter value and whether it is identifying (the default, as in Spring Batch)."""

    value: ParameterValue = attrs.field(validator=is_(ParameterValue))
    identifying: bool = attrs.field(default=True, kw_only=True, validator=is_(bool))

    @property
    def kind(self) -> ParameterValueKind:
        """The kind of the value."""
        return self.value.kind

    def __repr__(self) -> str:
        role = "Identifying" if self.identifying else "NonIdentifying"
        return f"JobParameter(kind={self.kind.display}, role={role}, value=<redacted>)"


#: What `JobParameters.of` accepts per name: plain values (str, int -> I64, bool) or typed ones.
ParameterInput: TypeAlias = "str | int | bool | ParameterValue | JobParameter"


def _check_entries(
    instance: JobParameters,
    attribute: attrs.Attribute[tuple[tuple[ParameterName, JobParameter], ...]],
    value: tuple[tuple[ParameterName, JobParameter], ...],
) -> None:
    previous: bytes | None = None
    for name, parameter in value:
        if not isinstance(name, ParameterName) or not isinstance(parameter, JobParameter):
            raise TypeError("entries are (ParameterName, JobParameter) pairs")
        key = name.value.encode("utf-8")
        if previous is not None and key <= previous:
            raise ValueError("entries must be strictly ordered by name; use from_pairs or of")
        previous = key


@attrs.frozen(repr=False)
class JobParameters:
    """An immutable map of parameters, ordered by name in UTF-8 byte (= code-point) order."""

    entries: tuple[tuple[ParameterName, JobParameter], ...] = attrs.field(
        default=(), validator=_check_entries
    )

    @classmethod
    def from_pairs(cls, pairs: Iterable[tuple[ParameterName | str, JobParameter]]) -> JobParameters:
        """Build from (name, parameter) pairs in any order; a name given twice is refused."""
        seen: dict[bytes, tuple[ParameterName, JobParameter]] = {}
        for raw_name, parameter in pairs:
            name = raw_name if isinstance(raw_name, ParameterName) else ParameterName(raw_name)
            key = name.value.encode("utf-8")
            if key in seen:
                raise e.DuplicateParameter()
            if not isinstance(parameter, JobParameter):
                raise TypeError("parameters are JobParameter values")
            seen[key] = (name, parameter)
        return cls(tuple(seen[key] for key in sorted(seen)))

    # Overloads because Mapping is invariant in its key: dict[str, int] is not a
    # Mapping[ParameterName | str, ...], and a union parameter would break literal inference.
    @overload
    @classmethod
    def of(
        cls, values: Mapping[str, ParameterInput], *, identifying: bool = True
    ) -> JobParameters: ...

    @overload
    @classmethod
    def of(
        cls, values: Mapping[ParameterName, ParameterInput], *, identifying: bool = True
    ) -> JobParameters: ...

    @overload
    @classmethod
    def of(
        cls, values: Mapping[ParameterName | str, ParameterInput], *, identifying: bool = True
    ) -> JobParameters: ...

    @classmethod
    def of(
        cls,
        values: Mapping[str, ParameterInput]
        | Mapping[ParameterName, ParameterInput]
        | Mapping[ParameterName | str, ParameterInput],
        *,
        identifying: bool = True,
    ) -> JobParameters:
        """Build from str -> STRING, int -> I64, bool -> BOOL, or typed values as they are.

        `identifying` applies to all but JobParameters; "a" and ParameterName("a") are duplicates.
        """
        pairs: list[tuple[ParameterName | str, JobParameter]] = []
        for name, raw in values.items():
            if not isinstance(raw, JobParameter):
                raw = JobParameter(_as_value(raw), identifying=identifying)
            pairs.append((name, raw))
        return cls.from_pairs(pairs)

    def __len__(self) -> int:
        return len(self.entries)

    def __iter__(self) -> Iterator[ParameterName]:
        return (name for name, _ in self.entries)

    def __contains__(self, name: object) -> bool:
        return self.get(name) is not None if isinstance(name, ParameterName | str) else False

    def __getitem__(self, name: ParameterName | str) -> JobParameter:
        parameter = self.get(name)
        if parameter is None:
            raise KeyError("parameter not present")  # never echo the (possibly sensitive) name
        return parameter

    def get(self, name: ParameterName | str) -> JobParameter | None:
        """The parameter called `name`, or None."""
        wanted = name.value if isinstance(name, ParameterName) else name
        return next((found for present, found in self.entries if present.value == wanted), None)

    def items(self) -> tuple[tuple[ParameterName, JobParameter], ...]:
        """(name, parameter) pairs in name order."""
        return self.entries

    @property
    def identifying_count(self) -> int:
        """Number of identifying parameters."""
        return sum(1 for _, parameter in self.entries if parameter.identifying)

    def identifying(self) -> JobParameters:
        """Only the identifying parameters."""
        return JobParameters(tuple(entry for entry in self.entries if entry[1].identifying))

    def flow_input_digest(self) -> bytes:
        """SHA-256 over all parameters, identifying or not: flow records store it, never values."""
        digest = hashlib.sha256(_FLOW_INPUT_PREFIX)
        for name, parameter in self.entries:
            data = name.value.encode("utf-8")
            digest.update(struct.pack(">Q", len(data)) + data)
            digest.update(b"\x01" if parameter.identifying else b"\x00")
            digest.update(parameter.value._digest_value(">Q"))
        return digest.digest()

    def __repr__(self) -> str:
        return (
            f"JobParameters(parameter_count={len(self)}, "
            f"identifying_count={self.identifying_count}, ..)"
        )


def _as_value(raw: object) -> ParameterValue:
    if isinstance(raw, ParameterValue):
        return raw
    if type(raw) is bool:
        return ParameterValue.boolean(raw)
    if type(raw) is int:
        return ParameterValue.i64(raw)
    if type(raw) is str:
        return ParameterValue.string(raw)
    raise TypeError("parameter values are str, int, bool, ParameterValue or JobParameter")


def _identifying_only(parameters: JobParameters) -> JobParameters:
    if not isinstance(parameters, JobParameters):
        raise TypeError("expected JobParameters")
    return parameters.identifying()


@attrs.frozen(repr=False)
class JobInstanceKey:
    """The identity of a job instance: the job name and its identifying parameters only."""

    job_name: JobName = attrs.field(validator=is_(JobName))
    parameters: JobParameters = attrs.field(converter=_identifying_only)

    def digest_input(self) -> bytes:
        """The exact bytes `digest` hashes (docs/tables.md 3.7); 84 bytes for the golden vector."""
        job = self.job_name.value.encode("utf-8")
        parts = [_INSTANCE_KEY_VERSION, struct.pack(">I", len(job)), job]
        for name, parameter in self.parameters.entries:
            data = name.value.encode("utf-8")
            parts.extend((struct.pack(">I", len(data)), data, parameter.value._digest_value(">I")))
        return b"".join(parts)

    def digest(self) -> bytes:
        """The 32-byte instance-key digest stored in `job_instance.instance_key` (version 1)."""
        return hashlib.sha256(self.digest_input()).digest()

    def __repr__(self) -> str:
        return (
            f"JobInstanceKey(job_name={self.job_name.value!r}, "
            f"identifying_parameter_count={len(self.parameters)}, ..)"
        )
