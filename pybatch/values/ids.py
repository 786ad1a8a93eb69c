"""Identifiers, versions, counters and instants, and the attrs field helpers every value uses.

Ids, versions and counters are plain ints (NewType names which), never bool, range-checked.
Identifiers range over 1..2^64-1; storage is `bigint`, so binding one above 2^63-1 is refused.
Instants are aware: any offset is normalised to UTC, naive ones refused; microseconds kept.
"""

from __future__ import annotations

import datetime as _dt
import enum
from collections.abc import Callable
from typing import Any, NewType

import attrs

from pybatch import errors as e

INT64_MAX = 2**63 - 1  # Storage bound of ids, versions and counters (PostgreSQL bigint).
UINT64_MAX = 2**64 - 1  # Domain bound of identifiers (Rust u64).

JobInstanceId = NewType("JobInstanceId", int)
JobExecutionId = NewType("JobExecutionId", int)
StepExecutionId = NewType("StepExecutionId", int)
OperatorRequestId = NewType("OperatorRequestId", int)
FailureId = NewType("FailureId", int)
DefinitionId = NewType("DefinitionId", int)  # The surrogate key of a `job_definition` row.


class Code(enum.Enum):
    """An enum whose values are durable codes; `str()` is the code itself."""

    def __str__(self) -> str:
        return str(self.value)


class IdentifierKind(Code):
    """Which identifier a check is about; the value is its display name in errors."""

    JOB_INSTANCE = "job instance"
    JOB_EXECUTION = "job execution"
    STEP_EXECUTION = "step execution"
    FLOW_DECISION = "flow decision"
    FLOW_DECISION_SEQUENCE = "flow decision sequence"
    RECOVERY_DECISION = "recovery decision"
    OPERATOR_REQUEST = "operator request"
    RETENTION_ACTION = "retention action"
    STEP_PARTITION = "step partition"
    FAILURE = "failure"
    DEFINITION = "definition"

    @property
    def validator(self) -> Validator:
        """The attrs validator of a storable identifier of this kind (`identifier_validator`)."""
        return identifier_validator(self)

    @property
    def optional(self) -> Validator:
        """`validator`, None allowed."""
        return identifier_validator(self, optional=True)


def _require_int(value: object) -> int:
    """Refuse bool and non-int values: the Python kind is part of identity, never coerced."""
    if type(value) is bool or not isinstance(value, int):
        raise TypeError("expected an int (bool is not accepted)")
    return value


def check_identifier(kind: IdentifierKind, value: int, *, storable: bool = True) -> int:
    """Return `value` if a valid identifier of `kind`; `storable` adds the bigint bound 2^63-1."""
    value = _require_int(value)
    if value == 0:
        raise e.ZeroIdentifier(kind=kind.value)
    if value < 0 or value > UINT64_MAX:
        raise e.NegativeIdentifier(kind=kind.value)
    if storable and value > INT64_MAX:
        raise e.IdentifierOutOfRange(kind=kind.value, value=value)
    return value


def check_version(value: int) -> int:
    """Return `value` if it is a storable optimistic version 0..2^63-1 (else VersionOutOfRange)."""
    value = _require_int(value)
    if not 0 <= value <= INT64_MAX:
        raise e.VersionOutOfRange()
    return value


def check_counter(name: str, value: int) -> int:
    """Return `value` if it is a counter in 0..2^63-1 (else CounterOutOfRange)."""
    if type(value) is int and 0 <= value <= INT64_MAX:
        return value  # the common case, checked on every chunk commit, in one comparison
    _require_int(value)
    raise e.CounterOutOfRange(name=name)


#: The shape of an attrs field validator.
Validator = Callable[[object, "attrs.Attribute[Any]", object], None]


def identifier_validator(
    kind: IdentifierKind, *, optional: bool = False, storable: bool = True
) -> Validator:
    """An attrs validator of an id of `kind` (None allowed if `optional`; bigint if `storable`)."""

    def validate(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
        if value is None and optional:
            return
        if type(value) is not int:
            raise TypeError(f"{attribute.name} is an int")
        check_identifier(kind, value, storable=storable)

    return validate


def is_(cls: type[Any]) -> Validator:
    """An attrs validator: an instance of `cls`."""
    return attrs.validators.instance_of(cls)


def maybe(cls: type[Any]) -> Validator:
    """An attrs validator: None or an instance of `cls`."""
    return attrs.validators.optional(attrs.validators.instance_of(cls))


def version(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    """An optimistic version 0..2^63-1 (an int, never a bool)."""
    if type(value) is not int:
        raise TypeError(f"{attribute.name} is an int")
    check_version(value)


def fixed_bytes(length: int) -> Validator:
    """A byte string of exactly `length` bytes (a digest, a token)."""

    def check(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
        if type(value) is not bytes or len(value) != length:
            raise ValueError(f"{attribute.name} is exactly {length} bytes")

    return check


#: A SHA-256 digest.
digest = fixed_bytes(32)


def aware_utc(value: _dt.datetime) -> _dt.datetime:
    """The instant in UTC: NaiveTimestamp without an offset, TimestampOutOfRange past 1..9999."""
    if not isinstance(value, _dt.datetime):
        raise TypeError("expected a datetime")
    if value.tzinfo is None or value.utcoffset() is None:
        raise e.NaiveTimestamp()
    try:
        return value.astimezone(_dt.UTC)
    except OverflowError:
        raise e.TimestampOutOfRange() from None
